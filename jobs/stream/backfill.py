"""Backfill: re-read a bounded range of Kafka offsets into the pipeline's own tables.

A backfill is an available-now query with its own checkpoint (so the live stream's
checkpoint is never touched), reading exactly the assigned partitions from the range's
start offsets. Before it starts, the range is clipped to what the live stream has
committed (see :mod:`sluice.ops.backfill` for the rule); records past the range's end are
filtered out before anything counts them. Each batch then drops the records the tables
already hold, matched on (``_kafka_topic``, ``_kafka_partition``, ``_kafka_offset``), so a
backfill over data the stream has written, or a second run of the same backfill, adds no
duplicates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.stream.batches import last_committed
from jobs.tables import hadoopfs
from jobs.tables.readers import read_table
from jobs.tables.sinks import TableSink
from sluice.records.backfill import BackfillPlan, describe, refused_all, size
from sluice.records.checkpoint import parse_offsets
from sluice.spec import Pipeline

log = logging.getLogger("sluice.backfill")


#: Options that say where to read: the plan says it instead. Spark prefers the timestamp ones
#: to ``startingOffsets``, so a spec's ``startingTimestamp`` would move a backfill's start.
_WHERE_TO_READ = (
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
)


def source_options(plan: BackfillPlan, options: dict[str, str]) -> dict[str, str]:
    """The stream's Kafka options, narrowed to exactly the plan's partitions and start."""
    opts = {k: v for k, v in options.items() if k not in _WHERE_TO_READ}
    opts["assign"] = json.dumps({t: sorted(parts) for t, parts in plan.ranges.items()})
    opts["startingOffsets"] = json.dumps(
        {t: {str(p): r[0] for p, r in parts.items()} for t, parts in plan.ranges.items()}
    )
    return opts


def in_range(plan: BackfillPlan) -> Column:
    conds = [
        (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < end)
        for t, parts in plan.ranges.items()
        for p, (_, end) in parts.items()
    ]
    return reduce(lambda a, b: a | b, conds, F.lit(False))


class BackfillRefused(ValueError):
    """Nothing of the range is left once the live stream's part is refused."""


def stream_committed(spark: SparkSession, checkpoint: str) -> dict[str, dict[int, int]]:
    """The live stream's committed end offsets, read through Hadoop (any filesystem)."""
    last = last_committed(spark, checkpoint)
    if last is None:
        return {}
    return parse_offsets(hadoopfs.read_text(spark, f"{checkpoint}/offsets/{last}"))


def clip_to_stream(spark: SparkSession, pipeline: Pipeline, backfill: BackfillPlan) -> BackfillPlan:
    """The backfill, clipped to what the live stream has committed now (the plan clipped it
    already when the checkpoint was on its machine; the stream only moves forward since)."""
    committed = stream_committed(spark, pipeline.checkpoint_path)
    clipped = backfill.clip(committed)
    if size(clipped.refused) > size(backfill.refused):
        log.warning(
            "%s backfill %s: refused %s, which the stream has not committed yet",
            pipeline.name,
            backfill.id,
            describe(clipped.refused),
        )
    if not size(clipped.ranges):
        raise BackfillRefused(refused_all(pipeline, f"backfill {backfill.id}", committed))
    return clipped


KEYS = ("_kafka_topic", "_kafka_partition", "_kafka_offset")


def drop_present(spark: SparkSession, batch: DataFrame, tables: Sequence[TableSink]) -> DataFrame:
    """The batch without the records already in any of ``tables``."""
    spans = batch.groupBy("topic", "partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi")).collect()
    if not spans:
        return batch
    window = reduce(
        lambda a, b: a | b,
        [
            (F.col(KEYS[0]) == s["topic"])
            & (F.col(KEYS[1]) == s["partition"])
            & F.col(KEYS[2]).between(s["lo"], s["hi"])
            for s in spans
        ],
    )
    for table in tables:
        present = read_table(spark, table.format.name, table.path).filter(window).select(*KEYS).distinct()
        batch = batch.join(
            present.withColumnsRenamed(dict(zip(KEYS, ("topic", "partition", "offset"), strict=True))),
            on=["topic", "partition", "offset"],
            how="left_anti",
        )
    return batch
