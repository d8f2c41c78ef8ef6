"""Ad-hoc SQL over the pipelines' tables: each output table and its quarantine table is
a view named after the pipeline (``payments``, ``payments_quarantine``)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from jobs.sinks import read_table, table_exists
from sluice.spec import Pipeline


def register_tables(spark: SparkSession, pipelines: list[Pipeline]) -> dict[str, str]:
    """Create a temp view per table that exists; return view name -> path."""
    views = {}
    for p in pipelines:
        fmt = p.spec.sink.format
        for view, path in ((p.name, p.sink_path), (p.quarantine_table, p.quarantine_path)):
            if table_exists(spark, fmt, path):
                read_table(spark, fmt, path).createOrReplaceTempView(view)
                views[view] = path
    return views


def query(spark: SparkSession, sql: str) -> DataFrame:
    return spark.sql(sql)
