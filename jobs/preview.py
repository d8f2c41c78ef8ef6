"""A sample of records through the pipeline's own stages, written nowhere (``sluice preview``).

The sample becomes a DataFrame shaped as Spark's Kafka source delivers records, and goes
through the same functions as a micro-batch: :func:`jobs.stream.parse.parse`, the row rules
(:func:`jobs.stream.row_rules.check`), and the split into flat rows and quarantined records.
Nothing is written or committed; the result is plain Python
(:class:`sluice.records.preview.Preview`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from jobs.stream import row_rules
from jobs.stream.micro_batch import good
from jobs.stream.parse import flat_rows, parse, quarantine_rows, rescued_paths
from sluice.errors import SluiceError, first_line
from sluice.records.preview import Preview, RuleOutcome, Sampled
from sluice.spec import Pipeline, flatten
from sluice.spec.flatten import quote

#: The columns of Spark's Kafka source, as :func:`jobs.stream.parse.parse` reads them.
KAFKA_RECORD = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)

#: Most rescued paths listed.
TOP_RESCUED = 50


def rows_as_json(frame: Any) -> list[dict[str, Any]]:
    """Rows as Spark writes them in JSON: exact decimals, times in the session's time zone, nulls kept."""
    text = frame.select(F.to_json(F.struct(*[F.col(quote(c)) for c in frame.columns]), {"ignoreNullFields": "false"}))
    return [json.loads(r[0], parse_float=Decimal) for r in text.collect()]


def run(spark: SparkSession, pipeline: Pipeline, records: list[Sampled], source: str) -> Preview:
    raw = spark.createDataFrame(
        [
            (r.key, r.value, r.topic, r.partition, r.offset, datetime.fromtimestamp(r.timestamp_ms / 1000, UTC), 0)
            for r in records
        ],
        KAFKA_RECORD,
    )
    # Kept while it is read five ways: the sample is small, and parsing it once is enough.
    checked = row_rules.check(parse(raw, pipeline), pipeline).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _report(pipeline, checked, len(records), source)
    except (PySparkException, Py4JJavaError) as exc:  # a rule Spark cannot run, a JVM that went away
        raise SluiceError(f"{pipeline.name}: Spark could not run the preview: {first_line(exc)}") from None
    finally:
        checked.unpersist()


def _report(pipeline: Pipeline, checked: DataFrame, records_in: int, source: str) -> Preview:
    order = [flatten.KAFKA_TOPIC, flatten.KAFKA_PARTITION, flatten.KAFKA_OFFSET]
    kept = checked.filter(good())
    flat = flat_rows(kept, pipeline)
    rejected = quarantine_rows(checked.filter(~good()), pipeline)
    report = Preview(
        pipeline.name,
        source,
        records_in,
        rows=rows_as_json(flat.orderBy(*order)),
        quarantined=[r.asDict() for r in rejected.select(*order, "reason", "raw_text").orderBy(*order).collect()],
        rescued=rescued_paths(kept, TOP_RESCUED),
        columns=flat.columns,
    )
    counts = row_rules.count_columns(pipeline)
    if counts:
        totals = row_rules.read_counts(pipeline, checked.agg(*counts).collect())
        report.rules = [RuleOutcome(name, c.action, c.checked, c.failed) for name, c in totals.items()]
    return report
