"""A record read once: ``sluice.parse.OnePass``, the candidate for issue 44's one-pass parse.

The reference parse (:func:`jobs.stream.parse.parse`) reads each value twice (``from_json`` on a
string copy, then a VARIANT) and evaluates a check, the rescued map and the reason per field
in SQL: 5 to 6 s per 200,000 records on two cores, against 0.9 s for ``from_json`` alone
(``benchmarks/parse_cost.py``). ``OnePass`` (``jobs/java/sluice/parse``, built by ``make
setup`` into ``sluice-parse.jar``) streams the value's bytes once with Jackson and returns the
typed row and the undeclared fields' JSON text by path, or NULL for any record it cannot
read exactly as the reference would; those stay with the reference parse.

``tests/integration/test_one_pass.py`` holds it to the reference, record for record.
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructField, StructType

from sluice.spec import Pipeline
from sluice.spec.quarantine import lit
from sluice.spec.rescue import EMPTY

log = logging.getLogger(__name__)

#: The SQL function's name in a session (:func:`register`).
FUNCTION = "sluice_one_pass"
CLASS = "sluice.parse.OnePass"
#: The column :func:`jobs.stream.parse.parse` keeps the one pass's result in, until it is spent.
COLUMN = "__one_pass"


def schema(pipeline: Pipeline) -> StructType:
    return StructType.fromJson(json.loads(pipeline.schema.to_spark_json()))


def result_type(pipeline: Pipeline) -> StructType:
    return StructType(
        [StructField("data", schema(pipeline)), StructField("rescued", MapType(StringType(), StringType()))]
    )


def register(spark: SparkSession, pipeline: Pipeline) -> bool:
    """Make :data:`FUNCTION` callable for ``pipeline``'s schema; False, with a warning, when
    ``sluice-parse.jar`` is not in ``spark.jars`` (:func:`sluice.runtime.spark_jars`):
    every record then takes the reference parse."""
    try:
        spark.udf.registerJavaFunction(FUNCTION, CLASS, result_type(pipeline))
    except Exception as e:  # py4j's error for a class the JVM cannot load
        if "ClassNotFoundException" not in str(e) and "Can not load class" not in str(e):
            raise
        log.warning("%s is not on Spark's classpath (run `make setup`): every record takes the slower parse", CLASS)
        return False
    return True


def read(value: str, pipeline: Pipeline) -> Column:
    """``struct<data, rescued>`` for the bytes in column ``value``, NULL for a record left to
    the reference parse. ``rescued`` maps each undeclared field's path to its JSON text
    (NULL when there is none), in the order :func:`sluice.spec.rescue.rescued_sql` gives."""
    return F.expr(f"{FUNCTION}({value}, {lit(schema(pipeline).json())})")


def rescued_json(rescued: str) -> str:
    """The ``_rescued`` column from the one pass's ``rescued`` map, as the reference writes it
    (each value through a VARIANT, so numbers and keys are written alike)."""
    return f"CASE WHEN {rescued} IS NOT NULL THEN to_json(transform_values({rescued}, (k, v) -> parse_json(v))) END"


def rescued_map(rescued: str) -> str:
    """The rescued map (``MAP<STRING, VARIANT>``, as :func:`sluice.spec.rescue.rescued_sql`
    gives it) from the one pass's ``rescued``: empty when there is nothing."""
    return f"coalesce(transform_values({rescued}, (k, v) -> parse_json(v)), {EMPTY})"
