"""The event log: each micro-batch's progress, as a ``StreamingQueryListener`` sees it, in a
Delta table (``$SLUICE_HOME/tables/_sluice_events``, ``sluice.sluice_events`` in the catalog).

The listener only collects rows: Spark calls it on its listener thread, where starting a
Spark job could wait on the query it reports. Each row goes to a spool file of the driver
process (``run/<pipeline>/events.<pid>.jsonl``) at once, so a crash loses none; the job's
main loop writes what the spool holds (:meth:`EventLog.flush`) every
``SLUICE_EVENTS_FLUSH_SECONDS`` (30 s), when the query ends, and before the next query
starts, when it also takes over the spools of this host's drivers of the pipeline that are
gone. (Two drivers of one pipeline can run on one host at once: one paused past its lease,
and the one that took over.) Each write is one of
Delta's idempotent writes (app id: the query's id, version: its newest batch in the
write), made with delta-rs, so a write a crash interrupted is done again without writing a row twice. A batch that
Spark replays after a restart reports no progress (SPARK-57438); its row is made from the
batch's audit (:meth:`EventLog.replayed`). A flush compacts a date's partition once it holds
``COMPACT_AT`` files.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, ClassVar

import psutil
import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import QueryProgressEvent, StreamingQueryProgress

from jobs.tables.sinks import commit_race
from sluice import config, storage
from sluice.errors import first_line
from sluice.records.audit import BatchAudit
from sluice.records.run import run_dir

log = logging.getLogger("sluice.events")

SCHEMA = (
    "pipeline string, query_id string, run_id string, batch_id bigint, batch_time timestamp, "
    "input_rows bigint, input_rows_per_second double, processed_rows_per_second double, "
    "watermark timestamp, state_rows bigint, state_memory_bytes bigint, "
    "rows_dropped_by_watermark bigint, late_rows bigint, filtered_rows bigint, "
    "duration_ms map<string, bigint>, state_operators string, date date"
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class WriterCounts:
    """A writer's own count of a batch. Spark's numInputRows (and its rates) count a row each
    time the batch is read: a derived pipeline's query reads its source once per branch, and
    an ingest batch written in one pass is read again for its quarantine."""

    records_in: int
    late: int
    filtered: int


def progress_row(pipeline: str, progress: Any, counts: dict[int, WriterCounts]) -> dict[str, Any]:
    """One event-log row from a StreamingQueryProgress (and the writer's counts)."""
    ops = list(progress.stateOperators or [])
    batch_time = _timestamp(progress.timestamp) or datetime.now(UTC).replace(tzinfo=None)
    spark_rows = int(progress.numInputRows or 0)
    mine = counts.get(int(progress.batchId))
    rows = mine.records_in if mine is not None else spark_rows
    scale = rows / spark_rows if spark_rows else 1.0
    return {
        "pipeline": pipeline,
        "query_id": str(progress.id),
        "run_id": str(progress.runId),
        "batch_id": int(progress.batchId),
        "batch_time": batch_time,
        "input_rows": rows,
        "input_rows_per_second": float(progress.inputRowsPerSecond or 0.0) * scale,
        "processed_rows_per_second": float(progress.processedRowsPerSecond or 0.0) * scale,
        "watermark": _timestamp((progress.eventTime or {}).get("watermark")),
        "state_rows": sum(int(o.numRowsTotal) for o in ops),
        "state_memory_bytes": sum(int(o.memoryUsedBytes) for o in ops),
        "rows_dropped_by_watermark": sum(int(o.numRowsDroppedByWatermark) for o in ops),
        "late_rows": mine.late if mine else 0,
        "filtered_rows": mine.filtered if mine else 0,
        "duration_ms": {k: int(v) for k, v in (progress.durationMs or {}).items()},
        "state_operators": json.dumps(
            [
                {
                    "operator": o.operatorName,
                    "rows": int(o.numRowsTotal),
                    "memory_bytes": int(o.memoryUsedBytes),
                    "dropped_by_watermark": int(o.numRowsDroppedByWatermark),
                }
                for o in ops
            ]
        ),
        "date": batch_time.date(),
    }


#: SCHEMA as delta-rs writes it (Delta's timestamp is UTC); tests/integration/test_events.py
#: checks that the two agree.
ARROW_SCHEMA = pa.schema(
    [
        ("pipeline", pa.string()),
        ("query_id", pa.string()),
        ("run_id", pa.string()),
        ("batch_id", pa.int64()),
        ("batch_time", pa.timestamp("us", tz="UTC")),
        ("input_rows", pa.int64()),
        ("input_rows_per_second", pa.float64()),
        ("processed_rows_per_second", pa.float64()),
        ("watermark", pa.timestamp("us", tz="UTC")),
        ("state_rows", pa.int64()),
        ("state_memory_bytes", pa.int64()),
        ("rows_dropped_by_watermark", pa.int64()),
        ("late_rows", pa.int64()),
        ("filtered_rows", pa.int64()),
        ("duration_ms", pa.map_(pa.string(), pa.int64())),
        ("state_operators", pa.string()),
        ("date", pa.date32()),
    ]
)
#: A date's partition with this many files is compacted at the next flush.
COMPACT_AT = 50

_TIMES = ("batch_time", "watermark")


def _to_json(row: dict[str, Any]) -> str:
    return json.dumps({k: v.isoformat() if isinstance(v, (datetime, date)) else v for k, v in row.items()})


def _from_json(line: str) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(line)
    for k in _TIMES:
        row[k] = datetime.fromisoformat(row[k]) if row.get(k) else None
    row["date"] = date.fromisoformat(row["date"])
    return row


class _ProgressAsJson:
    """The Java side of :class:`EventLog`: each batch's progress read as one JSON text.

    PySpark's own wrapper turns Spark's progress object into Python field by field, one call to
    the JVM each, and it reads each map to its end by catching the iterator's exception, which
    PySpark then checks against a dozen Java classes by name. Each name the JVM cannot find
    searches every jar of Spark's class path, on Spark's listener thread, for every query's every
    batch (docs/measured.md has what that cost). Here a batch costs three calls, and only the
    batches of the log's own query are read at all.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            jprogress = jevent.progress()
            if jprogress.name() != self.log.query_name:
                return
            progress = StreamingQueryProgress.fromJson(json.loads(jprogress.json()))
        except Exception as exc:  # a monitoring row must never stop the stream
            log.warning("%s: cannot read a batch's progress: %s", self.log.pipeline, first_line(exc))
            return
        self.log.onQueryProgress(QueryProgressEvent(progress))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class EventLog(StreamingQueryListener):
    """Collects a row per batch of the queries named ``query_name`` in a spool; writes them on flush."""

    def __init__(self, pipeline: str, query_name: str) -> None:
        self.pipeline, self.query_name = pipeline, query_name
        self.path = config.events_table()
        self.spool = run_dir(pipeline) / f"events.{os.getpid()}.jsonl"
        self.inflight = run_dir(pipeline) / f"events.{os.getpid()}.inflight"
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        #: batch id -> its counts, filled by the batch writer.
        self.counts: dict[int, WriterCounts] = {}
        self.last: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._created = False
        self._flushed = time.monotonic()
        self.interval = float(os.environ.get("SLUICE_EVENTS_FLUSH_SECONDS") or 30)

    @property
    def _jlistener(self) -> Any:
        """What Spark calls: :class:`_ProgressAsJson`, not PySpark's own wrapper (see there).

        PySpark's private hook for the Java side of a listener; ``tests/unit/test_private_pyspark.py``
        fails when it changes."""
        if not hasattr(self, "_jlistenerobj"):
            jvm = SparkContext._jvm
            assert jvm is not None, "no Spark session: a listener is added to a running one"
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
        return self._jlistenerobj

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        try:
            row = progress_row(self.pipeline, progress, self.counts)
        except Exception as exc:  # a monitoring row must never stop the stream
            log.warning("%s: cannot record batch %s: %s", self.pipeline, progress.batchId, first_line(exc))
            return
        self._append(row)

    def replayed(self, audit: BatchAudit, query_id: str, run_id: str) -> None:
        """The row of a batch Spark replayed without reporting its progress (SPARK-57438):
        what its audit knows (rows in, its time); Spark's own metrics stay NULL."""
        batch_time = datetime.strptime(audit.written_at, "%Y-%m-%dT%H:%M:%SZ") if audit.written_at else None
        batch_time = batch_time or datetime.now(UTC).replace(tzinfo=None)
        self._append(
            {
                "pipeline": self.pipeline,
                "query_id": query_id,
                "run_id": run_id,
                "batch_id": audit.batch_id,
                "batch_time": batch_time,
                "input_rows": audit.records_in,
                "input_rows_per_second": None,
                "processed_rows_per_second": None,
                "watermark": None,
                "state_rows": None,
                "state_memory_bytes": None,
                "rows_dropped_by_watermark": None,
                "late_rows": 0,
                "filtered_rows": 0,
                "duration_ms": {"addBatch": int(audit.seconds * 1000)},
                "state_operators": "[]",
                "date": batch_time.date(),
            }
        )

    def _append(self, row: dict[str, Any]) -> None:
        with self._lock:
            with self.spool.open("a+b") as out:
                end = out.seek(0, os.SEEK_END)
                if end and out.seek(end - 1) is not None and out.read(1) != b"\n":
                    out.write(b"\n")  # a line a killed driver cut short stays on its own
                out.write(_to_json(row).encode() + b"\n")
            self.last = row

    def wait_for(self, batch_id: int | None, timeout: float = 5.0) -> None:
        """Give Spark's listener bus, which runs behind the query, time to deliver a batch's
        progress (the last one of a run arrives after the query has ended)."""
        deadline = time.monotonic() + timeout
        while batch_id is not None and time.monotonic() < deadline:
            last = self.last
            if last is not None and last["batch_id"] >= batch_id:
                return
            time.sleep(0.05)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def flush(self, spark: SparkSession, force: bool = False) -> int:
        """Append the spooled rows (when ``force`` or the interval has passed); how many.

        A flush first renames the spool to ``events.<pid>.inflight`` (atomically, so rows seen
        meanwhile go to a new spool) and deletes that file once Delta has committed its rows.
        A flush a crash interrupted finds the same file at the next one and writes the same
        rows with the same versions, which Delta skips where it had committed them."""
        if not force and time.monotonic() - self._flushed < self.interval:
            return 0
        self._flushed = time.monotonic()
        try:
            if force:
                self._adopt()
            return self._flush(spark)
        except OSError as exc:  # a monitoring row must never stop the stream: they stay spooled
            log.warning("%s: event-log rows not written yet: %s", self.pipeline, first_line(exc))
            return 0

    def _adopt(self) -> None:
        """Take over the spools of this host's drivers of the pipeline that are gone: their
        rows go to this driver's spool (their lines whole, as a crash may cut the last one)."""
        for orphan in sorted(self.spool.parent.glob("events.*")):
            owner = orphan.name.split(".")[1]
            if orphan in (self.spool, self.inflight) or (owner.isdigit() and _alive(int(owner))):
                continue
            with self._lock:
                text = orphan.read_text(encoding="utf-8")
                if text:
                    with self.spool.open("a", encoding="utf-8") as out:
                        out.write(text if text.endswith("\n") else text + "\n")
                orphan.unlink()

    def _flush(self, spark: SparkSession) -> int:
        written = 0
        for _ in range(2):  # what a crashed flush left, then what is spooled now
            with self._lock:
                if not self.inflight.exists():
                    if not self.spool.exists() or not self.spool.stat().st_size:
                        return written
                    os.replace(self.spool, self.inflight)
            try:
                rows = self._taken()
                if rows:
                    self._create(spark)
                for query_id in sorted({r["query_id"] for r in rows}):
                    mine = [r for r in rows if r["query_id"] == query_id]
                    self._write(spark, mine, query_id, max(r["batch_id"] for r in mine))
            except Exception as exc:  # a monitoring row must never stop the stream: they stay spooled
                log.warning("%s: event-log rows not written yet: %s", self.pipeline, first_line(exc))
                return written
            self.inflight.unlink()
            written += len(rows)
        return written

    def _taken(self) -> list[dict[str, Any]]:
        """The rows of the in-flight file; a line a kill cut short is left out, and said so."""
        rows = []
        for line in self.inflight.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(_from_json(line))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: an event-log row cut short by a crash is left out: %.80s", self.pipeline, line)
        return rows

    def _write(self, spark: SparkSession, rows: list[dict[str, Any]], query_id: str, version: int) -> None:
        """Delta's idempotent write, by delta-rs: each query is a writer (app id), its newest
        batch in the write the version; rows of a version the table holds are skipped.

        Not Spark's writer: a few rows a flush cost it one to nine seconds (the driver's stop
        waited for them), delta-rs a fraction of one. Its commit is put-if-absent, as Spark's."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        app_id = f"events-{query_id}"
        table = storage.delta_table(self.path)
        if table is None:
            raise OSError(f"no event log at {self.path}")
        written = table.transaction_version(app_id)
        if written is not None and written >= version:
            return
        write_deltalake(
            table,
            pa.Table.from_pylist(rows, schema=ARROW_SCHEMA),
            mode="append",
            partition_by=["date"],
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
        )
        self._compact(table, {r["date"] for r in rows})

    def _compact(self, table: Any, dates: set[date]) -> None:
        """Each flush adds a file to its date's partition: one with many is compacted here (the
        replaced files go at the next maintenance's VACUUM). Two drivers compacting at once
        conflict on the same files, and the one that loses leaves it to the other. (The write
        left ``table`` at its own commit: no second read of the log.)"""
        for day in sorted(dates):
            where = [("date", "=", day.isoformat())]
            if len(table.file_uris(file_pruning_predicate=where)) < COMPACT_AT:
                continue
            try:
                table.optimize.compact(partition_filters=where)
            except Exception as exc:
                log.info("%s: event log %s not compacted now: %s", self.pipeline, day, first_line(exc))

    def _create(self, spark: SparkSession) -> None:
        """Create the table, once (with Spark, whose schema is the catalog's)."""
        if self._created:
            return
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, self.path):
            try:
                builder = (
                    DeltaTable.createIfNotExists(spark)
                    .location(self.path)
                    .addColumns(spark.createDataFrame([], SCHEMA).schema)
                )
                builder.partitionedBy("date").execute()
            except Exception as exc:
                if commit_race(exc) is None:  # another stream created it first: fine
                    raise
        self._created = True
