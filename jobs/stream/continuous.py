"""The continuous branch: Kafka in, parse and rules per record, Kafka out, in milliseconds.

Spark's continuous processing (``trigger(continuous=...)``) keeps one long-running task
per Kafka partition that reads, transforms and writes each record as it arrives, and
records offsets every ``continuous.checkpoint_interval``. With ``continuous.engine:
real_time``, Spark 4.1's Real-Time Mode does the same inside long-running micro-batches
(one per checkpoint interval), with lower and steadier latency. Only map-like operations are
allowed (see :mod:`sluice.spec.continuous`, checked when the spec loads). Delivery is at least
once: after a crash, records since the last checkpoint epoch are processed again.

Each good event becomes a verdict on ``sink.topic``::

    {"payment_id": "...", ..., "event_time": "...",
     "source": {"topic": "payments", "partition": 0, "offset": 42, "timestamp": "..."},
     "flagged": true, "rules": ["large_amount"]}

and each record that cannot be parsed goes to the quarantine topic with its reason, in the
same query (the Kafka sink routes rows by their ``topic`` column), so nothing is dropped.
"""

from __future__ import annotations

import logging
import threading

from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from jobs.stream.parse import KEY, REASON, parse, read_kafka
from jobs.stream.status import StatusReporter
from jobs.tables import hadoopfs
from sluice.spec import Continuous, Pipeline, flatten
from sluice.spec import quarantine as q
from sluice.spec.continuous import ENGINES, ContinuousError, check_slots, explain_spark_error, source_options
from sluice.topics import create_topics, total_partitions

log = logging.getLogger("sluice.continuous")

#: Latency over batching: send each record at once (the Kafka producer's own default differs by version).
SINK_OPTIONS = {"kafka.linger.ms": "0", "kafka.acks": "all"}


def _rules_fired(rules: dict[str, str]) -> Column:
    if not rules:
        return F.array().cast("array<string>")
    fired = [F.when(F.coalesce(F.expr(expr), F.lit(False)), F.lit(name)) for name, expr in rules.items()]
    return F.filter(F.array(*fired), lambda r: r.isNotNull())


def verdicts(parsed: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Parsed records as Kafka rows (topic, key, value): verdicts and quarantined records."""
    c = pipeline.spec.continuous or Continuous()
    plan = pipeline.plan
    lineage = [flatten.KAFKA_TOPIC, flatten.KAFKA_PARTITION, flatten.KAFKA_OFFSET, flatten.KAFKA_TIMESTAMP]
    flat = parsed.select(
        REASON,
        KEY,
        q.VALUE,
        *[F.expr(col.expr).alias(col.name) for col in plan.columns],
        F.col("topic").alias(flatten.KAFKA_TOPIC),
        F.col("partition").alias(flatten.KAFKA_PARTITION),
        F.col("offset").alias(flatten.KAFKA_OFFSET),
        F.col("timestamp").alias(flatten.KAFKA_TIMESTAMP),
        F.col(q.EVENT_TS).alias(flatten.EVENT_TIME),
    ).withColumn("rules", _rules_fired(c.rules))
    flat = flat.withColumn("flagged", F.size("rules") > 0)

    good = F.col(REASON).isNull()
    keep = good
    if c.filter:
        keep = keep & F.coalesce(F.expr(c.filter), F.lit(False))
    if c.emit == "flagged":
        keep = keep & F.col("flagged")
    columns = c.columns or [col.name for col in plan.columns]
    # Lineage as a `source` struct: a landing pipeline flattens it to source_topic, ... without
    # colliding with the _kafka_* columns it adds itself.
    source = F.struct(*[F.col(c).alias(c.removeprefix("_kafka_")) for c in lineage]).alias("source")
    event_time = F.col(flatten.EVENT_TIME).alias("event_time")
    verdict = F.to_json(F.struct(*columns, event_time, source, "flagged", "rules"))
    rejected = F.to_json(F.struct(F.expr(q.raw_text_sql()).alias("raw_text"), F.col(REASON).alias("reason"), source))
    key = F.col(c.key).cast("string") if c.key else F.col(KEY).cast("string")
    return flat.filter(keep | ~good).select(
        F.when(good, F.lit(pipeline.spec.sink.topic)).otherwise(F.lit(pipeline.quarantine_topic)).alias("topic"),
        F.when(good, key).otherwise(F.col(KEY).cast("string")).alias("key"),
        F.when(good, verdict).otherwise(rejected).alias("value"),
    )


def start(spark: SparkSession, pipeline: Pipeline) -> StreamingQuery:
    """Check the task slots, then start the continuous query; Spark's refusals become Sluice's message."""
    src = pipeline.kafka
    partitions = total_partitions(src.bootstrap_servers, src.topics or [])
    check_slots(pipeline.name, partitions, spark.sparkContext.defaultParallelism)
    # The Kafka sink does not create topics, and brokers should not auto-create them.
    for made in create_topics(
        pipeline.sink_bootstrap, [str(pipeline.spec.sink.topic), pipeline.quarantine_topic], partitions
    ):
        if made.created:
            log.info("%s: created topic %s with %d partitions", pipeline.name, made.name, made.partitions)
    c = pipeline.spec.continuous or Continuous()
    check_engine(spark, pipeline, c.engine)
    raw = read_kafka(spark, pipeline, source_options(pipeline.kafka.spark_options()))
    try:
        writer = (
            verdicts(parse(raw, pipeline), pipeline)
            .writeStream.queryName(pipeline.name)
            .format("kafka")
            .option("kafka.bootstrap.servers", pipeline.sink_bootstrap)
            .options(**SINK_OPTIONS)
            .option("checkpointLocation", pipeline.checkpoint_path)
        )
        if c.engine == "real_time":
            return real_time(spark, writer.outputMode("update"), c.interval).start()
        return writer.trigger(continuous=c.interval).start()
    except PySparkException as exc:
        explained = explain_spark_error(pipeline.name, str(exc))
        if explained:
            raise ContinuousError("plan", explained) from exc
        raise


#: Beside a branch's checkpoint: the engine that writes it (see check_engine).
ENGINE_FILE = "sluice_engine"


def check_engine(spark: SparkSession, pipeline: Pipeline, engine: str) -> None:
    """Refuse to start ``engine`` on a checkpoint the other engine wrote, and record it on a new one.

    Real-Time Mode cannot go on from a continuous-processing checkpoint: Spark 4.1 fails at
    once with a NullPointerException (its watermark tracker is not set up), and the records
    would wait. A checkpoint without offsets takes the engine of the run starting on it; one
    with offsets and no record of its engine predates the choice, when every branch ran
    continuous processing."""
    cp = pipeline.checkpoint_path.rstrip("/")
    if not hadoopfs.has_children(spark, f"{cp}/offsets"):
        hadoopfs.write_text(spark, f"{cp}/{ENGINE_FILE}", engine)  # nothing to go on from yet
        return
    names = hadoopfs.list_names(spark, cp)
    recorded = hadoopfs.read_text(spark, f"{cp}/{ENGINE_FILE}").strip() if ENGINE_FILE in names else "continuous"
    if recorded != engine:
        raise ContinuousError(
            "continuous.engine",
            f"{pipeline.name}: its checkpoint {cp} was written by {ENGINES.get(recorded, recorded)}, which "
            f"{ENGINES[engine]} cannot go on from; set continuous.engine back to {recorded}, or give the "
            f"branch a new checkpoint (it then starts from source.starting_offsets)",
        )


def real_time(spark: SparkSession, writer: DataStreamWriter, interval: str) -> DataStreamWriter:
    """``writer`` with Spark's Real-Time Mode trigger, batches of ``interval``.

    PySpark 4.1 has no argument for it (``trigger(realTime=...)`` arrives in 4.2, SPARK-54660),
    so the JVM's public ``Trigger.RealTime`` is set on PySpark's private ``_jwrite``, as 4.2's
    own ``trigger`` does. A private use; tests/unit/test_private_pyspark.py fails once
    PySpark has the argument, or no longer has ``_jwrite``."""
    jvm = spark._jvm
    assert jvm is not None
    writer._jwrite = writer._jwrite.trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(interval))
    return writer


def run(
    spark: SparkSession, pipeline: Pipeline, stop: threading.Event, reporter: StatusReporter | None = None
) -> Exception | None:
    """Run the branch until it fails or a stop is requested; return its error, if any.

    There is no batch boundary to wait for: offsets are recorded per epoch, and the records
    after the last epoch are read again on restart (at least once).
    """
    query = start(spark, pipeline)
    log.info("%s: continuous query %s started (checkpoint %s)", pipeline.name, query.id, pipeline.checkpoint_path)
    while query.isActive and not stop.is_set():
        if reporter is not None:
            reporter.report("running", query)  # lastProgress stays None in continuous mode: this is the heartbeat
        try:
            query.awaitTermination(1)
        except StreamingQueryException:
            break
    if query.isActive:
        log.info("stopping %s", pipeline.name)
        query.stop()
    error = query.exception()
    if reporter is not None and error is not None:
        reporter.failed(spark, pipeline.checkpoint_path, str(error), query)
    elif reporter is not None:
        reporter.report("stopped", query)
    return error
