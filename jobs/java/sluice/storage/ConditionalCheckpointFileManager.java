package sluice.storage;

import java.io.IOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;

import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's streaming checkpoint logs (offsets, commits, metadata) with each new entry a
 * put-if-absent on S3 ({@link ConditionalPut}); everything else is Spark's own manager.
 *
 * <p>Spark writes a log entry with {@code createAtomic(path, overwriteIfPossible = false)}, which
 * on S3A is a temporary object copied to its name after a check that the name is free: two
 * drivers of one checkpoint (one paused past its lease, one that took over) can both pass the
 * check. Here the entry is uploaded to its name with {@code If-None-Match: *}, so the second
 * gets {@link FileAlreadyExistsException}, which Spark reports as two queries on one checkpoint
 * and stops. Set with {@code spark.sql.streaming.checkpointFileManagerClass} wherever Sluice
 * runs on S3 (sluice/storage); on other file systems this is Spark's default manager.
 *
 * <p>Spark's state stores ask for overwrites, which stay Spark's.
 */
public class ConditionalCheckpointFileManager implements CheckpointFileManager {

    private final CheckpointFileManager spark;
    private final FileSystem fs;
    private final boolean conditional;

    public ConditionalCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
        CheckpointFileManager chosen;
        try {
            chosen = new FileContextBasedCheckpointFileManager(path, hadoopConf);
        } catch (Exception e) { // Scala declares nothing: a file system without FileContext raises this
            if (!(e instanceof UnsupportedFileSystemException)) {
                if (e instanceof RuntimeException) {
                    throw (RuntimeException) e;
                }
                throw new IOException(e);
            }
            chosen = new FileSystemBasedCheckpointFileManager(path, hadoopConf);
        }
        this.spark = chosen;
        this.fs = path.getFileSystem(hadoopConf);
        this.conditional = "s3a".equals(fs.getScheme()) && ConditionalPut.supported(fs, path);
    }

    @Override
    public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
        if (!conditional || overwriteIfPossible) {
            return spark.createAtomic(path, overwriteIfPossible);
        }
        try {
            ConditionalPut.Pending put = ConditionalPut.open(fs, path);
            if (put == null) {
                throw new FileAlreadyExistsException(path + " exists: another query wrote this entry");
            }
            return new ConditionalStream(path, put);
        } catch (IOException e) {
            throw new RuntimeException(e.getMessage(), e);
        }
    }

    /** An entry that appears under its name on close, unless another writer's is there first. */
    static final class ConditionalStream extends CancellableFSDataOutputStream {
        private final Path path;
        private final ConditionalPut.Pending put;
        private boolean terminated;

        ConditionalStream(Path path, ConditionalPut.Pending put) {
            super(put.stream());
            this.path = path;
            this.put = put;
        }

        @Override
        public synchronized void close() throws IOException {
            if (terminated) {
                return;
            }
            terminated = true;
            if (!put.publish()) {
                throw new FileAlreadyExistsException(path + " exists: another query wrote this entry first");
            }
        }

        @Override
        public synchronized void cancel() {
            if (!terminated) {
                terminated = true;
                put.abort();
            }
        }
    }

    @Override
    public FSDataInputStream open(Path path) {
        return spark.open(path);
    }

    @Override
    public FileStatus[] list(Path path, PathFilter filter) {
        return spark.list(path, filter);
    }

    @Override
    public void mkdirs(Path path) {
        spark.mkdirs(path);
    }

    @Override
    public boolean exists(Path path) {
        return spark.exists(path);
    }

    @Override
    public void delete(Path path) {
        spark.delete(path);
    }

    @Override
    public boolean isLocal() {
        return spark.isLocal();
    }

    @Override
    public Path createCheckpointDirectory() {
        return spark.createCheckpointDirectory();
    }

    @Override
    public void close() {
        spark.close();
    }
}
