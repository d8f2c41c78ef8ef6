"""The job's own report of its state, read by supervision (see :mod:`sluice.ops.supervision`).

Written to the run-state store every second while the query runs: a heartbeat
(``updated_at``), the Spark application id and UI, the query and run ids, and a summary of the
last progress event including Kafka's offsets behind latest. Every write is fenced by the
driver's lease: once it lost it, it reports nothing over its successor's records.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs.stream.batches import last_committed
from jobs.stream.events import WriterCounts
from jobs.stream.lineage import StreamLineage
from sluice.errors import SluiceError, root_cause
from sluice.records.run import Failures, Status
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.status")


def input_rows(progress: dict[str, Any], counts: dict[int, WriterCounts]) -> int:
    """A batch's records in: the writer's count where it has one (Spark counts a record each
    time the batch is read), else Spark's."""
    mine = counts.get(int(progress.get("batchId") or 0))
    return mine.records_in if mine is not None else int(progress.get("numInputRows") or 0)


def _progress_summary(progress: dict[str, Any] | None, counts: dict[int, WriterCounts]) -> dict[str, Any]:
    if not progress:
        return {}
    ops = progress.get("stateOperators") or []
    mine = counts.get(int(progress.get("batchId") or 0))
    spark_rows = int(progress.get("numInputRows") or 0)
    rows = input_rows(progress, counts)
    summary = {
        "batch_id": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "input_rows": rows,
        "rows_per_second": float(progress.get("processedRowsPerSecond") or 0)
        * (rows / spark_rows if spark_rows else 1),
        "sources": [
            {"end_offset": s.get("endOffset"), "latest_offset": s.get("latestOffset"), "metrics": s.get("metrics", {})}
            for s in progress.get("sources", [])
        ],
    }
    if ops or (progress.get("eventTime") or {}).get("watermark"):
        summary |= {
            "watermark": (progress.get("eventTime") or {}).get("watermark"),
            "state_rows": sum(int(o.get("numRowsTotal") or 0) for o in ops),
            "state_memory_bytes": sum(int(o.get("memoryUsedBytes") or 0) for o in ops),
            "late_rows": mine.late if mine is not None else 0,
        }
    return summary


def run_summary(progress: list[Any], counts: dict[int, WriterCounts] | None = None) -> dict[str, Any]:
    """What a run's batches cost, from the query's recent progress (Spark keeps the last
    100): batches with input, their rows (:func:`input_rows`), each one's time, and the time per phase summed
    (``addBatch`` is the foreachBatch function; the rest is Spark's own bookkeeping)."""
    ran = [p for p in progress if p.get("numInputRows")]
    phases: dict[str, int] = {}
    for p in ran:
        for phase, ms in (p.get("durationMs") or {}).items():
            phases[phase] = phases.get(phase, 0) + int(ms)
    return {
        "batches": len(ran),
        "input_rows": sum(input_rows(p, counts or {}) for p in ran),
        "batch_ms": [int((p.get("durationMs") or {}).get("triggerExecution", 0)) for p in ran],
        "phase_ms": phases,
    }


class StatusReporter:
    def __init__(
        self, spark: SparkSession, name: str, lineage: StreamLineage | None = None, fence: Fence = UNFENCED
    ) -> None:
        sc = spark.sparkContext
        self.name, self.app_id, self.ui = name, sc.applicationId, sc.uiWebUrl
        #: The driver's lease: its reports are written only while it holds (see the module doc).
        self.fence = fence
        self._unreported: str | None = None  # why reports fail, said once until they pass again
        #: The run's OpenLineage events, told each state reported here (None: not configured).
        self.lineage = lineage
        self.records_read, self.counted_upto = 0, -1
        #: batch id -> its counts, from the batch writer (see jobs.stream.events.WriterCounts).
        self.counts: dict[int, WriterCounts] = {}
        failures = Failures.read(name)
        #: The batch earlier runs failed on: once this run gets past it, they are forgotten.
        self.failed_batch = failures.batch if failures else None

    def report(self, state: str, query: StreamingQuery | None = None, error: str | None = None) -> None:
        if self.fence.lost:
            return
        status = Status(self.name, state, os.getpid(), time.time(), self.app_id, ui=self.ui, error=error)
        if query is not None:
            status.query_id, status.run_id = str(query.id), str(query.runId)
            status.last_progress = _progress_summary(query.lastProgress, self.counts)
            done = query.lastProgress["batchId"] if query.lastProgress else None
            if self.failed_batch is not None and done is not None and int(done) >= self.failed_batch:
                try:
                    Failures.clear(self.name, fence=self.fence.token)
                    self.failed_batch = None
                except SluiceError:
                    pass  # tried again at the next report
        try:
            status.save(fence=self.fence.token)
            if self._unreported is not None:
                log.info("%s: status reported again", self.name)
                self._unreported = None
        except SluiceError as exc:  # lost, or the store did not answer: the lease's fence acts on it
            if self._unreported is None:
                log.warning("%s: status not reported: %s", self.name, exc)
            self._unreported = str(exc)
        if self.lineage is not None:
            try:
                self.lineage.observe(state, self._records_read(query), error)
            except Exception as exc:  # lineage is never a reason to stop a stream
                log.warning("%s: no OpenLineage %s event: %s", self.name, state, exc)

    def _records_read(self, query: StreamingQuery | None) -> int | None:
        """The records this driver's batches read, in all (None before a batch ran: a continuous
        query has none). The writer keeps only recent batches' counts, in a dict its thread
        changes: a copy is read, and each batch is added once."""
        if query is None or not query.lastProgress:
            return None
        for batch, counts in sorted(list(self.counts.items())):
            if batch > self.counted_upto:
                self.records_read += counts.records_in
                self.counted_upto = batch
        return self.records_read

    def failed(self, spark: SparkSession, checkpoint_path: str, error: str, query: StreamingQuery | None = None) -> str:
        """Report the failure's root cause, and count it against the batch a restart runs
        next (supervision stops restarting after too many in a row); the cause's one line."""
        cause = root_cause(error)
        if self.fence.verify():  # not this driver's failure to count: another one runs now
            return cause
        self.report("failed", query, cause)
        try:
            batch = next_batch(spark, checkpoint_path)
        except Exception:  # the checkpoint cannot be listed (the reason it failed?): count it anyway
            batch = -1
        try:
            self.failed_batch = Failures.record(self.name, batch, cause, fence=self.fence.token).batch
        except SluiceError as exc:  # the store did not answer: the failure is in this log, not counted
            log.warning("%s: failure not counted: %s", self.name, exc)
        return cause


def next_batch(spark: SparkSession, checkpoint_path: str) -> int:
    """The batch a start from this checkpoint runs first: the one after its last commit."""
    last = last_committed(spark, checkpoint_path)
    return 0 if last is None else last + 1
