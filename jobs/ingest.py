"""The ingest job: one pipeline spec, Kafka JSON in, a date-partitioned table out.

Run by ``sluice run SPEC`` and by Airflow, both through spark-submit::

    spark-submit ... jobs/ingest.py --spec pipelines/device_signals.yaml [--available-now]
    spark-submit ... jobs/ingest.py --spec ... --backfill PLAN   (a BackfillPlan as JSON)

Per micro-batch: parse every record, write the good ones (flattened) to the output table
and the rest to the quarantine table with the reason, and record the counts
(records in = records out + records quarantined) in the audit log beside the checkpoint.
Both tables are written exactly once per batch, so a crash at any moment followed by a
restart from the same checkpoint neither loses nor repeats a record.

SIGTERM or Ctrl-C stops the query after the batch in progress has committed. While it
runs, the job reports its state every second (:mod:`jobs.status`) for supervision.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pyspark import StorageLevel
from pyspark.errors import StreamingQueryException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jobs import continuous, derive, expectations, fence, hadoopfs
from jobs.backfill import BackfillRefused, clip_to_stream, drop_present, in_range, source_options
from jobs.batches import (
    STOP_MARKER,
    CheckpointMismatch,
    check_checkpoint,
    clear_unfinished_writes,
    decline_if_stopping,
    kill_if_asked,
    last_committed,
    restore_query_logging,
    table_sinks,
)
from jobs.events import EventLog, WriterCounts
from jobs.lifecycle import configure_logging, stop_on_signals
from jobs.parse import REASON, flat_rows, for_split, parse, quarantine_rows, read_kafka, rescued_paths
from jobs.sinks import TableSink, log_growth, table_shape
from jobs.status import StatusReporter, run_summary
from sluice.errors import first_line, root_cause
from sluice.records import checkpoint, locks
from sluice.records.audit import BatchAudit
from sluice.records.audit import file_name as audit_file
from sluice.records.backfill import BackfillPlan
from sluice.records.run import Driver
from sluice.spec import Pipeline, SpecError, Trigger, compatibility, load_pipeline
from sluice.spec.columns import RESCUED_MAP
from sluice.spec.continuous import ContinuousError
from sluice.spec.loader import recorded, restore

log = logging.getLogger("sluice.ingest")

#: The exit code of a driver that stopped because another one took its lease over.
LEASE_LOST = 5

#: How many of a batch's rescued paths its audit names.
TOP_RESCUED_PATHS = 10
#: A batch from more topic partitions than this is counted by a pass of its own (see BatchWriter._partitions).
MAX_OBSERVED_PARTITIONS = 64
#: How many batches' counts a writer keeps (Spark keeps the progress of the last 100).
KEPT_COUNTS = 200
#: How long a one-pass batch waits for its observed counts after its write (seconds).
OBSERVED_WAIT = 30.0


class BatchReadChanged(RuntimeError):
    """A batch read twice did not find the same records: the batch fails uncommitted."""


class BatchWriter:
    """The ``foreachBatch`` function: split one batch between the two tables.

    Once ``stop`` is set, the next batch declines to start (:class:`StopRequested`) before
    it writes anything. Spark cannot be asked to skip a batch it has planned, and with a
    backlog the next batch starts as soon as the last one commits, so this is how a stop
    takes effect right after the batch in progress: the declined batch is planned in the
    checkpoint but not committed, and is read again at the next start.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        backfill: BackfillPlan | None = None,
        stop: threading.Event | None = None,
        until: int | None = None,
        counts: dict[int, WriterCounts] | None = None,
    ) -> None:
        self.spark, self.pipeline, self.backfill, self.stop = spark, pipeline, backfill, stop
        self.until = until  # set ``stop`` once this batch is written: a replay ends after it
        # Each batch's records in, for the event log and status: Spark counts a record each
        # time the batch is read, and a one-pass batch with records to quarantine is read twice.
        self.counts = counts
        self._sinks: tuple[TableSink, TableSink] | None = None
        self._schema_recorded = False
        self._written = False  # has this writer written a batch (the first may be one the tables have)

    def sinks(self) -> tuple[TableSink, TableSink]:
        if self._sinks is None:
            self._sinks = table_sinks(self.spark, self.pipeline)
        return self._sinks

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        decline_if_stopping(self.spark, self.pipeline, self.stop, batch_id)
        started = time.monotonic()
        if not self._schema_recorded:
            record_schema(self.spark, self.pipeline)
            self._schema_recorded = True
        checked = expectations.check(batch, self.pipeline)
        partitions = self._partitions(batch_id)
        if partitions is not None:
            audit, counts = self._write_once(checked, batch_id, partitions)
        else:
            audit, counts = self._write_cached(checked, batch_id)
        self._written = True
        if self.counts is not None:
            self.counts[batch_id] = WriterCounts(audit.records_in, 0, 0)
            self.counts.pop(batch_id - KEPT_COUNTS, None)
        audit.seconds = round(time.monotonic() - started, 3)
        audit.written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        hadoopfs.write_text(self.spark, f"{self.pipeline.audit_path}/{audit_file(batch_id)}", audit.to_json())
        if audit.records_rescued:
            log.warning(
                "%s batch %d: %d records have fields the schema does not declare, kept in _rescued: %s",
                self.pipeline.name,
                batch_id,
                audit.records_rescued,
                ", ".join(f"{path} ({n})" for path, n in audit.rescued_paths.items()),
            )
        log.info(
            "%s batch %d: %d records in -> %d out (%d rows), %d quarantined in %.2fs",
            self.pipeline.name,
            batch_id,
            audit.records_in,
            audit.records_out,
            audit.rows_out,
            audit.records_quarantined,
            audit.seconds,
        )
        if counts:
            log.info("%s batch %d expectations: %s", self.pipeline.name, batch_id, expectations.summary(counts))
        kill_if_asked(self.pipeline, batch_id)
        if self.until is not None and batch_id >= self.until and self.stop is not None:
            self.stop.set()

    def _partitions(self, batch_id: int) -> list[tuple[str, int]] | None:
        """The topic partitions this batch read (from the checkpoint's offset log), when the
        batch is written in one pass; None when it is kept in memory for several.

        A writer's first batch may be one a crash left written but not committed, which the
        tables skip; a backfill drops the records already in a table first; and a ``fail``
        rule must be counted before anything is written: each needs the batch twice. So do
        batches from more partitions than :data:`MAX_OBSERVED_PARTITIONS`, whose offset spans
        would make the audit's observed aggregates too many. And a source that tolerates lost
        records (``fail_on_data_loss: false``) keeps the batch, so the quarantine's second
        read cannot find fewer records than the first: Kafka may have deleted some between."""
        if (
            not self._written
            or self.backfill is not None
            or expectations.fail_rule_failed(self.pipeline) is not None
            or not self.pipeline.kafka.fail_on_data_loss
        ):
            return None
        cp = self.pipeline.checkpoint_path.rstrip("/")
        ends = checkpoint.parse_offsets(hadoopfs.read_text(self.spark, f"{cp}/offsets/{batch_id}"))
        found = sorted((topic, part) for topic, parts in ends.items() for part in parts)
        return found if len(found) <= MAX_OBSERVED_PARTITIONS else None

    def _write_once(
        self, batch: DataFrame, batch_id: int, partitions: list[tuple[str, int]]
    ) -> tuple[BatchAudit, dict[str, expectations.RuleCount]]:
        """Write the good records while counting the batch as it goes by (Spark's observed
        metrics): one read of the batch, unless it has records to quarantine or rescued
        fields to name, which read it again. Only the rejects are kept, while they are
        counted and written."""
        out, _ = self.sinks()
        self._begin(batch_id)
        seen = Observation(f"sluice-audit-{uuid.uuid4().hex}")
        flat = flat_rows(batch.observe(seen, *audit_columns(self.pipeline, partitions)).filter(good()), self.pipeline)
        rows = None
        if self.pipeline.plan.explodes:
            rows = Observation(f"sluice-rows-{uuid.uuid4().hex}")
            flat = flat.observe(rows, F.count(F.lit(1)).alias("rows"))
        out.write(flat, batch_id)
        metrics = observed(seen)
        skipped = metrics is None
        if metrics is None:  # the table had this batch (written by a driver that took this one's lease?)
            fence.check()
            log.warning("%s batch %d: the output table skipped it; counting it again", self.pipeline.name, batch_id)
            row = batch.agg(*audit_columns(self.pipeline, partitions)).first()
            assert row is not None  # an aggregate without grouping has one row
            metrics = row.asDict()
        audit = BatchAudit(self.pipeline.name, batch_id, metrics["n"], metrics["out"], metrics["n"] - metrics["out"], 0)
        audit.rows_out = audit.records_out
        if rows is not None:
            counted = None if skipped else observed(rows)  # the skipped write observed nothing either
            audit.rows_out = counted["rows"] if counted else flat_rows(batch.filter(good()), self.pipeline).count()
        audit.records_rescued = metrics["rescued"]
        for i, (topic, part) in enumerate(partitions):
            if metrics[f"first_{i}"] is not None:
                audit.offsets.setdefault(topic, {})[str(part)] = [metrics[f"first_{i}"], metrics[f"last_{i}"]]
        if audit.records_quarantined:
            self._quarantine_again(batch, batch_id, audit.records_quarantined)
        if audit.records_rescued:
            audit.rescued_paths = rescued_paths(batch.filter(good()), TOP_RESCUED_PATHS)
        counts = expectations.read_counts(self.pipeline, [metrics])
        audit.expectations = {name: asdict(c) for name, c in counts.items()}
        return audit, counts

    def _quarantine_again(self, batch: DataFrame, batch_id: int, expected: int) -> None:
        """Write a one-pass batch's rejects from a second read of the batch, kept while it is
        counted: it must find the records the write counted, or the batch fails before any of
        them is written (a compacted topic may have dropped some since), and its restart
        writes both tables from one read."""
        _, quarantine = self.sinks()
        rejects = batch.filter(~good()).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            found = rejects.count()
            if found != expected:
                raise BatchReadChanged(
                    f"{self.pipeline.name} batch {batch_id}: {expected} records to quarantine when the batch "
                    f"was written, {found} when it was read again; none of them was written and the batch is "
                    "not committed, so the restart reads it once for both tables"
                )
            quarantine.write(quarantine_rows(rejects, self.pipeline), batch_id)
        finally:
            rejects.unpersist()

    def _write_cached(self, checked: DataFrame, batch_id: int) -> tuple[BatchAudit, dict[str, expectations.RuleCount]]:
        """Count the batch, then write it, from a copy kept in memory between the passes."""
        out, quarantine = self.sinks()
        batch = for_split(checked, expectations.fail_rule_failed(self.pipeline)).persist(StorageLevel.MEMORY_AND_DISK)
        present = 0
        try:
            if self.backfill is not None:
                fmt = self.pipeline.spec.sink.format
                tables = [(fmt, s.path) for s in (out, quarantine) if s.has_commits()]
                if tables:
                    kept = drop_present(self.spark, batch, tables).persist(StorageLevel.MEMORY_AND_DISK)
                    present = batch.count() - kept.count()
                    batch.unpersist()
                    batch = kept
            audit, counts = self._count(batch, batch_id)
            audit.records_already_present = present
            expectations.enforce(batch, self.pipeline, batch_id, counts)
            if audit.records_out or audit.records_quarantined:
                self._begin(batch_id)
            if audit.records_out:
                flat = flat_rows(batch.filter(good()), self.pipeline)
                if self.pipeline.plan.explodes:
                    flat = flat.persist(StorageLevel.MEMORY_AND_DISK)
                    audit.rows_out = flat.count()
                out.write(flat, batch_id)
            if audit.records_quarantined:
                quarantine.write(quarantine_rows(batch.filter(~good()), self.pipeline), batch_id)
        finally:
            batch.unpersist()
        return audit, counts

    def _begin(self, batch_id: int) -> None:
        """Record that this batch begins writing its tables (see :func:`check_split`)."""
        cp = self.pipeline.checkpoint_path.rstrip("/")
        hadoopfs.write_text(self.spark, f"{cp}/{checkpoint.WRITING_FILE}", str(batch_id))

    def _count(self, batch: DataFrame, batch_id: int) -> tuple[BatchAudit, dict[str, expectations.RuleCount]]:
        rows = (
            batch.groupBy("topic", "partition", good().alias("ok"))
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.min("offset").alias("first"),
                F.max("offset").alias("last"),
                F.count_if(F.size(RESCUED_MAP) > 0).alias("rescued"),
                *expectations.count_columns(self.pipeline),
            )
            .collect()
        )
        audit = BatchAudit(self.pipeline.name, batch_id, 0, 0, 0, 0)
        for r in rows:
            audit.records_in += r["n"]
            if r["ok"]:
                audit.records_out += r["n"]
                audit.records_rescued += r["rescued"]
            else:
                audit.records_quarantined += r["n"]
            span = audit.offsets.setdefault(r["topic"], {}).setdefault(str(r["partition"]), [r["first"], r["last"]])
            span[0], span[1] = min(span[0], r["first"]), max(span[1], r["last"])
        audit.rows_out = audit.records_out
        if audit.records_rescued:
            audit.rescued_paths = rescued_paths(batch.filter(good()), TOP_RESCUED_PATHS)
        counts = expectations.read_counts(self.pipeline, rows)
        audit.expectations = {name: asdict(c) for name, c in counts.items()}
        return audit, counts


def good() -> Column:
    """True for a record that goes to the output table (it has no quarantine reason)."""
    return F.col(REASON).isNull()


def observed(seen: Observation, timeout: float | None = None) -> dict[str, Any] | None:
    """The metrics a write observed, or None if they did not come: Spark delivers them once
    the write's query has run, on its listener bus, and a write the table skipped (the batch
    is in it already) runs no query. Observation.get would wait for ever, and so does the
    waiting thread then, blocked in the JVM until the driver exits: a one-pass write is
    skipped only when another driver wrote the batch, whose lease this one then lost, so
    that is one thread, once, in a driver about to stop (see fence.check)."""
    box: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: box.update(seen.get), name="sluice-observed", daemon=True)
    waiter.start()
    waiter.join(OBSERVED_WAIT if timeout is None else timeout)
    return box or None


def audit_columns(pipeline: Pipeline, partitions: list[tuple[str, int]]) -> list[Column]:
    """The batch audit as aggregates over every record: records in, records good, good
    records with rescued fields, each rule's counts, and each partition's first and last
    offset (``first_<i>``/``last_<i>`` for ``partitions[i]``; NULL when it had none)."""
    columns = [
        F.count(F.lit(1)).alias("n"),
        F.count_if(good()).alias("out"),
        F.count_if(good() & (F.size(RESCUED_MAP) > 0)).alias("rescued"),
        *expectations.count_columns(pipeline),
    ]
    for i, (topic, part) in enumerate(partitions):
        offset = F.when((F.col("topic") == topic) & (F.col("partition") == part), F.col("offset"))
        columns += [F.min(offset).alias(f"first_{i}"), F.max(offset).alias(f"last_{i}")]
    return columns


def _split_state(spark: SparkSession, pipeline: Pipeline) -> tuple[list[str], int | None, int | None]:
    """The checkpoint folder's names, its planned but uncommitted batch, and the newest batch
    that began writing (None: a checkpoint from before that was recorded)."""
    cp = pipeline.checkpoint_path.rstrip("/")
    names = hadoopfs.list_names(spark, cp)
    pending = checkpoint.pending_batch(
        hadoopfs.list_names(spark, f"{cp}/offsets"), hadoopfs.list_names(spark, f"{cp}/commits")
    )
    began = (
        int(hadoopfs.read_text(spark, f"{cp}/{checkpoint.WRITING_FILE}")) if checkpoint.WRITING_FILE in names else None
    )
    return names, pending, began


def _changed_split(spark: SparkSession, pipeline: Pipeline, names: list[str]) -> list[str]:
    if checkpoint.SPLIT_FILE not in names:
        return []
    planned = json.loads(hadoopfs.read_text(spark, f"{pipeline.checkpoint_path.rstrip('/')}/{checkpoint.SPLIT_FILE}"))
    return checkpoint.split_changes(planned, pipeline.split)


def planned_under(spark: SparkSession, pipeline: Pipeline) -> tuple[int, Pipeline] | None:
    """A planned batch that a crash interrupted while writing, under a split other than this
    spec's: its id and the pipeline it was planned under (from the checkpoint's record), to
    replay it under that before this spec takes over. None when there is no such batch."""
    names, pending, began = _split_state(spark, pipeline)
    if pending is None or (began is not None and began < pending) or checkpoint.SPEC_FILE not in names:
        return None
    if not _changed_split(spark, pipeline, names):
        return None
    record = json.loads(hadoopfs.read_text(spark, f"{pipeline.checkpoint_path.rstrip('/')}/{checkpoint.SPEC_FILE}"))
    previous = restore(record, pipeline)
    return (pending, previous) if not _changed_split(spark, previous, names) else None


def check_split(spark: SparkSession, pipeline: Pipeline) -> None:
    """Refuse to replay a partly written batch under a different split, then record this one.

    A crash between a batch's two table writes leaves it planned but not committed; the
    restart replays it, skipping the table that already has its part. If the schema, the
    event-time rules or a dropping row rule changed meanwhile, a record could then land in
    both tables or in neither: the stream replays such a batch under the spec it was planned
    with first (:func:`planned_under`), so this refuses only a backfill (never replayed under
    another spec) or a checkpoint from before specs were recorded. A planned batch that
    wrote nothing (it failed a ``fail`` rule, or declined to start after a stop request)
    runs under the new split: that is how changing a rule gets a stream past a batch it failed on.
    """
    cp = pipeline.checkpoint_path.rstrip("/")
    names, pending, began = _split_state(spark, pipeline)
    changed = _changed_split(spark, pipeline, names) if pending is not None else []
    # Checkpoints from before WRITING_FILE existed cannot say: treat the batch as begun.
    if changed and pending is not None and (began is None or began >= pending):
        raise CheckpointMismatch(
            f"{pipeline.name}: batch {pending} was planned, but not committed, under a different "
            f"{' and '.join(changed)}, and this checkpoint does not record that spec. Replaying it with "
            f"this spec could put a record in both tables or in neither. Restore the previous spec, start "
            f"the pipeline and stop it once batch {pending} has committed (`sluice status` shows the last "
            "committed batch), then apply the change."
        )
    if changed:
        log.info(
            "%s: batch %d was planned under a different %s but wrote nothing; it runs under this spec",
            pipeline.name,
            pending,
            " and ".join(changed),
        )
    if began is None and pending is None:
        last = last_committed(spark, cp)
        hadoopfs.write_text(spark, f"{cp}/{checkpoint.WRITING_FILE}", str(-1 if last is None else last))
    hadoopfs.write_text(spark, f"{cp}/{checkpoint.SPEC_FILE}", json.dumps(recorded(pipeline), sort_keys=True))
    hadoopfs.write_text(spark, f"{cp}/{checkpoint.SPLIT_FILE}", json.dumps(pipeline.split, sort_keys=True))


def check_schema(spark: SparkSession, pipeline: Pipeline) -> None:
    """Refuse a schema version that cannot follow the one this checkpoint ran with
    (:data:`compatibility.SCHEMA_FILE`, which the first batch under a schema records)."""
    cp = pipeline.checkpoint_path.rstrip("/")
    if compatibility.SCHEMA_FILE in hadoopfs.list_names(spark, cp):
        problem = compatibility.schema_problems(
            pipeline, hadoopfs.read_text(spark, f"{cp}/{compatibility.SCHEMA_FILE}")
        )
        if problem:
            raise compatibility.IncompatibleTable(problem)


def record_schema(spark: SparkSession, pipeline: Pipeline) -> None:
    """Record the schema a batch is written under. Not at start: a start that fails before
    its first batch leaves the tables as they were, and going back must stay possible."""
    record = f"{pipeline.checkpoint_path.rstrip('/')}/{compatibility.SCHEMA_FILE}"
    hadoopfs.write_text(spark, record, pipeline.schema.to_spark_json())


def for_backfill(pipeline: Pipeline, backfill: BackfillPlan) -> Pipeline:
    """The same pipeline and tables, with the backfill's own checkpoint (and audit log)."""
    spec = pipeline.spec.model_copy(update={"checkpoint": pipeline.backfill_checkpoint_path(backfill.id)})
    return dataclasses.replace(pipeline, spec=spec)


def start(
    spark: SparkSession,
    pipeline: Pipeline,
    available_now: bool = False,
    backfill: BackfillPlan | None = None,
    stop: threading.Event | None = None,
    until: int | None = None,
    counts: dict[int, WriterCounts] | None = None,
) -> StreamingQuery:
    """Start the pipeline's streaming query (or one backfill's) and return it; with ``until``,
    it sets ``stop`` once that batch is written; ``counts`` gets each batch's records in."""
    shapes = functools.cache(lambda fmt, path: table_shape(spark, fmt, path))  # each table read once
    compatibility.check(pipeline, shapes)
    log_growth(pipeline, shapes)
    if backfill is None:
        clear_unfinished_writes(spark, pipeline)
        check_checkpoint(spark, pipeline)
        trigger = {"availableNow": True} if available_now else pipeline.spec.trigger.spark_kwargs()
        raw = read_kafka(spark, pipeline)
    else:
        backfill = clip_to_stream(spark, pipeline, backfill)
        pipeline, trigger = for_backfill(pipeline, backfill), {"availableNow": True}
        clear_unfinished_writes(spark, pipeline)
        raw = read_kafka(spark, pipeline, source_options(backfill, pipeline.kafka.spark_options()))
        raw = raw.filter(in_range(backfill))
    check_split(spark, pipeline)
    check_schema(spark, pipeline)
    return (
        parse(raw, pipeline)
        .writeStream.queryName(pipeline.name if backfill is None else f"{pipeline.name}-backfill-{backfill.id}")
        .option("checkpointLocation", pipeline.checkpoint_path)
        .foreachBatch(BatchWriter(spark, pipeline, backfill, stop, until, counts))
        .trigger(**trigger)
        .start()
    )


def run_until_stopped(
    query: StreamingQuery,
    stop: threading.Event,
    poll: int = 1,
    reporter: StatusReporter | None = None,
    events: EventLog | None = None,
    spark: SparkSession | None = None,
) -> None:
    """Wait for the query to end. On a stop request, an idle query is stopped at once; a
    running batch finishes and commits, and the next one declines to start (see BatchWriter)."""
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


# SPARK-57438 (Spark 4.1.x): after a restart, the first batch replayed from the offset log
# is written and committed, then progress reporting fails with this NPE in
# KafkaMicroBatchStream.metrics. Starting the query again from the same checkpoint is safe
# (the batch is in the commit log) and the next batch plans normally.
_SPARK_57438 = 'Cannot invoke "scala.collection.IterableOps.map(scala.Function1)" because the return value of "scala.Option.get()" is null'
MAX_NPE_RESTARTS = 3


def run(
    spark: SparkSession,
    pipeline: Pipeline,
    available_now: bool = False,
    stop: threading.Event | None = None,
    backfill: BackfillPlan | None = None,
    reporter: StatusReporter | None = None,
) -> Exception | None:
    """Run the pipeline's query until it ends or is stopped; return its error, if any."""
    stop = stop or threading.Event()
    events = EventLog(pipeline.name, pipeline.name)
    if backfill is None:
        events.flush(spark, force=True)  # rows a crash left in the spool
        spark.streams.addListener(events)
        if reporter is not None:
            reporter.counts = events.counts
    try:
        return _run(spark, pipeline, available_now, stop, backfill, reporter, events)
    finally:
        if backfill is None:
            spark.streams.removeListener(events)
            events.flush(spark, force=True)


def _run(
    spark: SparkSession,
    pipeline: Pipeline,
    available_now: bool,
    stop: threading.Event,
    backfill: BackfillPlan | None,
    reporter: StatusReporter | None,
    events: EventLog,
) -> Exception | None:
    error: Exception | None = None
    if backfill is None and not pipeline.derived:
        error = replay_planned_batch(spark, pipeline, reporter, events)
        if error is not None:
            if reporter is not None:
                reporter.failed(spark, pipeline.checkpoint_path, str(error))
            return error
    restarts = 0
    while True:
        if pipeline.derived:
            query = derive.start(spark, pipeline, events, available_now=available_now, stop=stop)
        else:
            counts = events.counts if backfill is None else None
            query = start(spark, pipeline, available_now=available_now, backfill=backfill, stop=stop, counts=counts)
        if restarts == 0:
            log.info(
                "%s: started query %s (%s sink, checkpoint %s)",
                pipeline.name,
                query.id,
                pipeline.spec.sink.format,
                (for_backfill(pipeline, backfill) if backfill else pipeline).checkpoint_path,
            )
        run_until_stopped(query, stop, reporter=reporter, events=events if backfill is None else None, spark=spark)
        if backfill is None and query.lastProgress:
            events.wait_for(int(query.lastProgress["batchId"]))
        log.info("%s: run summary %s", pipeline.name, json.dumps(run_summary(query.recentProgress, events.counts)))
        error = query.exception()
        if error is not None and pipeline.derived:
            error = derive.upstream_changed(pipeline, error) or error
        if error is not None and STOP_MARKER in str(error):
            log.info("stopping %s after its last committed batch", query.name)
            error = None
        if error is None or _SPARK_57438 not in str(error) or restarts == MAX_NPE_RESTARTS:
            if reporter is not None and error is not None:
                reporter.failed(spark, pipeline.checkpoint_path, str(error), query)
            elif reporter is not None:
                reporter.report("finished" if available_now and not stop.is_set() else "stopped", query)
            return error
        restarts += 1
        log.warning("%s: restarting from the checkpoint after SPARK-57438 (replayed batch committed)", pipeline.name)
        if backfill is None:
            record_replayed(spark, pipeline, events, query)


def replay_planned_batch(
    spark: SparkSession, pipeline: Pipeline, reporter: StatusReporter | None, events: EventLog
) -> Exception | None:
    """Replay a batch a crash interrupted under the spec it was planned with, when the spec
    has changed since (a new schema version, other rules): it ends after that batch, so the
    batches after it are planned under this spec. Its error, if any."""
    found = planned_under(spark, pipeline)
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
    query = start(spark, previous, available_now=True, stop=done, until=batch, counts=events.counts)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ingest.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="pipeline spec file (or a pipeline name)")
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then stop")
    parser.add_argument("--processing-time", help="micro-batch interval instead of the spec's, e.g. '30 seconds'")
    parser.add_argument("--backfill", help="a backfill plan as JSON (see sluice.records.backfill.BackfillPlan)")
    parser.add_argument(
        "--rebuild", action="store_true", help="a derived pipeline: delete its checkpoint and tables first"
    )
    args = parser.parse_args(argv)
    configure_logging()

    try:
        pipeline = load_pipeline(args.spec)
        if args.processing_time:
            trigger = Trigger(processing_time=args.processing_time)
            pipeline = dataclasses.replace(pipeline, spec=pipeline.spec.model_copy(update={"trigger": trigger}))
    except (SpecError, ValueError) as exc:
        log.error("invalid spec: %s", exc)
        return 2

    backfill = None
    if args.backfill:
        try:
            backfill = BackfillPlan.from_json(args.backfill)
        except ValueError as exc:
            log.error("invalid backfill: %s", exc)
            return 2
    claims = locks.claims_for(pipeline, backfill.id if backfill else None)
    try:
        # The lease the launcher took for this run is adopted (same owner); a run started by hand takes its own.
        lease = locks.take(pipeline.name, claims, os.environ.get(locks.OWNER_ENV))
    except locks.Claimed as exc:
        log.error("%s", exc)
        return 4
    try:
        return drive(pipeline, backfill, args.available_now, args.processing_time, args.rebuild, lease)
    finally:
        locks.release(lease)


def drive(
    pipeline: Pipeline,
    backfill: BackfillPlan | None,
    available_now: bool,
    processing_time: str | None,
    rebuild: bool = False,
    lease: locks.Lease | None = None,
) -> int:
    """Run the stream (or backfill) until it ends or SIGTERM/Ctrl-C stops it; the exit code.

    The lease is renewed beside it (:class:`~sluice.records.locks.Keeper`): a stop asked for on
    any host, or the lease lost, stops the stream like SIGTERM does, and a lost lease also
    keeps its writers from writing again (:mod:`jobs.fence`)."""
    stop = stop_on_signals(log)
    if lease is not None:
        fence.keeper = locks.Keeper(lease, stop, None if backfill else stop_requested(lease)).start()
    try:
        return _drive(pipeline, backfill, available_now, processing_time, rebuild, stop)
    finally:
        if fence.keeper is not None:
            fence.keeper.close()


def lost_lease(error: Exception | None) -> str | None:
    """Why this run ends with :data:`LEASE_LOST`, if it does: another driver runs this checkpoint
    now, and this one wrote nothing since. Whether the loss failed a batch (``error``) or was
    seen between batches, where it stops the query as cleanly as a stop request does, the
    supervisor is told the same."""
    return fence.verify() if error is not None else fence.lost()


def stop_requested(lease: locks.Lease) -> Callable[[], bool]:
    """Has a stop of this run been asked for, on any host (``sluice stop``, action=stop)?"""

    def asked() -> bool:
        driver = Driver.read(lease.holder.pipeline)
        return driver is not None and driver.owner == lease.holder.owner and driver.desired == "stopped"

    return asked


def _drive(
    pipeline: Pipeline,
    backfill: BackfillPlan | None,
    available_now: bool,
    processing_time: str | None,
    rebuild: bool,
    stop: threading.Event,
) -> int:
    spark = SparkSession.builder.appName(f"sluice-{pipeline.name}").getOrCreate()
    if fence.keeper is not None:
        fence.keeper.app_id = spark.sparkContext.applicationId
    if rebuild and (not pipeline.derived or pipeline.upstream is None or backfill is not None):
        log.error("%s: only a pipeline that reads another pipeline's table is rebuilt", pipeline.name)
        return 2
    reporter = StatusReporter(spark, pipeline.name) if backfill is None else None
    if reporter is not None:
        reporter.report("starting")
    try:
        if rebuild:
            derive.rebuild(spark, pipeline)
        if pipeline.derived and backfill is not None:
            raise BackfillRefused(
                f"{pipeline.name} keeps event-time state: a backfill beside the stream would build its own "
                "windows and sessions from part of the data; rebuild it from a new checkpoint and sink.path instead"
            )
        if pipeline.spec.mode == "continuous":
            if backfill or available_now or processing_time:
                raise ContinuousError(
                    "mode", f"{pipeline.name} is a continuous branch: no backfill or micro-batch trigger"
                )
            error = continuous.run(spark, pipeline, stop, reporter)
        else:
            error = run(spark, pipeline, available_now, stop, backfill, reporter)
    except (
        CheckpointMismatch,
        ContinuousError,
        compatibility.IncompatibleTable,
        BackfillRefused,
        derive.UpstreamMissing,
        derive.IncompatibleState,
    ) as exc:
        if reporter is not None:
            reporter.failed(spark, pipeline.checkpoint_path, str(exc))
        log.error("%s", exc)
        return 3
    except Exception as exc:  # anything else: said in one line, and counted, as a failed query is
        if fence.verify() is None:
            if reporter is not None:
                reporter.failed(spark, pipeline.checkpoint_path, str(exc))
            log.exception("%s failed: %s", pipeline.name, root_cause(str(exc)))
            return 1
        error = exc
    lost = lost_lease(error)
    if lost is not None:
        log.error("%s", lost)
        return LEASE_LOST
    if error is not None:
        # The whole trace is in this log already, where Spark reported the query's end.
        log.error("%s failed: %s", pipeline.name, root_cause(str(error)))
        return 1
    log.info("%s: stopped cleanly", pipeline.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
