"""How each kind of pipeline runs, one class per mode. The ingest job (``jobs/ingest.py``) takes
the spec's mode (:func:`mode_of`), lets it refuse what it cannot do, and runs it:

- :class:`MicroBatch`: Kafka to tables in micro-batches (:mod:`jobs.stream.micro_batch`), and backfills;
- :class:`Derived`: another pipeline's table, or Kafka with event-time work, to tables
  (:mod:`jobs.stream.derive`);
- :class:`Continuous`: Kafka to Kafka, in continuous processing or Real-Time Mode
  (:mod:`jobs.stream.continuous`).

The two batch modes share one loop (:class:`BatchMode`): the event log, the status reports,
a stop that takes effect after the batch in progress, and the restart after SPARK-57438.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import ClassVar
from urllib.parse import urlsplit

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs.stream import continuous, derive, micro_batch
from jobs.stream.backfill import BackfillRefused
from jobs.stream.batches import STOP_MARKER, CheckpointMismatch, last_committed, restore_query_logging
from jobs.stream.events import EventLog
from jobs.stream.status import StatusReporter, run_summary
from jobs.tables import hadoopfs
from sluice.errors import first_line
from sluice.records.audit import BatchAudit
from sluice.records.audit import file_name as audit_file
from sluice.records.backfill import BackfillPlan
from sluice.spec import Pipeline, compatibility
from sluice.spec.continuous import ContinuousError
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.ingest")

# SPARK-57438 (Spark 4.1.x): after a restart, the first batch replayed from the offset log
# is written and committed, then progress reporting fails with this NPE in
# KafkaMicroBatchStream.metrics. Starting the query again from the same checkpoint is safe
# (the batch is in the commit log) and the next batch plans normally.
_SPARK_57438 = 'Cannot invoke "scala.collection.IterableOps.map(scala.Function1)" because the return value of "scala.Option.get()" is null'
MAX_NPE_RESTARTS = 3
# A driver paused past its lease can wake between its batch's write and Spark's own entry in
# the commit or offset log, and write that entry before its next batch finds the lease gone.
# The log's put-if-absent lets only one of the two drivers write an entry; the one that
# finds it written fails on it. Holding the lease, it starts again from the checkpoint, which
# now has the entry: the batch's rows are in the tables once either way.
_CONCURRENT_LOG = "CONCURRENT_STREAM_LOG_UPDATE"


def _restartable(error: Exception, fence: Fence) -> str | None:
    """Why the query may start again from its checkpoint after ``error`` (None: it may not)."""
    if _SPARK_57438 in str(error):
        return "SPARK-57438 (replayed batch committed)"
    if _CONCURRENT_LOG in str(error) and fence.verify() is None:
        return "a fenced-off driver wrote a log entry of the batch it had in progress"
    return None


class RunMode(ABC):
    #: What this mode raises when a run cannot start as asked (the spec, the checkpoint and
    #: the tables disagree): said in one line, nothing written, exit code 3.
    refusals: ClassVar[tuple[type[Exception], ...]] = (
        CheckpointMismatch,
        compatibility.IncompatibleTable,
        BackfillRefused,
        hadoopfs.NoPutIfAbsent,
    )

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    @property
    def rebuilds(self) -> bool:
        """Can its checkpoint and tables be deleted and written again from what it reads?"""
        return False

    def refuse(self, backfill: BackfillPlan | None, available_now: bool, processing_time: str | None) -> None:
        """Raise one of :attr:`refusals` for a run this mode cannot do (by default, none)."""
        return None

    def prepare(self, spark: SparkSession, rebuild: bool) -> None:
        """Work before the query starts (a rebuild's deletions; by default, none)."""
        return None

    @abstractmethod
    def run(
        self,
        spark: SparkSession,
        *,
        stop: threading.Event | None = None,
        available_now: bool = False,
        backfill: BackfillPlan | None = None,
        reporter: StatusReporter | None = None,
        fence: Fence = UNFENCED,
    ) -> Exception | None:
        """Run until the query ends or ``stop`` is set; the query's error, if any. ``fence`` is
        the driver's lease, which every batch and commit checks."""


class BatchMode(RunMode):
    """A mode whose query writes micro-batches through a ``foreachBatch`` writer."""

    @abstractmethod
    def start(
        self,
        spark: SparkSession,
        events: EventLog,
        available_now: bool,
        backfill: BackfillPlan | None,
        stop: threading.Event,
        fence: Fence,
    ) -> StreamingQuery:
        """Start the query."""

    def before(
        self, spark: SparkSession, reporter: StatusReporter | None, events: EventLog, fence: Fence
    ) -> Exception | None:
        """Work a stream does before its query starts; its error ends the run."""
        return None

    def explain(self, error: Exception) -> Exception:
        """The query's error as the user should read it."""
        return error

    def run(
        self,
        spark: SparkSession,
        *,
        stop: threading.Event | None = None,
        available_now: bool = False,
        backfill: BackfillPlan | None = None,
        reporter: StatusReporter | None = None,
        fence: Fence = UNFENCED,
    ) -> Exception | None:
        stop = stop or threading.Event()
        events = EventLog(self.pipeline.name, self.pipeline.name)
        if backfill is None:
            events.flush(spark, force=True)  # rows a crash left in the spool
            spark.streams.addListener(events)
            if reporter is not None:
                reporter.counts = events.counts
        try:
            return self._run(spark, available_now, stop, backfill, reporter, events, fence)
        finally:
            if backfill is None:
                spark.streams.removeListener(events)
                events.flush(spark, force=True)

    def _run(
        self,
        spark: SparkSession,
        available_now: bool,
        stop: threading.Event,
        backfill: BackfillPlan | None,
        reporter: StatusReporter | None,
        events: EventLog,
        fence: Fence,
    ) -> Exception | None:
        pipeline = self.pipeline
        error: Exception | None = None
        if backfill is None:
            error = self.before(spark, reporter, events, fence)
            if error is not None:
                if reporter is not None:
                    reporter.failed(spark, pipeline.checkpoint_path, str(error))
                return error
        restarts = 0
        while True:
            query = self.start(spark, events, available_now, backfill, stop, fence)
            if restarts == 0:
                log.info(
                    "%s: started query %s (%s sink, checkpoint %s)",
                    pipeline.name,
                    query.id,
                    pipeline.spec.sink.format,
                    (micro_batch.for_backfill(pipeline, backfill) if backfill else pipeline).checkpoint_path,
                )
            run_until_stopped(query, stop, reporter=reporter, events=events if backfill is None else None, spark=spark)
            if backfill is None and query.lastProgress:
                events.wait_for(int(query.lastProgress["batchId"]))
            log.info("%s: run summary %s", pipeline.name, json.dumps(run_summary(query.recentProgress, events.counts)))
            error = query.exception()
            if error is not None:
                error = self.explain(error)
            if error is not None and STOP_MARKER in str(error):
                log.info("stopping %s after its last committed batch", query.name)
                error = None
            why = None if error is None or restarts == MAX_NPE_RESTARTS else _restartable(error, fence)
            if why is None:
                if reporter is not None and error is not None:
                    reporter.failed(spark, pipeline.checkpoint_path, str(error), query)
                elif reporter is not None:
                    reporter.report("finished" if available_now and not stop.is_set() else "stopped", query)
                return error
            restarts += 1
            log.warning("%s: restarting from the checkpoint after %s", pipeline.name, why)
            if backfill is None:
                record_replayed(spark, pipeline, events, query)


class MicroBatch(BatchMode):
    def start(
        self,
        spark: SparkSession,
        events: EventLog,
        available_now: bool,
        backfill: BackfillPlan | None,
        stop: threading.Event,
        fence: Fence,
    ) -> StreamingQuery:
        # A backfill's counts too (its own run's, never in the event log): its run summary then
        # counts the range's records, where Spark counts each read of them.
        return micro_batch.start(
            spark,
            self.pipeline,
            available_now=available_now,
            backfill=backfill,
            stop=stop,
            counts=events.counts,
            fence=fence,
        )

    def before(
        self, spark: SparkSession, reporter: StatusReporter | None, events: EventLog, fence: Fence
    ) -> Exception | None:
        return replay_planned_batch(spark, self.pipeline, reporter, events, fence)


class Derived(BatchMode):
    refusals = (*RunMode.refusals, derive.UpstreamMissing, derive.IncompatibleState)

    @property
    def rebuilds(self) -> bool:
        return self.pipeline.upstream is not None

    def refuse(self, backfill: BackfillPlan | None, available_now: bool, processing_time: str | None) -> None:
        if backfill is not None:
            raise BackfillRefused(
                f"{self.pipeline.name} keeps event-time state: a backfill beside the stream would build its own "
                "windows and sessions from part of the data; rebuild it from a new checkpoint and sink.path instead"
            )

    def prepare(self, spark: SparkSession, rebuild: bool) -> None:
        if rebuild:
            derive.rebuild(spark, self.pipeline)

    def start(
        self,
        spark: SparkSession,
        events: EventLog,
        available_now: bool,
        backfill: BackfillPlan | None,
        stop: threading.Event,
        fence: Fence,
    ) -> StreamingQuery:
        return derive.start(spark, self.pipeline, events, available_now=available_now, stop=stop, fence=fence)

    def explain(self, error: Exception) -> Exception:
        return derive.upstream_changed(self.pipeline, error) or error


class Continuous(RunMode):
    refusals = (*RunMode.refusals, ContinuousError)

    def refuse(self, backfill: BackfillPlan | None, available_now: bool, processing_time: str | None) -> None:
        if backfill or available_now or processing_time:
            raise ContinuousError(
                "mode", f"{self.pipeline.name} is a continuous branch: no backfill or micro-batch trigger"
            )

    def run(
        self,
        spark: SparkSession,
        *,
        stop: threading.Event | None = None,
        available_now: bool = False,
        backfill: BackfillPlan | None = None,
        reporter: StatusReporter | None = None,
        fence: Fence = UNFENCED,
    ) -> Exception | None:
        return continuous.run(spark, self.pipeline, stop or threading.Event(), reporter)


def mode_of(pipeline: Pipeline) -> RunMode:
    """The mode that runs this pipeline."""
    if pipeline.spec.mode == "continuous":
        return Continuous(pipeline)
    return Derived(pipeline) if pipeline.derived else MicroBatch(pipeline)


def run(
    spark: SparkSession,
    pipeline: Pipeline,
    *,
    available_now: bool = False,
    processing_time: str | None = None,
    rebuild: bool = False,
    stop: threading.Event | None = None,
    backfill: BackfillPlan | None = None,
    reporter: StatusReporter | None = None,
    fence: Fence = UNFENCED,
) -> Exception | None:
    """Run the pipeline (or one backfill of it) in its mode until it ends or is stopped; its
    error, if any. The one way in, for the driver (``jobs/ingest.py``), the tests and the
    benchmarks: a run its mode cannot do raises one of the mode's refusals before anything is
    touched; an object store that does not decide a put-if-absent is refused next
    (:class:`hadoopfs.NoPutIfAbsent`); then the mode prepares (a rebuild's deletions) and runs."""
    mode = mode_of(pipeline)
    mode.refuse(backfill, available_now, processing_time)
    tables = [pipeline.sink_path, pipeline.quarantine_path] if pipeline.table_format else []
    for folder in {urlsplit(f).netloc: f for f in reversed([pipeline.checkpoint_path, *tables])}.values():
        hadoopfs.check_put_if_absent(spark, folder)  # once per bucket, where this run commits
    mode.prepare(spark, rebuild)
    return mode.run(spark, stop=stop, available_now=available_now, backfill=backfill, reporter=reporter, fence=fence)


def run_until_stopped(
    query: StreamingQuery,
    stop: threading.Event,
    poll: int = 1,
    reporter: StatusReporter | None = None,
    events: EventLog | None = None,
    spark: SparkSession | None = None,
) -> None:
    """Wait for the query to end. On a stop request, an idle query is stopped at once; a
    running batch finishes and commits, and the next one declines to start (see BatchFrame)."""
    while query.isActive:
        if reporter is not None:
            reporter.report("running", query)
        if events is not None and spark is not None:
            events.flush(spark)
        if stop.is_set() and not query.status.get("isTriggerActive"):
            log.info("stopping %s after its last committed batch", query.name)
            query.stop()
            break
        if stop.is_set():
            time.sleep(0.1)  # the batch in progress commits; the next declines to start
            continue
        try:
            query.awaitTermination(poll)
        except StreamingQueryException:
            break  # the caller reads it from query.exception()


def replay_planned_batch(
    spark: SparkSession, pipeline: Pipeline, reporter: StatusReporter | None, events: EventLog, fence: Fence = UNFENCED
) -> Exception | None:
    """Replay a batch a crash interrupted under the spec it was planned with, when the spec
    has changed since (a new schema version, other rules): it ends after that batch, so the
    batches after it are planned under this spec. Its error, if any."""
    found = micro_batch.planned_under(spark, pipeline)
    if found is None:
        return None
    batch, previous = found
    log.warning(
        "%s: batch %d was planned under the previous spec and partly written before the driver stopped; "
        "replaying it under that spec, then going on under this one",
        pipeline.name,
        batch,
    )
    done = threading.Event()
    query = micro_batch.start(
        spark, previous, available_now=True, stop=done, until=batch, counts=events.counts, fence=fence
    )
    run_until_stopped(query, done, reporter=reporter, events=events, spark=spark)
    restore_query_logging(spark)  # the query that follows reports its own errors in full
    error: Exception | None = query.exception()
    if error is not None and _SPARK_57438 in str(error):
        # It strikes the first batch replayed after a restart, once it has committed.
        record_replayed(spark, previous, events, query)
        return None
    return None if error is None or STOP_MARKER in str(error) else error


def record_replayed(spark: SparkSession, pipeline: Pipeline, events: EventLog, query: StreamingQuery) -> None:
    """The event-log row of the batch SPARK-57438 kept from reporting its progress: the last
    committed one, from its audit."""
    batch = last_committed(spark, pipeline.checkpoint_path)
    if batch is None or (events.last is not None and events.last["batch_id"] >= batch):
        return
    try:
        audit = BatchAudit.from_json(hadoopfs.read_text(spark, f"{pipeline.audit_path}/{audit_file(batch)}"))
    except Exception as exc:  # a monitoring row must never stop the stream
        log.warning("%s: no event-log row for replayed batch %d: %s", pipeline.name, batch, first_line(exc))
        return
    events.replayed(audit, str(query.id), str(query.runId))
