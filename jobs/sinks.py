"""Table writers for one micro-batch, each exactly once across restarts.

Both formats are written from ``foreachBatch``, so one batch can feed the output table
and its quarantine table, and a batch that runs again after a crash (same id, same
offsets, as Spark's checkpoint guarantees) must not be written twice.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from jobs import hadoopfs


class BatchSink(Protocol):
    path: str
    guarantee: str

    def write(self, df: DataFrame, batch_id: int) -> None: ...

    def has_commits(self) -> bool: ...


class DeltaSink:
    """Delta's idempotent writes: the commit records (txnAppId, txnVersion=batch id) and
    Delta skips a write whose version it has already committed for that app id.
    See https://docs.delta.io/latest/delta-streaming.html#idempotent-table-writes-in-foreachbatch
    """

    guarantee = "exactly once (Delta transaction per batch, replayed batches skipped by txnVersion)"

    def __init__(self, spark: SparkSession, path: str, partition_by: str, app_id: str) -> None:
        self.spark, self.path, self.partition_by, self.app_id = spark, path, partition_by, app_id

    def write(self, df: DataFrame, batch_id: int) -> None:
        (
            df.write.format("delta")
            .mode("append")
            .partitionBy(self.partition_by)
            .option("txnAppId", self.app_id)
            .option("txnVersion", str(batch_id))
            .save(self.path)
        )

    def has_commits(self) -> bool:
        return table_exists(self.spark, "delta", self.path)


class ParquetSink:
    """Spark's own streaming file sink, driven per batch: files are listed under the batch
    id in ``_spark_metadata`` only after they are written, a batch id already listed is
    skipped, and readers (``spark.read.parquet``) see only listed files.
    """

    guarantee = "exactly once (_spark_metadata log per batch, replayed batches skipped by batch id)"

    def __init__(self, spark: SparkSession, path: str, partition_by: str) -> None:
        self.spark, self.path = spark, path
        jvm = spark._jvm
        assert jvm is not None
        # FileStreamSink is what writeStream.format("parquet") uses; calling it from
        # foreachBatch keeps its commit protocol while writing two tables per batch.
        self._sink = jvm.org.apache.spark.sql.execution.streaming.sinks.FileStreamSink(
            spark._jsparkSession,
            path,
            jvm.org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat(),
            jvm.org.apache.spark.api.python.PythonUtils.toSeq([partition_by]),
            jvm.org.apache.spark.api.python.PythonUtils.toScalaMap({}),
        )

    def write(self, df: DataFrame, batch_id: int) -> None:
        self._sink.addBatch(batch_id, df._jdf)

    def has_commits(self) -> bool:
        return table_exists(self.spark, "parquet", self.path)


def table_exists(spark: SparkSession, fmt: str, path: str) -> bool:
    """Has a pipeline committed to the table at ``path`` (its Delta or Parquet log has entries)?"""
    return hadoopfs.has_children(spark, f"{path}/{'_delta_log' if fmt == 'delta' else '_spark_metadata'}")


def read_table(spark: SparkSession, fmt: str, path: str) -> DataFrame:
    """Read a table a pipeline wrote. For Parquet, Spark reads the ``_spark_metadata``
    log when it is there, so files of an unfinished batch are never seen."""
    if fmt == "delta":
        return spark.read.format("delta").load(path)
    return spark.read.parquet(path)
