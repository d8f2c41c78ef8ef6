"""The event log: each micro-batch's progress, as a ``StreamingQueryListener`` sees it, in a
Delta table (``$SLUICE_HOME/tables/_sluice_events``, ``sluice.sluice_events`` in the catalog).

The listener only collects rows: Spark calls it on its listener thread, where starting a
Spark job could wait on the query it reports. The job's main loop writes what was
collected (:meth:`EventLog.flush`) every ``SLUICE_EVENTS_FLUSH_SECONDS`` (30 s) and when
the query ends. Rows are appended without a transaction id: a row repeated after a crash
is a monitoring row seen twice, never a data row.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from jobs.sinks import COMMIT_RACE_ATTEMPTS, commit_race
from sluice import config
from sluice.errors import first_line

log = logging.getLogger("sluice.events")

SCHEMA = (
    "pipeline string, query_id string, run_id string, batch_id bigint, batch_time timestamp, "
    "input_rows bigint, input_rows_per_second double, processed_rows_per_second double, "
    "watermark timestamp, state_rows bigint, state_memory_bytes bigint, "
    "rows_dropped_by_watermark bigint, late_rows bigint, filtered_rows bigint, "
    "duration_ms map<string, bigint>, state_operators string, date date"
)


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class WriterCounts:
    """A derived pipeline's own count of a batch. Its query reads the source once per branch,
    so Spark's numInputRows (and its rates) count each row once per branch."""

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


class EventLog(StreamingQueryListener):
    """Collects a row per batch of the queries named ``query_name``; writes them on flush."""

    def __init__(self, pipeline: str, query_name: str) -> None:
        self.pipeline, self.query_name = pipeline, query_name
        self.path = config.events_table()
        #: batch id -> its counts, filled by a derived pipeline's writer.
        self.counts: dict[int, WriterCounts] = {}
        self.last: dict[str, Any] | None = None
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._flushed = time.monotonic()
        self.interval = float(os.environ.get("SLUICE_EVENTS_FLUSH_SECONDS") or 30)

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
        with self._lock:
            self._rows.append(row)
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
        """Append the collected rows (when ``force`` or the interval has passed); how many."""
        if not force and time.monotonic() - self._flushed < self.interval:
            return 0
        with self._lock:
            rows, self._rows = self._rows, []
        self._flushed = time.monotonic()
        if not rows:
            return 0
        df = spark.createDataFrame(rows, SCHEMA)
        for attempt in range(1, COMMIT_RACE_ATTEMPTS + 1):
            try:
                df.write.format("delta").mode("append").partitionBy("date").save(self.path)
                return len(rows)
            except Exception as exc:
                if commit_race(exc) is None or attempt == COMMIT_RACE_ATTEMPTS:
                    log.warning("%s: %d event-log rows not written: %s", self.pipeline, len(rows), first_line(exc))
                    return 0
        return 0
