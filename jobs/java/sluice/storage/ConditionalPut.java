package sluice.storage;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.UUID;

import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A put-if-absent on an object store: the object is created only if no object has the name,
 * and the store itself decides (S3's {@code If-None-Match: *}, through S3A's conditional create
 * in hadoop-aws 3.4.2, HADOOP-19256). Two writers of one name can both pass any check made
 * before, pause for as long as they like, and still only one of them wins.
 *
 * <p>Every commit Sluice makes on S3 goes through here: Delta's log ({@link ConditionalPutLogStore}),
 * Spark's streaming checkpoint logs ({@link ConditionalCheckpointFileManager}) and the Parquet
 * log (the Python side's {@code jobs/tables/hadoopfs.py}).
 *
 * <p>A refusal (HTTP 412) alone does not prove another writer won: S3A and the AWS SDK retry a
 * request whose answer was lost, and the retry of a PUT that succeeded is refused by its own
 * object. So each write carries an id of its own in the object's user metadata, and an outcome
 * that is not a plain success is settled by reading the id back: ours, we won; another's, we
 * lost; nothing readable, the outcome is unknown and says so (a Delta commit then fails, and its
 * batch is written again under the same txnAppId and txnVersion, which Delta skips if the first
 * write did land).
 *
 * <p>S3A's own existence check before the upload is skipped ({@code fs.s3a.create.performance}):
 * it is a check before an act, and the server's refusal is the one that counts.
 */
public final class ConditionalPut {

    /** Hadoop's builder option for a create that the store refuses when the object exists. */
    public static final String CONDITIONAL = "fs.option.create.conditional.overwrite";
    /** S3A's builder option that skips its existence and parent probes before an upload. */
    static final String PERFORMANCE = "fs.s3a.create.performance";
    /** The user metadata key naming the write that created an object. */
    static final String WRITE_ID = "sluice-write-id";
    /** S3A's builder prefix for an object header, and its extended-attribute prefix for reading one. */
    static final String HEADER_OPTION = "fs.s3a.create.header." + WRITE_ID;
    static final String HEADER_XATTR = "header." + WRITE_ID;

    private ConditionalPut() {}

    /** Can the store at {@code path} refuse a create when the object exists? */
    public static boolean supported(FileSystem fs, Path path) {
        try {
            return fs.hasPathCapability(path, CONDITIONAL) && fs.hasPathCapability(path, "fs.s3a.create.header");
        } catch (IOException e) {
            return false;
        }
    }

    /** Create {@code path} holding {@code data} unless it exists: true if this call created it. */
    public static boolean create(FileSystem fs, Path path, byte[] data) throws IOException {
        Pending put = open(fs, path);
        if (put == null) {
            return false;
        }
        try {
            put.write(data);
        } catch (IOException | RuntimeException e) {
            put.abort();
            throw e;
        }
        return put.publish();
    }

    /** Create {@code path} holding {@code text} (UTF-8) unless it exists: true if this call created it. */
    public static boolean create(FileSystem fs, Path path, String text) throws IOException {
        return create(fs, path, text.getBytes(StandardCharsets.UTF_8));
    }

    /**
     * Begin a put-if-absent: the object appears when {@link Pending#publish()} succeeds, and never
     * if the write is {@link Pending#abort() aborted}. Null when the store says at once that the
     * object exists.
     */
    public static Pending open(FileSystem fs, Path path) throws IOException {
        if (!supported(fs, path)) {
            throw new UnsupportedOperationException(
                path + ": this store cannot create a file only if it is absent (S3's If-None-Match: *, "
                    + "S3A's " + CONDITIONAL + "), so two writers could both commit; see docs/cluster.md");
        }
        String id = UUID.randomUUID().toString();
        try {
            FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
                .overwrite(false)
                .must(CONDITIONAL, true)
                .opt(PERFORMANCE, true)
                .must(HEADER_OPTION, id)
                .build();
            return new Pending(fs, path, id, out);
        } catch (FileAlreadyExistsException e) {
            return null;
        }
    }

    /** One put-if-absent under way. */
    public static final class Pending {
        private final FileSystem fs;
        private final Path path;
        private final String id;
        private final FSDataOutputStream out;
        private boolean done;

        Pending(FileSystem fs, Path path, String id, FSDataOutputStream out) {
            this.fs = fs;
            this.path = path;
            this.id = id;
            this.out = out;
        }

        public OutputStream stream() {
            return out;
        }

        public void write(byte[] data) throws IOException {
            out.write(data);
        }

        /** Upload: true if this write created the object, false if another writer's is there. */
        public boolean publish() throws IOException {
            if (done) {
                throw new IllegalStateException(path + ": published or aborted already");
            }
            done = true;
            try {
                out.close();
                return true;
            } catch (InterruptedIOException e) {
                throw e;
            } catch (IOException e) {
                return settle(e);
            }
        }

        /** Give the write up: nothing appears (best effort: the upload may not have begun). */
        public void abort() {
            if (done) {
                return;
            }
            done = true;
            try {
                if (out instanceof Abortable) {
                    ((Abortable) out).abort();
                    return;
                }
            } catch (RuntimeException e) {
                // not abortable after all: closing would publish, so leave the stream unclosed
            }
        }

        /** The upload did not plainly succeed: whose object is there, if any? */
        private boolean settle(IOException failure) throws IOException {
            FileStatus status;
            try {
                status = fs.getFileStatus(path);
            } catch (FileNotFoundException e) {
                if (refused(failure)) {
                    return false; // refused, then removed (an expired commit): it was another writer's
                }
                throw new IOException(path + ": the upload failed and the object is not there: " + failure, failure);
            } catch (IOException e) {
                throw unknown(failure, e);
            }
            if (!status.isFile()) {
                throw new IOException(path + ": the upload failed and a folder has its name: " + failure, failure);
            }
            String found;
            try {
                byte[] value = fs.getXAttr(path, HEADER_XATTR);
                found = value == null ? null : new String(value, StandardCharsets.UTF_8);
            } catch (IOException e) {
                throw unknown(failure, e);
            }
            if (id.equals(found)) {
                return true; // our own upload landed; what the store refused was a retry of it
            }
            if (refused(failure)) {
                return false;
            }
            throw new IOException(path + ": the upload failed and another writer's object is there: " + failure, failure);
        }

        private IOException unknown(IOException failure, IOException reading) {
            return new IOException(
                path + ": the outcome of a conditional upload is unknown: it failed (" + failure
                    + ") and the object could not be read back (" + reading + ")", failure);
        }
    }

    /** Did the store refuse the upload because the object exists (HTTP 412)? */
    static boolean refused(Throwable e) {
        for (Throwable c = e; c != null; c = c.getCause()) {
            String name = c.getClass().getName();
            if (c instanceof FileAlreadyExistsException
                || c instanceof java.nio.file.FileAlreadyExistsException
                || name.equals("org.apache.hadoop.fs.s3a.RemoteFileChangedException")) {
                return true;
            }
            String message = String.valueOf(c.getMessage());
            if (message.contains("Status Code: 412") || message.contains("PreconditionFailed")) {
                return true;
            }
        }
        return false;
    }
}
