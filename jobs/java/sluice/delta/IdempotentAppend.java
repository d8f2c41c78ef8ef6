package sluice.delta;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.DeltaOperations;
import org.apache.spark.sql.delta.DeltaOptions;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.OptimisticTransaction$;
import org.apache.spark.sql.delta.VersionChecksum;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.SetTransaction;
import org.apache.spark.sql.delta.commands.DMLUtils;
import org.apache.spark.sql.delta.commands.WriteIntoDelta;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Delta's idempotent append ({@code txnAppId}/{@code txnVersion}), with the writer's last batch
 * read from the snapshot's checksum file instead of a rebuild of the table's state.
 *
 * <p>{@code df.write.format("delta").option("txnAppId", ...).option("txnVersion", ...)} runs
 * {@code WriteIntoDelta}, whose first step asks the transaction for the app id's last version:
 * {@code snapshot.transactions}, which Delta 4.1 computes by replaying the whole log (three of
 * the seven Spark jobs of a 10-record batch). Delta also keeps every app id's last version in
 * the version's {@code .crc} file ({@code spark.databricks.delta.setTransactionsInCrc.writeOnCommit},
 * on by default, for up to 100 app ids), which a writer's snapshot after its own commit holds
 * in memory. This class reads it there, and runs the rest of {@code WriteIntoDelta.run} as it
 * is: the same files, the same actions (the {@code SetTransaction} among them), the same commit.
 *
 * <p>The storage still decides between two writers of one batch: the app id is registered as
 * read by the transaction, as {@code txnVersion} does, so a commit of the same app id that lands
 * after this snapshot fails this one's commit with {@code ConcurrentTransactionException}, and
 * the log's put-if-absent decides which commit takes a version. When the checksum is missing or
 * holds no set transactions (a crash before it was written, a table another writer made), the
 * answer is Delta's own.
 *
 * <p>Delta's internals used here ({@code WriteIntoDelta}'s constructor and
 * {@code writeAndReturnCommitData}, {@code readTxn}, {@code setActive}) are not a public API:
 * {@code tests/integration/test_sinks.py} fails when they change, and
 * {@code jobs/tables/sinks.py} falls back to the public writer when this class is not built.
 */
public final class IdempotentAppend {
  private IdempotentAppend() {}

  /**
   * Append {@code data} to the Delta table at {@code path} as version {@code version} of
   * {@code appId}, unless the table has that version of it already.
   *
   * @return true when it was written, false when it was skipped
   */
  public static boolean append(
      Dataset<Row> data,
      String path,
      List<String> partitionBy,
      Map<String, String> options,
      String appId,
      long version) {
    for (String key : options.keySet()) {
      if (key.startsWith("delta.")) { // table properties: DataFrameWriter validates them, this does not
        throw new IllegalArgumentException("table property " + key + " is not passed on by IdempotentAppend");
      }
    }
    // The batch's session (foreachBatch's clone of the stream's), active throughout, as
    // DataFrameWriter.save makes it: Delta's log and transaction read SparkSession.active.
    SparkSession spark = data.sparkSession();
    Option<SparkSession> before = SparkSession.getActiveSession();
    SparkSession.setActiveSession(spark);
    try {
      return appendIn(spark, data, path, partitionBy, options, appId, version);
    } finally {
      if (before.isDefined()) {
        SparkSession.setActiveSession(before.get());
      } else {
        SparkSession.clearActiveSession();
      }
    }
  }

  private static boolean appendIn(
      SparkSession spark,
      Dataset<Row> data,
      String path,
      List<String> partitionBy,
      Map<String, String> options,
      String appId,
      long version) {
    DeltaLog log = DeltaLog.forTable(spark, new Path(path));
    OptimisticTransaction txn = log.startTransaction(Option.empty(), Option.empty());
    OptimisticTransaction$.MODULE$.setActive(txn);
    try {
      if (lastVersion(txn, appId) >= version) {
        return false;
      }
      Map<String, String> all = new java.util.HashMap<>(options);
      all.put("txnAppId", appId);
      all.put("txnVersion", Long.toString(version));
      DeltaOptions deltaOptions =
          new DeltaOptions(scalaMap(all), spark.sessionState().conf());
      scala.collection.immutable.Seq<String> columns = seq(partitionBy);
      WriteIntoDelta write =
          new WriteIntoDelta(
              log,
              SaveMode.Append,
              deltaOptions,
              columns,
              scalaMap(Map.of()),
              data,
              Option.empty(),
              Option.empty());
      DMLUtils.TaggedCommitData<Action> commit =
          write.writeAndReturnCommitData(txn, spark, Option.empty(), false);
      DeltaOperations.Write operation =
          new DeltaOperations.Write(
              SaveMode.Append,
              Option.apply(columns),
              Option.empty(),
              deltaOptions.userMetadata(),
              Option.empty(),
              Option.empty(),
              deltaOptions.canMergeSchema() ? Option.apply((Object) Boolean.TRUE) : Option.empty());
      txn.commitIfNeeded(commit.actions(), operation, commit.stringTags());
      return true;
    } finally {
      OptimisticTransaction$.MODULE$.clearActive();
    }
  }

  /**
   * The last version of {@code appId} the transaction's snapshot holds, registered as read (a
   * concurrent commit of it then fails this transaction): from the checksum when it has the set
   * transactions, else from Delta's state; -1 when there is none.
   */
  static long lastVersion(OptimisticTransaction txn, String appId) {
    Option<VersionChecksum> checksum = txn.snapshot().checksumOpt();
    if (checksum.isEmpty() || checksum.get().setTransactions().isEmpty()) {
      return txn.txnVersion(appId);
    }
    txn.readTxn().$plus$eq(appId);
    long last = -1L;
    for (SetTransaction t : CollectionConverters.asJava(checksum.get().setTransactions().get())) {
      if (t.appId().equals(appId)) {
        last = Math.max(last, t.version());
      }
    }
    return last;
  }

  private static <T> scala.collection.immutable.Seq<T> seq(List<T> items) {
    return CollectionConverters.asScala(new ArrayList<>(items)).toList();
  }

  private static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> map) {
    return scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(map));
  }
}
