"""Backfill: re-read a bounded range of Kafka offsets into the pipeline's own tables.

A backfill is an available-now query with its own checkpoint (so the live stream's
checkpoint is never touched), reading exactly the assigned partitions from the range's
start offsets. Records past the range's end are filtered out before anything counts
them. Each batch then drops the records the tables already hold, matched on
(``_kafka_topic``, ``_kafka_partition``, ``_kafka_offset``), so a backfill over data the
stream has written, or a second run of the same backfill, adds no duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.sinks import read_table


@dataclass(frozen=True)
class Backfill:
    id: str
    #: topic -> partition -> [first offset, end offset) ; every partition of each topic
    ranges: dict[str, dict[int, tuple[int, int]]]

    @classmethod
    def parse(cls, backfill_id: str, text: str) -> Backfill:
        raw = json.loads(text)
        ranges = {t: {int(p): (int(r[0]), int(r[1])) for p, r in parts.items()} for t, parts in raw.items()}
        for topic, parts in ranges.items():
            for p, (first, end) in parts.items():
                if first < 0 or end < first:
                    raise ValueError(f"backfill range {topic}/{p}: [{first}, {end}) is not a valid offset range")
        return cls(backfill_id, ranges)

    def source_options(self, options: dict[str, str]) -> dict[str, str]:
        """The stream's Kafka options, narrowed to exactly the range's partitions and start."""
        opts = {k: v for k, v in options.items() if k not in ("subscribe", "subscribePattern", "startingOffsets")}
        opts["assign"] = json.dumps({t: sorted(parts) for t, parts in self.ranges.items()})
        opts["startingOffsets"] = json.dumps(
            {t: {str(p): r[0] for p, r in parts.items()} for t, parts in self.ranges.items()}
        )
        return opts

    def in_range(self) -> Column:
        conds = [
            (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < end)
            for t, parts in self.ranges.items()
            for p, (_, end) in parts.items()
        ]
        return reduce(lambda a, b: a | b, conds, F.lit(False))

    @property
    def size(self) -> int:
        return sum(end - first for parts in self.ranges.values() for first, end in parts.values())


KEYS = ("_kafka_topic", "_kafka_partition", "_kafka_offset")


def drop_present(spark: SparkSession, batch: DataFrame, tables: Sequence[tuple[str, str]]) -> DataFrame:
    """The batch without the records already in any of ``tables`` (format, path)."""
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
    for fmt, path in tables:
        present = read_table(spark, fmt, path).filter(window).select(*KEYS).distinct()
        batch = batch.join(
            present.withColumnsRenamed(dict(zip(KEYS, ("topic", "partition", "offset"), strict=True))),
            on=["topic", "partition", "offset"],
            how="left_anti",
        )
    return batch
