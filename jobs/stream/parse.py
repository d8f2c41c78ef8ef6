"""Kafka records to parsed events: the stages before a batch is split and written.

A record is read once in the JVM (:mod:`jobs.stream.one_pass`) when it can be read exactly; any
other, the reference: ``value`` is cast to a string and parsed with ``from_json`` against
the pipeline's schema plus a corrupt-record column, and once more as a VARIANT for the fields
the schema does not declare (:mod:`sluice.spec.rescue`). The event time is derived and every
record gets its quarantine reason (NULL when it is good). Nothing is filtered here: each record
read from Kafka reaches the batch writer, which sends it to one table or the other.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.stream import one_pass
from sluice.spec import Pipeline, eventtime, flatten, rescue, strict
from sluice.spec import quarantine as q
from sluice.spec.columns import KEY, REASON, RESCUED, RESCUED_MAP, VARIANT
from sluice.spec.flatten import PARSED, quote


def read_kafka(spark: SparkSession, pipeline: Pipeline, options: dict[str, str] | None = None) -> DataFrame:
    """The pipeline's Kafka source; ``options`` replace the spec's (a backfill narrows them)."""
    return spark.readStream.format("kafka").options(**(options or pipeline.kafka.spark_options())).load()


def parse_schema(pipeline: Pipeline) -> StructType:
    """The event schema plus the column ``from_json`` fills when a record does not fit."""
    schema = json.loads(pipeline.schema.to_spark_json())
    schema["fields"].append({"name": q.CORRUPT, "type": "string", "nullable": True, "metadata": {}})
    return StructType.fromJson(schema)


def parse(raw: DataFrame, pipeline: Pipeline, one_pass_first: bool = True) -> DataFrame:
    """Each record parsed, with its event time, its rescued fields and its quarantine reason.

    A record :mod:`jobs.stream.one_pass` reads exactly takes that one read: its row, its rescued
    fields, and a reason that only its event time can give. Every other record takes the
    reference parse below, which holds the one pass to account
    (``tests/integration/test_one_pass.py``); ``one_pass_first=False`` sends every record there.
    """
    et = pipeline.event_time
    event_field = pipeline.schema.find(et.field)
    assert event_field is not None  # checked when the spec was loaded
    event_expr = q.parsed_sql(et.field)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": q.CORRUPT}
    checks = strict.checks(pipeline.schema, et.field, pipeline.spec.coerce)
    rescued = set(pipeline.rescue_fields)
    fast = one_pass_first and one_pass.register(raw.sparkSession, pipeline)
    read = one_pass.read(q.VALUE, pipeline) if fast else F.lit(None).cast(one_pass.result_type(pipeline))
    claimed = F.col(one_pass.COLUMN).isNotNull()
    parsed = (
        raw.select(
            F.col("key").alias(KEY),
            F.col("value").alias(q.VALUE),
            F.col("value").cast("string").alias(q.JSON),
            "topic",
            "partition",
            "offset",
            "timestamp",
        )
        .withColumn(one_pass.COLUMN, read)
        .withColumn(
            PARSED,
            F.when(
                claimed, F.col(f"{one_pass.COLUMN}.data").withField(q.CORRUPT, F.lit(None).cast("string"))
            ).otherwise(F.from_json(q.JSON, parse_schema(pipeline), options)),
        )
        .withColumn(VARIANT, F.when(~claimed, F.expr(f"try_parse_json({q.JSON})")))
    )
    # A field marked rescue whose value from_json changed is emptied, so that rescued data
    # keeps it as it came (rescue.mismatch_sql), as when from_json could not read it at all.
    for dotted, check in checks:
        if dotted in rescued:
            kept = F.when(claimed | F.expr(check).isNull(), F.col(q.parsed_sql(dotted)))
            parsed = parsed.withColumn(PARSED, F.col(PARSED).withField(dotted, kept))
    inexact = strict.items_sql([(d, c) for d, c in checks if d not in rescued])
    reason = q.reason_sql(
        pipeline.schema, et.field, et.format, pipeline.accepted_times, pipeline.rescue_fields, inexact
    )
    return (
        parsed.withColumn(q.EVENT_TS, F.expr(eventtime.event_time_sql(event_expr, et.format, event_field.type)))
        .withColumn(
            REASON,
            F.when(claimed, F.expr(q.event_time_reason_sql(et.field, et.format, pipeline.accepted_times))).otherwise(
                F.expr(reason)
            ),
        )
        .withColumn(
            RESCUED_MAP,
            F.when(claimed, F.expr(one_pass.rescued_map(f"{one_pass.COLUMN}.rescued"))).otherwise(
                F.expr(rescue.rescued_sql(pipeline.schema, pipeline.rescue_fields))
            ),
        )
        .drop(one_pass.COLUMN)
    )


def for_split(batch: DataFrame, keep_raw: Column | None = None) -> DataFrame:
    """The checked batch as it is kept in memory between the writer's passes.

    A good record is written from its parsed form, a rejected one from its raw bytes, so
    each row keeps only the one it needs (and ``keep_raw`` rows both: a ``fail`` rule quotes
    the raw record). The value's text and VARIANT copies are dropped: the quarantine decodes
    the bytes. Caching the whole row kept every record three times over.
    """
    rejected = F.col(REASON).isNotNull()
    raw = rejected if keep_raw is None else rejected | keep_raw
    return batch.select(
        *[F.col(quote(c)) for c in batch.columns if c not in (KEY, q.VALUE, q.JSON, PARSED, VARIANT, RESCUED_MAP)],
        F.when(raw, F.col(KEY)).alias(KEY),
        F.when(raw, F.col(q.VALUE)).alias(q.VALUE),
        F.when(~rejected, F.col(PARSED)).alias(PARSED),
        F.when(~rejected, F.col(RESCUED_MAP)).alias(RESCUED_MAP),
    )


def _lineage() -> list[Column]:
    return [
        F.col("topic").alias(flatten.KAFKA_TOPIC),
        F.col("partition").alias(flatten.KAFKA_PARTITION),
        F.col("offset").alias(flatten.KAFKA_OFFSET),
        F.col("timestamp").alias(flatten.KAFKA_TIMESTAMP),
    ]


def flat_rows(good: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Good records as flat output rows (exploding arrays the spec names)."""
    plan = pipeline.plan
    for ex in plan.explodes:
        good = good.select("*", F.expr(f"explode_outer({ex.expr})").alias(ex.alias))
    dp = pipeline.spec.date_partition
    return good.select(
        # A field's COMMENT in the schema becomes the column's comment (Delta keeps it when
        # it creates the table; an existing table keeps the comments it has).
        *[F.expr(c.expr).alias(c.name, metadata={"comment": c.comment} if c.comment else None) for c in plan.columns],
        *_lineage(),
        F.col(q.EVENT_TS).alias(flatten.EVENT_TIME),
        F.expr(eventtime.NOW_SQL).alias(flatten.INGESTED_AT),
        F.expr(rescued_json()).alias(RESCUED),
        F.expr(eventtime.date_sql(q.EVENT_TS, dp.timezone)).alias(dp.column),
    )


def rescued_json() -> str:
    """The ``_rescued`` column: the rescued fields as one JSON object, NULL when there are none."""
    return f"CASE WHEN size({RESCUED_MAP}) > 0 THEN to_json({RESCUED_MAP}) END"


def rescued_paths(good: DataFrame, top: int) -> dict[str, int]:
    """How many records rescued each path (indexes removed), the ``top`` most common first."""
    rows = (
        good.filter(F.size(RESCUED_MAP) > 0)
        .select(F.explode(F.map_keys(RESCUED_MAP)).alias("path"))
        .groupBy(F.regexp_replace("path", rescue.INDEX, "[]").alias("path"))
        .count()
        .orderBy(F.desc("count"), "path")
        .limit(top)
        .collect()
    )
    return {r["path"]: r["count"] for r in rows}


def quarantine_rows(bad: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Rejected records as they came, with their Kafka coordinates and the reason.

    They are partitioned by the date they were ingested: their event time may be the
    very thing that is wrong.
    """
    return bad.select(
        F.col(KEY).alias("raw_key"),
        F.col(q.VALUE).alias("raw_value"),
        F.expr(q.raw_text_sql()).alias("raw_text"),
        *_lineage(),
        F.col(REASON).alias("reason"),
        *ingestion_stamp(pipeline),
    )


def ingestion_stamp(pipeline: Pipeline) -> list[Column]:
    """A quarantine row's last two columns, the same wherever it is rejected: when it was
    ingested, and the date partition of that moment."""
    dp = pipeline.spec.date_partition
    return [
        F.expr(eventtime.NOW_SQL).alias(flatten.INGESTED_AT),
        F.expr(eventtime.date_sql(eventtime.NOW_SQL, dp.timezone)).alias(dp.column),
    ]
