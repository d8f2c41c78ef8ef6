"""The derived job: another pipeline's table (or Kafka) in, event-time work, a table out.

Run by ``jobs/ingest.py`` (:class:`jobs.stream.modes.Derived`) when the spec reads a table or declares
event-time work (``sluice run``, Airflow, the same spark-submit). The query is one stream with two branches
over the same micro-batch (three for Kafka: records that cannot be parsed are the third):

- the **operator** branch: the spec's filter, then Spark's own stateful operators
  (``dropDuplicatesWithinWatermark``, ``window``/``session_window`` aggregation, or
  ``transformWithStateInPandas`` for state), on the RocksDB state store;
- the **input** branch: every row read, unchanged.

``foreachBatch`` gets both. It writes the operator's rows to the table exactly once
(through the sink's own exactly-once write, as the ingest job does), and from the input rows it finds the
ones Spark's operator dropped as late, by Spark's own rule and the watermark Spark used
(:mod:`sluice.spec.derived`), and writes them to the quarantine with the reason. The audit
reconciles: rows in = rows accepted + rows late + rows filtered.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import threading
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StructField, StructType

from jobs.stream.batches import BatchFrame, check_checkpoint, clear_unfinished_writes
from jobs.stream.events import EventLog, WriterCounts
from jobs.stream.parse import REASON, flat_rows, ingestion_stamp, parse, quarantine_rows, read_kafka
from jobs.tables import hadoopfs
from jobs.tables.readers import table_reader
from jobs.tables.sinks import TableSink
from sluice.records import checkpoint
from sluice.records.audit import BatchAudit
from sluice.spec import Pipeline, eventtime
from sluice.spec.columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from sluice.spec.derived import (
    SESSION_END,
    SESSION_EVENTS,
    SESSION_START,
    STATE_FILE,
    WINDOW_END,
    WINDOW_START,
    Derivation,
    TableSource,
    incompatible_message,
    late_end_sql,
    late_reason_sql,
    signature_changes,
)
from sluice.spec.model import duration_ms
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.derive")

KIND, OUT, IN, BAD = "_sluice_kind", "_sluice_out", "_sluice_in", "_sluice_bad"
SESSION_TIME = "sluice_event_time"
CUSTOM_TIME = "event_time"
LATE, KEPT = "_sluice_late", "_sluice_kept"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class UpstreamMissing(RuntimeError):
    """The table a derived pipeline reads has no data yet."""


class IncompatibleState(RuntimeError):
    """The spec changed what the checkpoint's state is made of."""


class UpstreamChanged(RuntimeError):
    """The upstream table deleted or rewrote rows this pipeline has read (``on_upstream_change: fail``)."""


_CHANGED = re.compile(r"DELTA_SOURCE_TABLE_IGNORE_CHANGES\].*? at version (\d+)", re.S)


def upstream_changed(pipeline: Pipeline, error: BaseException) -> UpstreamChanged | None:
    """The query's error, said in the spec's words, when the upstream changed rows."""
    found = _CHANGED.search(str(error))
    if found is None or pipeline.upstream is None:
        return None
    name, up, version = pipeline.name, pipeline.upstream.name, found.group(1)
    return UpstreamChanged(
        " ".join(
            [
                f"{name}: the table of {up} deleted or rewrote rows at version {version} (a DELETE, UPDATE or",
                f"MERGE), and {name} has counted rows of that table already. Recompute it from {up}'s table as",
                f"it is now with `sluice rebuild {name}`, or set source.on_upstream_change: skip to ignore such",
                "commits (what they delete stays counted, what they rewrite is not read)",
            ]
        )
    )


def rebuild(spark: SparkSession, pipeline: Pipeline) -> None:
    """Forget what this derived pipeline computed (its checkpoint, table and quarantine) so
    that it starts again from the upstream table as it is now. Called under its claims."""
    for path in (pipeline.checkpoint_path, pipeline.sink_path, pipeline.quarantine_path):
        log.warning("%s: rebuilding: deleting %s", pipeline.name, path)
        hadoopfs.delete(spark, path)


# --- the query -------------------------------------------------------------------------------


def read_upstream(spark: SparkSession, pipeline: Pipeline) -> DataFrame:
    """The upstream table as a stream: Delta's source, or the file source over the Parquet
    table's log (which lists committed files only)."""
    up = pipeline.upstream
    assert up is not None
    table, path = table_reader(up.spec.sink.format), up.sink_path
    if not table.exists(spark, path):
        raise UpstreamMissing(
            f"{pipeline.name}: the table of {up.name} ({path}) has no data yet; start {up.name} first "
            "(supervision starts this pipeline once it has)"
        )
    source = pipeline.spec.source
    assert isinstance(source, TableSource)  # it has an upstream
    options = {"maxFilesPerTrigger": str(source.max_files_per_trigger)} if source.max_files_per_trigger else {}
    return table.read_stream(spark, path, options, skip_changes=source.on_upstream_change == "skip")


def operator(df: DataFrame, d: Derivation) -> DataFrame:
    """The spec's stateful work on the (watermarked, filtered) rows."""
    if d.deduplicate is not None:
        df = df.dropDuplicatesWithinWatermark(list(d.deduplicate.keys))
    w = d.window
    if w is not None:
        if w.type == "session":
            win = F.session_window(d.time, str(w.gap))
        elif w.type == "sliding":
            win = F.window(d.time, str(w.size), str(w.slide))
        else:
            win = F.window(d.time, str(w.size))
        aggs = [F.expr(sql).alias(name) for name, sql in d.aggregate.items()]
        grouped = df.groupBy(win.alias("_window"), *d.group_by).agg(*aggs)
        return grouped.select(
            F.col("_window.start").alias(WINDOW_START),
            F.col("_window.end").alias(WINDOW_END),
            *d.group_by,
            *d.aggregate,
        )
    if d.state is not None:
        s = d.state
        fields = {f.name: f for f in df.schema.fields}
        if s.kind == "session":
            from jobs.stream.keyed_sessions import Sessions

            key_fields = [StructField(k, fields[k].dataType, True) for k in s.keys]
            out_schema = StructType(
                [
                    *key_fields,
                    StructField(SESSION_START, fields[d.time].dataType, True),
                    StructField(SESSION_END, fields[d.time].dataType, True),
                    StructField(SESSION_EVENTS, LongType(), True),
                ]
            )
            processor: Any = Sessions(list(s.keys), SESSION_TIME, duration_ms(str(s.timeout)))
            # Only what the processor reads goes to Python (PySpark renames columns that start
            # with '_' on the way, so the time gets a plain name).
            slim = df.select(*[F.col(f"`{k}`") for k in s.keys], F.col(f"`{d.time}`").alias(SESSION_TIME))
            return slim.groupBy(*s.keys).transformWithStateInPandas(processor, out_schema, "append", "EventTime")
        module, _, name = str(s.processor).partition(":")
        processor = getattr(importlib.import_module(module), name)()
        processor.timeout_ms = duration_ms(str(s.timeout))  # the spec's state.timeout, for its timers
        # The processor sees the keys, the event time as `event_time`, and the upstream's own
        # columns (the _kafka_* and _event_time lineage stays behind).
        own = [c for c in df.columns if not c.startswith("_") and c not in s.keys and c != CUSTOM_TIME]
        slim = df.select(
            *[F.col(f"`{k}`") for k in s.keys], F.col(f"`{d.time}`").alias(CUSTOM_TIME), *[F.col(f"`{c}`") for c in own]
        )
        return slim.groupBy(*s.keys).transformWithStateInPandas(processor, str(s.output), "append", "EventTime")
    return df


def read_input(spark: SparkSession, pipeline: Pipeline) -> tuple[DataFrame, DataFrame | None]:
    """The rows to work on and, for a Kafka source, the records that cannot be parsed (as
    quarantine rows, with their reason)."""
    if pipeline.upstream is not None:
        return read_upstream(spark, pipeline), None
    parsed = parse(read_kafka(spark, pipeline), pipeline)
    good = flat_rows(parsed.filter(F.col(REASON).isNull()), pipeline)
    return good, quarantine_rows(parsed.filter(F.col(REASON).isNotNull()), pipeline)


def _struct(df: DataFrame) -> Column:
    return F.struct(*[F.col(f"`{c}`") for c in df.columns])


def build(spark: SparkSession, pipeline: Pipeline) -> DataFrame:
    """The branches as one stream of (kind, operator row, input row, rejected record)."""
    d = pipeline.derivation
    src, rejected = read_input(spark, pipeline)
    if d.stateful:
        src = src.withWatermark(d.time, str(d.watermark))
    kept = src.filter(F.expr(d.filter)) if d.filter else src
    out = operator(kept, d)
    branches = {OUT: out, IN: src} | ({BAD: rejected} if rejected is not None else {})
    types = {kind: StructType(df.schema.fields) for kind, df in branches.items()}
    both: DataFrame | None = None
    for kind, df in branches.items():
        row = df.select(
            F.lit(kind).alias(KIND),
            *[(_struct(df) if k == kind else F.lit(None).cast(t)).alias(k) for k, t in types.items()],
        )
        both = row if both is None else both.unionByName(row)
    assert both is not None
    return both


# --- one micro-batch -------------------------------------------------------------------------


def late_watermark(spark: SparkSession, pipeline: Pipeline, batch_id: int) -> int:
    """The watermark Spark's operators drop late rows by in this batch: the one recorded for
    the batch before it (0 for the first batch of a checkpoint)."""
    if batch_id == 0:
        return 0
    path = f"{pipeline.checkpoint_path.rstrip('/')}/offsets/{batch_id - 1}"
    return checkpoint.batch_watermark_ms(hadoopfs.read_text(spark, path))


class DerivedWriter(BatchFrame):
    """The ``foreachBatch`` function of a derived pipeline (see the module's doc)."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        events: EventLog,
        stop: threading.Event | None,
        fence: Fence = UNFENCED,
    ) -> None:
        super().__init__(spark, pipeline, stop, fence)
        self.events = events
        self.d = pipeline.derivation

    def write(self, batch: DataFrame, batch_id: int) -> BatchAudit:
        out_sink, quarantine = self.sinks()
        watermark = late_watermark(self.spark, self.pipeline, batch_id)
        batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            inputs = self._flag(batch.filter(F.col(KIND) == IN).select(f"{IN}.*"), watermark)
            row = inputs.agg(
                F.count(F.lit(1)).alias("n"),
                F.count_if(~F.col(KEPT)).alias("filtered"),
                F.count_if(F.col(LATE)).alias("late"),
            ).first()
            n, filtered, late = (int(row["n"]), int(row["filtered"]), int(row["late"])) if row else (0, 0, 0)
            out = self._output(batch.filter(F.col(KIND) == OUT).select(f"{OUT}.*"))
            rows_out = out.count()
            if rows_out:
                self._write(out_sink, out, batch_id)
            rejected = batch.filter(F.col(KIND) == BAD).select(f"{BAD}.*") if BAD in batch.columns else None
            bad = rejected.count() if rejected is not None else 0
            if late or bad:
                # One write per batch and table: the batch id is the write's transaction version.
                to_quarantine = self._quarantine(inputs.filter(F.col(LATE)), watermark)
                if rejected is not None and bad:
                    to_quarantine = to_quarantine.unionByName(rejected)
                quarantine.write(to_quarantine, batch_id)
        finally:
            batch.unpersist()
        audit = BatchAudit(self.pipeline.name, batch_id, n + bad, n - filtered - late, bad, rows_out)
        audit.records_late, audit.records_filtered, audit.watermark_ms = late, filtered, watermark
        return audit

    def written(self, audit: BatchAudit) -> None:
        a = audit
        self.events.counts[a.batch_id] = WriterCounts(a.records_in, a.records_late, a.records_filtered)
        log.info(
            "%s batch %d: %d rows in -> %d accepted, %d late, %d filtered; %d rows out in %.2fs",
            self.pipeline.name,
            a.batch_id,
            a.records_in - a.records_quarantined,  # records that could not be parsed are no rows
            a.records_out,
            a.records_late,
            a.records_filtered,
            a.rows_out,
            a.seconds,
        )

    def _flag(self, inputs: DataFrame, watermark: int) -> DataFrame:
        d = self.d
        kept: Column = F.coalesce(F.expr(d.filter), F.lit(False)) if d.filter else F.lit(True)
        late: Column = F.lit(False)
        if d.stateful and watermark > 0:
            late = kept & (
                F.expr(late_end_sql(d.time, d.late_window))
                <= F.expr(eventtime.per_batch(f"timestamp_millis({watermark})"))
            )
        return inputs.withColumn(KEPT, kept).withColumn(LATE, late)

    def _output(self, out: DataFrame) -> DataFrame:
        dp = self.pipeline.spec.date_partition
        source = self.d.date_source()
        day = eventtime.date_sql(f"`{source}`" if source else eventtime.NOW_SQL, dp.timezone)
        cols = [c for c in out.columns if c != dp.column]
        return out.select(*[F.col(f"`{c}`") for c in cols], F.expr(day).alias(dp.column))

    def _write(self, sink: TableSink, out: DataFrame, batch_id: int) -> None:
        if self.d.output_mode == "append" or not sink.has_commits():
            sink.write(out, batch_id)
            return
        # update (formats that merge only: the spec refuses it elsewhere): a window's row is
        # replaced as it changes.
        sink.merge(out, [WINDOW_START, WINDOW_END, *self.d.group_by])

    def _quarantine(self, late: DataFrame, watermark: int) -> DataFrame:
        data = [c for c in late.columns if c not in (KEPT, LATE)]
        text = F.to_json(F.struct(*[F.col(f"`{c}`") for c in data]))

        def lineage(name: str, type_: str) -> Column:
            return F.col(name) if name in data else F.lit(None).cast(type_)

        return late.select(
            F.lit(None).cast("binary").alias("raw_key"),
            F.encode(text, "UTF-8").alias("raw_value"),
            text.alias("raw_text"),
            lineage(KAFKA_TOPIC, "string").alias(KAFKA_TOPIC),
            lineage(KAFKA_PARTITION, "int").alias(KAFKA_PARTITION),
            lineage(KAFKA_OFFSET, "bigint").alias(KAFKA_OFFSET),
            lineage(KAFKA_TIMESTAMP, "timestamp").alias(KAFKA_TIMESTAMP),
            F.expr(late_reason_sql(self.d.time, self.d.late_window, watermark)).alias("reason"),
            *ingestion_stamp(self.pipeline),
        )


# --- start and run -----------------------------------------------------------------------------


def check_state(spark: SparkSession, pipeline: Pipeline) -> None:
    """Refuse a spec whose keys, windows, aggregates or state differ from the ones the
    checkpoint's state was built with; record them at the first start."""
    cp = pipeline.checkpoint_path.rstrip("/")
    now = pipeline.derivation.signature()
    record = f"{cp}/{STATE_FILE}"
    if STATE_FILE in hadoopfs.list_names(spark, cp) and hadoopfs.has_children(spark, f"{cp}/offsets"):
        before = json.loads(hadoopfs.read_text(spark, record))
        changed = signature_changes(before, now)
        if changed:
            raise IncompatibleState(incompatible_message(pipeline.name, changed, cp, pipeline.sink_path))
        return
    hadoopfs.write_text(spark, record, json.dumps(now, sort_keys=True))


def start(
    spark: SparkSession,
    pipeline: Pipeline,
    events: EventLog,
    available_now: bool = False,
    stop: threading.Event | None = None,
    fence: Fence = UNFENCED,
) -> StreamingQuery:
    clear_unfinished_writes(spark, pipeline)
    check_checkpoint(spark, pipeline)
    check_state(spark, pipeline)
    if pipeline.derivation.stateful:
        # Read once, at a checkpoint's first batch; a restart keeps the checkpoint's provider.
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    both = build(spark, pipeline)
    trigger = {"availableNow": True} if available_now else pipeline.spec.trigger.spark_kwargs()
    return (
        both.writeStream.queryName(pipeline.name)
        .outputMode(pipeline.derivation.output_mode)
        .option("checkpointLocation", pipeline.checkpoint_path)
        .foreachBatch(DerivedWriter(spark, pipeline, events, stop, fence))
        .trigger(**trigger)
        .start()
    )
