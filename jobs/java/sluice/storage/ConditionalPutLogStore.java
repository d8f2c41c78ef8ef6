package sluice.storage;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import io.delta.storage.HadoopFileSystemLogStore;

/**
 * Delta's log on S3 with every new version a put-if-absent ({@link ConditionalPut}), so two
 * drivers writing one table cannot both commit version N: the second gets
 * {@link java.nio.file.FileAlreadyExistsException}, and Delta's optimistic concurrency takes over
 * (it retries on top of the winner, or raises {@code ConcurrentTransactionException} when the
 * winner wrote the same txnAppId).
 *
 * <p>Delta 4.1's default for {@code s3a://}, {@code S3SingleDriverLogStore}, checks that N.json
 * is absent and then PUTs it, under a lock that holds inside one JVM only: two drivers both
 * "succeed" and the later PUT silently replaces the other's commit. Delta has no LogStore built on
 * S3's conditional writes (delta-io/delta#3596), so this is Sluice's; it is set with
 * {@code spark.delta.logStore.s3a.impl} wherever Sluice writes Delta on S3 (sluice/storage).
 *
 * <p>Overwrites (Delta's {@code _last_checkpoint}) stay plain PUTs: they are meant to replace.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {

    public ConditionalPutLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) {
            try (FSDataOutputStream out = fs.create(path, true)) {
                while (actions.hasNext()) {
                    out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
                }
            }
            return;
        }
        ConditionalPut.Pending put = ConditionalPut.open(fs, path);
        if (put == null) {
            throw new java.nio.file.FileAlreadyExistsException(path.toString());
        }
        try {
            while (actions.hasNext()) {
                put.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
            }
        } catch (IOException | RuntimeException e) {
            put.abort(); // a partial version must never appear
            throw e;
        }
        if (!put.publish()) {
            throw new java.nio.file.FileAlreadyExistsException(path.toString());
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false; // an S3 object appears whole when its upload completes, or not at all
    }
}
