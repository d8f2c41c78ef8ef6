"""The micro-batch mode: Kafka JSON in, a date-partitioned table out, one batch at a time.

Per micro-batch (:class:`BatchWriter`): parse every record, write the good ones (flattened)
to the output table and the rest to the quarantine table with the reason, and record the
counts (records in = records out + records quarantined) in the audit log beside the
checkpoint. Both tables are written exactly once per batch, so a crash at any moment
followed by a restart from the same checkpoint neither loses nor repeats a record.
:func:`start` starts the stream's query, or a backfill's (:mod:`jobs.stream.backfill`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import uuid
from dataclasses import asdict
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jobs.stream import row_rules
from jobs.stream.backfill import clip_to_stream, drop_present, in_range, source_options
from jobs.stream.batches import (
    BatchFrame,
    CheckpointMismatch,
    check_checkpoint,
    clear_unfinished_writes,
    last_committed,
)
from jobs.stream.events import WriterCounts
from jobs.stream.parse import REASON, flat_rows, for_split, parse, quarantine_rows, read_kafka, rescued_paths
from jobs.tables import hadoopfs
from jobs.tables.readers import log_growth, table_shape
from sluice.records import checkpoint
from sluice.records.audit import BatchAudit
from sluice.records.backfill import BackfillPlan
from sluice.spec import Pipeline, compatibility
from sluice.spec.columns import RESCUED_MAP
from sluice.spec.loader import recorded, restore
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.ingest")

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


class BatchWriter(BatchFrame):
    """The ``foreachBatch`` function: split one batch between the two tables, in one pass
    when it can and the last batch was clean (:meth:`_write_once`, :func:`cached_next`), else
    from a copy kept in memory (:meth:`_write_cached`)."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        backfill: BackfillPlan | None = None,
        stop: threading.Event | None = None,
        until: int | None = None,
        counts: dict[int, WriterCounts] | None = None,
        fence: Fence = UNFENCED,
    ) -> None:
        super().__init__(spark, pipeline, stop, fence)
        self.backfill = backfill
        self.until = until  # set ``stop`` once this batch is written: a replay ends after it
        # Each batch's records in, for the event log and status: Spark counts a record each
        # time the batch is read, and a one-pass batch with records to quarantine is read twice.
        self.counts = counts
        self._schema_recorded = False
        self._written = False  # has this writer written a batch (the first may be one the tables have)
        self._cache_next = False  # is the next batch written from a copy in memory (see cached_next)

    def write(self, batch: DataFrame, batch_id: int) -> BatchAudit:
        if not self._schema_recorded:
            record_schema(self.spark, self.pipeline)
            self._schema_recorded = True
        checked = row_rules.check(batch, self.pipeline)
        partitions = self._partitions(batch_id)
        if partitions is not None:
            audit = self._write_once(checked, batch_id, partitions)
        else:
            audit = self._write_cached(checked, batch_id)
        self._written = True
        self._cache_next = cached_next(audit)
        return audit

    def written(self, audit: BatchAudit) -> None:
        batch_id = audit.batch_id
        if self.counts is not None:
            # A backfill's range holds the records it skipped as already written, too.
            self.counts[batch_id] = WriterCounts(audit.records_in + audit.records_already_present, 0, 0)
            self.counts.pop(batch_id - KEPT_COUNTS, None)
        if audit.records_rescued:
            log.warning(
                "%s batch %d: %d records have fields the schema does not declare, kept in _rescued: %s",
                self.pipeline.name,
                batch_id,
                audit.records_rescued,
                ", ".join(f"{path} ({n})" for path, n in audit.rescued_paths.items()),
            )
        log.info(
            "%s batch %d: %d records in -> %d out (%d rows), %d quarantined in %.2fs%s",
            self.pipeline.name,
            batch_id,
            audit.records_in,
            audit.records_out,
            audit.rows_out,
            audit.records_quarantined,
            audit.seconds,
            # A backfill skips what the tables hold, and says so beside Spark's own input count.
            f"; {audit.records_already_present} already in the tables, skipped"
            if audit.records_already_present
            else "",
        )
        if audit.expectations:
            log.info("%s batch %d expectations: %s", self.pipeline.name, batch_id, row_rules.summary(audit))
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
        read cannot find fewer records than the first: Kafka may have deleted some between.
        And a stream whose last batch had rejects or rescued fields keeps the next (:func:`cached_next`)."""
        if (
            not self._written
            or self._cache_next
            or self.backfill is not None
            or row_rules.fail_rule_failed(self.pipeline) is not None
            or not self.pipeline.kafka.fail_on_data_loss
        ):
            return None
        cp = self.pipeline.checkpoint_path.rstrip("/")
        ends = checkpoint.parse_offsets(hadoopfs.read_text(self.spark, f"{cp}/offsets/{batch_id}"))
        found = sorted((topic, part) for topic, parts in ends.items() for part in parts)
        return found if len(found) <= MAX_OBSERVED_PARTITIONS else None

    def _write_once(self, batch: DataFrame, batch_id: int, partitions: list[tuple[str, int]]) -> BatchAudit:
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
            self.fence.check()
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
        counts = row_rules.read_counts(self.pipeline, [metrics])
        audit.expectations = {name: asdict(c) for name, c in counts.items()}
        return audit

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

    def _write_cached(self, checked: DataFrame, batch_id: int) -> BatchAudit:
        """Count the batch, then write it, from a copy kept in memory between the passes."""
        out, quarantine = self.sinks()
        batch = for_split(checked, row_rules.fail_rule_failed(self.pipeline)).persist(StorageLevel.MEMORY_AND_DISK)
        present = 0
        try:
            if self.backfill is not None:
                tables = [s for s in (out, quarantine) if s.has_commits()]
                if tables:
                    kept = drop_present(self.spark, batch, tables).persist(StorageLevel.MEMORY_AND_DISK)
                    present = batch.count() - kept.count()
                    batch.unpersist()
                    batch = kept
            audit, counts = self._count(batch, batch_id)
            audit.records_already_present = present
            row_rules.enforce(batch, self.pipeline, batch_id, counts)
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
        return audit

    def _begin(self, batch_id: int) -> None:
        """Record that this batch begins writing its tables (see :func:`check_split`)."""
        cp = self.pipeline.checkpoint_path.rstrip("/")
        hadoopfs.write_text(self.spark, f"{cp}/{checkpoint.WRITING_FILE}", str(batch_id))

    def _count(self, batch: DataFrame, batch_id: int) -> tuple[BatchAudit, dict[str, row_rules.RuleCount]]:
        rows = (
            batch.groupBy("topic", "partition", good().alias("ok"))
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.min("offset").alias("first"),
                F.max("offset").alias("last"),
                F.count_if(F.size(RESCUED_MAP) > 0).alias("rescued"),
                *row_rules.count_columns(self.pipeline),
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
        counts = row_rules.read_counts(self.pipeline, rows)
        audit.expectations = {name: asdict(c) for name, c in counts.items()}
        return audit, counts


def cached_next(audit: BatchAudit) -> bool:
    """Is the batch after this one written from a copy in memory rather than in one pass?

    Yes when this one had records to quarantine or fields to rescue: a one-pass write reads
    its batch again for each, parsing every record two or three times where the copy parses
    it once. With 1 % rejects and 5 % rescued records, 200,000-record batches took 36 s in one
    pass and 19 s from the copy (``make bench-ablation``, docs/measured.md). A stream's batches
    are much alike, so the last one predicts the next; a clean stream keeps the one pass,
    which saves the copy."""
    return bool(audit.records_quarantined or audit.records_rescued)


def good() -> Column:
    """True for a record that goes to the output table (it has no quarantine reason)."""
    return F.col(REASON).isNull()


def observed(seen: Observation, timeout: float | None = None) -> dict[str, Any] | None:
    """The metrics a write observed, or None if they did not come: Spark delivers them once
    the write's query has run, on its listener bus, and a write the table skipped (the batch
    is in it already) runs no query. Observation.get would wait for ever, and so does the
    waiting thread then, blocked in the JVM until the driver exits: a one-pass write is
    skipped only when another driver wrote the batch, whose lease this one then lost, so
    that is one thread, once, in a driver about to stop (see Fence.check)."""
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
        *row_rules.count_columns(pipeline),
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
    fence: Fence = UNFENCED,
) -> StreamingQuery:
    """Start the pipeline's streaming query (or one backfill's) and return it; with ``until``,
    it sets ``stop`` once that batch is written; ``counts`` gets each batch's records in;
    ``fence`` is the driver's lease, which every batch checks."""
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
        .foreachBatch(BatchWriter(spark, pipeline, backfill, stop, until, counts, fence))
        .trigger(**trigger)
        .start()
    )
