"""What every ``foreachBatch`` writer of a stream shares, whichever mode runs it (micro-batch
ingest, derived pipelines): the batch's frame (:class:`BatchFrame`), the writer's name in the
tables' logs, the guard against a new checkpoint over a table with data, declining a batch
after a stop request, and the fault point between writing a batch and Spark committing it."""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from jobs.tables import hadoopfs
from jobs.tables.readers import table_reader
from jobs.tables.sinks import TableSink, table_sink
from sluice import faults
from sluice.records import checkpoint
from sluice.records.audit import BatchAudit
from sluice.records.audit import file_name as audit_file
from sluice.spec import Pipeline
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.batches")


class CheckpointMismatch(RuntimeError):
    """The table has data but the checkpoint is new: running would repeat or skip data."""


class StopRequested(RuntimeError):
    """Raised by a batch that starts after a stop was requested, before it writes anything."""


#: In the query's error when a batch declined to start because of a stop request.
STOP_MARKER = "sluice: stop requested"
# Spark (and py4j, on the Python side) log the end of a query whose batch raised as an
# error, with a trace; for a stop that is noise, so the job turns those loggers off just
# before it declines the batch, and back on (restore_query_logging) when a query follows,
# as after a replay.
_QUERY_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"
_PY4J_LOGGER = "py4j.clientserver"
_quieted: list[Any] = []  # the levels before: log4j's and Python's


class BatchFrame(ABC):
    """A ``foreachBatch`` function: one batch written to the pipeline's two tables, in the
    frame every mode shares. Once :meth:`write` is done, the batch's audit is written beside
    the checkpoint and :meth:`written` reports it; then Spark commits the batch.

    Once ``stop`` is set, the next batch declines to start (:class:`StopRequested`) before
    it writes anything. Spark cannot be asked to skip a batch it has planned, and with a
    backlog the next batch starts as soon as the last one commits, so this is how a stop
    takes effect right after the batch in progress: the declined batch is planned in the
    checkpoint but not committed, and is read again at the next start.

    ``fence`` is the driver's lease: a batch begins only while it holds, and each table's
    commit checks it again."""

    def __init__(
        self, spark: SparkSession, pipeline: Pipeline, stop: threading.Event | None, fence: Fence = UNFENCED
    ) -> None:
        self.spark, self.pipeline, self.stop, self.fence = spark, pipeline, stop, fence
        self._sinks: tuple[TableSink, TableSink] | None = None

    def sinks(self) -> tuple[TableSink, TableSink]:
        """The output table and the quarantine, looked up at the first batch that writes."""
        if self._sinks is None:
            self._sinks = table_sinks(self.spark, self.pipeline, self.fence)
        return self._sinks

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        decline_if_stopping(self.spark, self.pipeline, self.stop, batch_id, self.fence)
        started = time.monotonic()
        audit = self.write(batch, batch_id)
        audit.seconds = round(time.monotonic() - started, 3)
        audit.written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        hadoopfs.write_text(self.spark, f"{self.pipeline.audit_path}/{audit_file(batch_id)}", audit.to_json())
        self.written(audit)
        # The crash that tests exactly-once hardest: the batch runs again on restart and must be
        # found written already (tests/e2e/test_exactly_once.py).
        faults.point("batch.written", batch_id)

    @abstractmethod
    def write(self, batch: DataFrame, batch_id: int) -> BatchAudit:
        """Write the batch to the tables, each exactly once; its audit (counts, not times)."""

    @abstractmethod
    def written(self, audit: BatchAudit) -> None:
        """Report a batch whose tables and audit are written (its log lines, its counts)."""


def decline_if_stopping(
    spark: SparkSession, pipeline: Pipeline, stop: threading.Event | None, batch_id: int, fence: Fence = UNFENCED
) -> None:
    """Raise :class:`StopRequested` when a stop was asked for, before the batch writes anything;
    :class:`~sluice.state.lease.LeaseLost` if this driver may no longer write at all. While the
    run-state store does not answer for longer than the lease, the batch waits here."""
    fence.check(before_batch=True)
    if stop is None or not stop.is_set():
        return
    log.info(
        "%s: stop requested; batch %d is not started (it is read again at the next start)", pipeline.name, batch_id
    )
    jvm = spark._jvm
    assert jvm is not None
    if not _quieted:
        _quieted[:] = [
            jvm.org.apache.logging.log4j.LogManager.getLogger(_QUERY_LOGGER).getLevel(),
            logging.getLogger(_PY4J_LOGGER).level,
        ]
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        _QUERY_LOGGER, jvm.org.apache.logging.log4j.Level.OFF
    )
    logging.getLogger(_PY4J_LOGGER).setLevel(logging.CRITICAL)  # it logs the raise with a trace
    raise StopRequested(f"{STOP_MARKER} before batch {batch_id}")


def restore_query_logging(spark: SparkSession) -> None:
    """Undo what :func:`decline_if_stopping` turned off, for the query that follows."""
    if not _quieted:
        return
    jvm = spark._jvm
    assert jvm is not None
    log4j_level, py4j_level = _quieted
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(_QUERY_LOGGER, log4j_level)
    logging.getLogger(_PY4J_LOGGER).setLevel(py4j_level)
    _quieted.clear()


def last_committed(spark: SparkSession, checkpoint_path: str) -> int | None:
    """The newest batch in a checkpoint's commit log (any filesystem), or None."""
    return checkpoint.last_batch(hadoopfs.list_names(spark, f"{checkpoint_path.rstrip('/')}/commits"))


def query_id(spark: SparkSession, pipeline: Pipeline) -> str:
    """The streaming query's id, which Spark keeps in the checkpoint for its lifetime.

    It names this writer in both tables' logs, and nothing else does: a renamed pipeline on
    the same checkpoint is the same writer (its replayed batch is skipped), and a new
    checkpoint, whose batch ids start at 0 again, is never mistaken for the old one.
    """
    meta = json.loads(hadoopfs.read_text(spark, f"{pipeline.checkpoint_path}/metadata"))
    return str(meta["id"])


def clear_unfinished_writes(spark: SparkSession, pipeline: Pipeline) -> None:
    """Delete the temporary files of offset and commit log entries that a killed driver was
    writing (``.0.<uuid>.tmp``). Spark writes an entry to such a file and renames it, so one
    left behind was never part of the log; but Spark 4.1 counts it, and refuses to start a
    query whose first batch it interrupted (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY:
    "offsets should be empty on batch 0"). Called before the query starts, under the
    checkpoint's claim, so no other writer is mid-write."""
    for log_dir in ("offsets", "commits"):
        folder = f"{pipeline.checkpoint_path.rstrip('/')}/{log_dir}"
        for name in hadoopfs.list_names(spark, folder):
            if name.startswith(".") and name.endswith(".tmp"):
                log.warning(
                    "%s: removing %s/%s, a log entry a stopped driver did not finish", pipeline.name, log_dir, name
                )
                hadoopfs.delete(spark, f"{folder}/{name}")


def check_checkpoint(spark: SparkSession, pipeline: Pipeline) -> None:
    """Refuse a new checkpoint for a table that already has data.

    A fresh checkpoint is a new writer that starts again at ``starting_offsets``: it would
    append everything the table already holds a second time.
    """
    if hadoopfs.has_children(spark, f"{pipeline.checkpoint_path}/offsets"):
        return
    p, table = pipeline, table_reader(pipeline.spec.sink.format)
    for path in (p.sink_path, p.quarantine_path):
        if table.exists(spark, path):
            raise CheckpointMismatch(
                f"{p.name}: the table {path} already has data, but the checkpoint {p.checkpoint_path} "
                "has no progress. Restore the checkpoint that wrote the table, or write to a new sink "
                "path; starting over would write its records again."
            )


def table_sinks(spark: SparkSession, pipeline: Pipeline, fence: Fence = UNFENCED) -> tuple[TableSink, TableSink]:
    """The pipeline's output table and quarantine, each written by this checkpoint's writer."""
    date_col = pipeline.spec.date_partition.column
    sink = table_sink(pipeline.spec.sink.format)
    writer = query_id(spark, pipeline)
    return (
        sink(spark, pipeline.sink_path, date_col, writer, fence),
        sink(spark, pipeline.quarantine_path, date_col, writer, fence),
    )
