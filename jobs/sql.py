"""Ad-hoc SQL over the pipelines' tables: each output table and its quarantine table is
a view named after the pipeline (``payments``, ``payments_quarantine``)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from jobs.sinks import read_table, table_exists
from sluice.spec import Pipeline

TABLE_FORMATS = ("delta", "parquet")


def register_tables(spark: SparkSession, pipelines: list[Pipeline], warn: Callable[[str], None]) -> dict[str, str]:
    """Create a temp view per table that exists; return view name -> path.

    Only table sinks have tables (a continuous branch writes Kafka topics). A table that
    cannot be read is reported through ``warn`` once and left out, so queries on the
    others still run.
    """
    views = {}
    for p in pipelines:
        fmt = p.spec.sink.format
        if fmt not in TABLE_FORMATS:
            continue
        for view, path in ((p.name, p.sink_path), (p.quarantine_table, p.quarantine_path)):
            try:
                if table_exists(spark, fmt, path):
                    read_table(spark, fmt, path).createOrReplaceTempView(view)
                    views[view] = path
            except Exception as exc:  # any reader error: this view is skipped, the others go on
                warn(f"{view}: cannot read the {fmt} table at {path}: {str(exc).strip().splitlines()[0]}")
    return views
