"""Each table format's writer on the Spark side, one class per format: how a micro-batch is
written exactly once across restarts. How a table is found and read is
:mod:`jobs.tables.readers`; what a format can do is :class:`sluice.spec.formats.TableFormat`.

Both formats are written from ``foreachBatch``, so one batch can feed the output table and
its quarantine table, and a batch that runs again after a crash (same id, same offsets, as
Spark's checkpoint guarantees) must not be written twice. A writer is named by its
streaming query's id, which Spark keeps in the checkpoint for the checkpoint's lifetime:
renaming a pipeline does not change it, and a new checkpoint (batch ids from 0 again)
never passes for the old one.

A batch with nothing for a table writes nothing to it; that is safe in both formats.
"""

from __future__ import annotations

import functools
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pyspark.sql import DataFrame, SparkSession

from jobs.tables import hadoopfs
from jobs.tables.readers import committed_files, read_log, table_exists
from sluice import faults
from sluice.records import parquet_log
from sluice.spec.formats import DELTA, PARQUET, TableFormat, for_format
from sluice.state.lease import UNFENCED, Claim, Fence, commit_section

log = logging.getLogger("sluice.sinks")

#: Delta's conflicts between writers that commit one version at the same time, which its log's
#: put-if-absent makes them meet (sluice.storage.PUT_IF_ABSENT on S3): two that create a table
#: or change its schema at once, and two drivers of one checkpoint writing the same batch
#: (ConcurrentTransactionException: the same txnAppId; the batch's next attempt finds it
#: written and skips it). PySpark raises them as Py4JJavaError (delta-spark's conversion of
#: them into delta.exceptions classes does not reach DataFrameWriter.save here), so they are
#: matched by the JVM exception's class name.
COMMIT_RACES = (
    "ProtocolChangedException",
    "MetadataChangedException",
    "ConcurrentWriteException",
    "ConcurrentTransactionException",
)
COMMIT_RACE_ATTEMPTS = 3


class TableSink(ABC):
    """A table one writer appends micro-batches to (its reader: :mod:`jobs.tables.readers`)."""

    format: ClassVar[TableFormat]

    def __init__(self, spark: SparkSession, path: str, partition_by: str, writer: str, fence: Fence = UNFENCED) -> None:
        self.spark, self.path, self.partition_by, self.writer = spark, path.rstrip("/"), partition_by, writer
        #: The driver's lease: checked before each commit, so a driver that lost it writes nothing more.
        self.fence = fence

    @abstractmethod
    def write(self, df: DataFrame, batch_id: int) -> None:
        """Append the batch once: a batch this writer has committed already is skipped."""

    def merge(self, df: DataFrame, keys: list[str]) -> None:
        """Replace the rows whose ``keys`` match, insert the others (formats whose ``merges``)."""
        raise NotImplementedError(f"{self.path}: a {self.format.name} table cannot replace rows")

    def has_commits(self) -> bool:
        return table_exists(self.spark, self.format.name, self.path)


def commit_race(exc: BaseException) -> str | None:
    """The Delta conflict's name when ``exc`` is one of :data:`COMMIT_RACES`, else None."""
    text = str(getattr(exc, "java_exception", None) or exc)
    return next(
        (name for name in COMMIT_RACES if f"io.delta.exceptions.{name}" in text or name in type(exc).__name__), None
    )


def idempotent_append(spark: SparkSession) -> Any:
    """``sluice.delta.IdempotentAppend`` (``jobs/java/sluice/delta``, built by ``make setup``):
    Delta's idempotent append, answering the writer's last batch from the table's checksum
    instead of rebuilding its state; None, with a warning once, when it is not on Spark's
    classpath (the public writer then does the same write, slower)."""
    from py4j.java_gateway import JavaClass

    found = spark._jvm.sluice.delta.IdempotentAppend  # type: ignore[union-attr]
    if isinstance(found, JavaClass):
        return found
    _missing_append()
    return None


@functools.cache
def _missing_append() -> None:
    log.warning(
        "sluice.delta.IdempotentAppend is not on Spark's classpath (run `make setup`): Delta's writer "
        "rebuilds each table's state for every batch"
    )


class DeltaSink(TableSink):
    """Exactly once by Delta's idempotent writes: each commit records (txnAppId, txnVersion =
    batch id), and Delta skips a write whose version it has already committed for that app id.
    See https://docs.delta.io/latest/delta-streaming.html#idempotent-table-writes-in-foreachbatch
    """

    format = DELTA

    def __init__(self, spark: SparkSession, path: str, partition_by: str, writer: str, fence: Fence = UNFENCED) -> None:
        super().__init__(spark, path, partition_by, writer, fence)
        self.app_id = f"sluice-{writer}"

    def write(self, df: DataFrame, batch_id: int) -> None:
        """Append the batch. Two writers that create the same table at once (the stream and a
        backfill, both writing a quarantine that does not exist yet) conflict on Delta's first
        commit; the loser writes again, which the (txnAppId, txnVersion) pair keeps exactly once."""
        for attempt in range(1, COMMIT_RACE_ATTEMPTS + 1):
            self.fence.confirm()
            faults.point("delta.before-write", batch_id)
            try:
                self._append(df, batch_id)
                return
            except Exception as exc:
                race = commit_race(exc)
                if race is None or attempt == COMMIT_RACE_ATTEMPTS:
                    raise
                log.warning("%s: batch %d lost a commit race (%s); writing it again", self.path, batch_id, race)

    def _append(self, df: DataFrame, batch_id: int) -> None:
        # The spec may have gained columns (a new schema version, _rescued): the table takes
        # them; what it cannot take was refused before the stream started.
        options = {"mergeSchema": "true"}
        appender = idempotent_append(self.spark)
        if appender is not None:  # the same write, without a rebuild of the table's state
            appender.append(df._jdf, self.path, [self.partition_by], options, self.app_id, batch_id)
            return
        (
            df.write.format("delta")
            .mode("append")
            .partitionBy(self.partition_by)
            .options(**options)
            .option("txnAppId", self.app_id)
            .option("txnVersion", str(batch_id))
            .save(self.path)
        )

    def merge(self, df: DataFrame, keys: list[str]) -> None:
        """Merging the same rows again (a replayed batch) leaves the table as it was, so this
        is exactly once too."""
        from delta.tables import DeltaTable

        self.fence.confirm()
        cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
        DeltaTable.forPath(self.spark, self.path).alias("t").merge(
            df.alias("s"), cond
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()


STAGING = "_sluice_staging"
MAX_COMMIT_ATTEMPTS = 20
#: Commits are expired no sooner than this after they were written (seconds).
EXPIRE_AFTER = 600


class ParquetSink(TableSink):
    """Exactly once by a commit log (see :mod:`sluice.records.parquet_log`): a batch's files become
    visible in one atomic log entry, and a batch whose files the log lists is skipped.

    A batch is written with Spark's public DataFrameWriter into a staging folder, its files
    are moved into the table's partition folders under names that carry the writer, the batch
    and the epoch of the driver that wrote them (its checkpoint lease's), and the next commit of
    the log lists them. The commit is a put-if-absent, so of two drivers of one checkpoint (one
    paused past its lease, one that took over) only one commits a number; the other finds the
    batch in the log and drops its own copies.

    Nobody deletes files staged under another epoch before the batch is in the log: a paused
    driver that wakes up may still commit them, and a commit must never name files that are
    gone. Once the batch is committed, whichever attempt did it, no other attempt can commit it
    (its number is taken, and its next look at the log finds the batch), so what the others
    left is removed then. A crash before the commit leaves files no reader sees, which the
    batch's commit removes; a crash after it leaves a commit that the next attempt finds and skips.
    """

    format = PARQUET

    def __init__(self, spark: SparkSession, path: str, partition_by: str, writer: str, fence: Fence = UNFENCED) -> None:
        super().__init__(spark, path, partition_by, writer, fence)
        self.log_dir = f"{self.path}/{parquet_log.LOG_DIR}"
        self._last: int | None = None  # this writer's newest committed batch, once looked up
        self._seen: int | None = None  # the newest commit of the log when it was looked up

    def write(self, df: DataFrame, batch_id: int) -> None:
        if self._last is None:
            self._last = self._committed_batch()
        if batch_id <= self._last:
            log.info("%s: batch %d is committed already; skipping it", self.path, batch_id)
            self._clean(batch_id)  # what its attempts left, if the last one died after its commit
            return
        epoch = self.fence.epoch
        attempt = f"{self.path}/{STAGING}/{self.writer}-{batch_id:012d}-e{epoch}"
        self._undo(attempt, batch_id, epoch)
        # The log folder first: a reader that finds none lists the folder and would see these files.
        hadoopfs.mkdirs(self.spark, self.log_dir)
        df.write.mode("overwrite").partitionBy(self.partition_by).parquet(attempt)
        prefix = parquet_log.tag(self.writer, batch_id, epoch)
        entries = []
        for f in hadoopfs.list_files(self.spark, attempt):
            rel = f.uri.split(f"/{STAGING}/", 1)[1].split("/", 1)[1]  # date=2026-11-21/part-....parquet
            folder, _, name = rel.rpartition("/")
            if not name.endswith(".parquet") or name.startswith((".", "_")):
                continue
            target = f"{self.path}/{folder}/{prefix}{name}" if folder else f"{self.path}/{prefix}{name}"
            hadoopfs.move(self.spark, f.uri, target)
            moved = hadoopfs.info(self.spark, target)
            entries.append(
                parquet_log.Entry(
                    moved.uri, moved.size, moved.modification_time, "add", moved.replication, moved.block_size
                )
            )
        if self._commit(entries, batch_id) is None:
            log.warning(
                "%s: batch %d was committed by another driver of this checkpoint meanwhile", self.path, batch_id
            )
        faults.point("parquet.after-commit", batch_id)
        self._clean(batch_id)
        self._last = batch_id

    def _read(self, commits: range) -> list[parquet_log.Entry]:
        return read_log(self.spark, self.log_dir, commits)

    def _committed_batch(self) -> int:
        self._seen = parquet_log.latest(hadoopfs.list_names(self.spark, self.log_dir))
        found = parquet_log.last_batch(committed_files(self.spark, self.path), self.writer)
        return -1 if found is None else found

    def _undo(self, attempt: str, batch_id: int, epoch: int) -> None:
        """Remove what an earlier attempt of this driver at this batch left (same epoch: it
        failed in this process): its staging folder, and the files it had moved into partition
        folders (never a file the log lists, whoever committed it)."""
        self._remove(batch_id, [attempt], parquet_log.tag(self.writer, batch_id, epoch))

    def _clean(self, batch_id: int) -> None:
        """Once the batch is in the log: remove what every attempt at it left (any epoch), the
        files the log does not list and the staging folders."""
        batch = f"{self.writer}-{batch_id:012d}"  # then -e<epoch> (without it: staged by an older Sluice)
        attempts = [
            f"{self.path}/{STAGING}/{name}"
            for name in hadoopfs.list_names(self.spark, f"{self.path}/{STAGING}")
            if name == batch or name.startswith(f"{batch}-")
        ]
        self._remove(batch_id, attempts, parquet_log.tag(self.writer, batch_id))

    def _remove(self, batch_id: int, attempts: list[str], prefix: str) -> None:
        listed: set[str] | None = None
        for attempt in attempts:
            for folder in hadoopfs.list_names(self.spark, attempt):
                if "=" not in folder:
                    continue
                for name in hadoopfs.list_names(self.spark, f"{self.path}/{folder}"):
                    if not name.startswith(prefix):
                        continue
                    if listed is None:  # never a file the log lists, whoever committed it
                        listed = {e.path.rsplit("/", 1)[-1] for e in committed_files(self.spark, self.path)}
                    if name not in listed:
                        hadoopfs.delete(self.spark, f"{self.path}/{folder}/{name}")
            hadoopfs.delete(self.spark, attempt)

    def _commit(self, entries: list[parquet_log.Entry], batch_id: int) -> int | None:
        """Append one commit to the log; None if this writer's batch is in it already.

        Another writer (a backfill beside the stream) may commit too: the table's commit
        section (in the run-state store, so on every host) has writers take turns at listing
        the log and taking the next number, entered only while this driver holds its lease.
        Inside it, the commits since this writer last looked are read: a driver of the same
        checkpoint that took over may have committed this batch meanwhile. What decides is the
        put-if-absent of the commit itself (create_new): a writer that paused anywhere here
        finds its number taken, looks at the log again, and finds the batch or the next number."""
        with commit_section(Claim(self.path, "commit"), self.fence):
            for _ in range(MAX_COMMIT_ATTEMPTS):
                names = hadoopfs.list_names(self.spark, self.log_dir)
                newest = parquet_log.latest(names)
                seen = -1 if self._seen is None else self._seen
                if newest is not None and newest > seen:
                    # The commits since, or the newest compaction on, which holds all that is live.
                    since = range(seen + 1, newest + 1)
                    since = since if since.start > parquet_log.needed(newest).start else parquet_log.needed(newest)
                    theirs = parquet_log.last_batch(self._read(since), self.writer)
                    if theirs is not None and theirs >= batch_id:
                        self._seen = newest
                        return None
                commit = 0 if newest is None else newest + 1
                content = entries
                if parquet_log.is_compaction(commit) and newest is not None:
                    content = parquet_log.live(self._read(parquet_log.needed(newest)) + entries)
                target = f"{self.log_dir}/{parquet_log.file_name(commit)}"
                faults.point("parquet.before-commit", batch_id)
                if hadoopfs.create_new(self.spark, target, parquet_log.render(content)):
                    self._seen = commit
                    if parquet_log.is_compaction(commit):
                        self._expire(commit)
                    return commit
        raise RuntimeError(f"{self.path}: could not commit to {self.log_dir}; other writers took every number")

    def _expire(self, compaction: int) -> None:
        """Delete commits that are two compactions old and older than EXPIRE_AFTER: no reader
        needs them, and none that started reading before the newer compactions still does
        (Spark's own sink waits spark.sql.streaming.fileSink.log.cleanupDelay, 10 minutes)."""
        now_ms = time.time() * 1000
        for f in hadoopfs.list_files(self.spark, self.log_dir):
            commit = parquet_log.commit_number(f.uri.rsplit("/", 1)[-1])
            old_enough = now_ms - f.modification_time > EXPIRE_AFTER * 1000
            if commit is not None and commit < compaction - 2 * parquet_log.COMPACT_INTERVAL and old_enough:
                hadoopfs.delete(self.spark, f.uri)


SINKS: dict[str, type[TableSink]] = {s.format.name: s for s in (DeltaSink, ParquetSink)}


def table_sink(fmt: str) -> type[TableSink]:
    """The class that writes tables of format ``fmt`` (``delta`` or ``parquet``)."""
    return for_format(SINKS, fmt)
