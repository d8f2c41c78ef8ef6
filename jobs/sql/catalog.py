"""Registers the pipelines' tables in the metastore (see :mod:`sluice.sql.catalog`).

Run by whoever owns the metastore: the SQL endpoint, at start and then every few seconds,
so a pipeline's tables appear once it has first written them; or ``sluice sql`` when no
endpoint runs. Idempotent: a table already registered at its location is left alone, one
registered elsewhere (its spec moved it) is registered again; the files are never touched.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from jobs.tables import hadoopfs
from jobs.tables.readers import committed_files, newest_file_schema, table_exists
from sluice.errors import first_line
from sluice.spec import Pipeline
from sluice.sql.catalog import CatalogTable, catalog_tables, database_statement, field_paths


def sync(spark: SparkSession, pipelines: list[Pipeline], warn: Callable[[str], None]) -> list[str]:
    """Register every table that exists; return the registered names. A table that cannot be
    registered is reported through ``warn`` and left out; the others go on."""
    spark.sql(database_statement())
    registered = []
    for table in catalog_tables(pipelines):
        try:
            if not table_exists(spark, table.format.name, table.location):
                continue
            # The catalog records a qualified URI (file:/data/t), so the spec's path is qualified too.
            if _location(spark, table) != hadoopfs.qualify(spark, table.location) or _lacks_columns(spark, table):
                spark.sql(table.drop())
                spark.sql(table.create())
            registered.append(table.name)
        except Exception as exc:  # any Spark error: this table is skipped, the others go on
            warn(f"{table.name}: cannot register the {table.format.name} table at {table.location}: {first_line(exc)}")
    return registered


def _lacks_columns(spark: SparkSession, table: CatalogTable) -> bool:
    """A Parquet table registered before its newest files gained a column or a nested field
    (Delta tables read their schema from their log at every query). Only fields the files
    already have count: a spec's new field is there once a batch has written it."""
    if table.format.schema_in_log or not table.columns:
        return False
    have = field_paths(spark.table(table.qualified).schema.json())
    missing = table.columns - have
    if not missing:  # the usual case, every few seconds: no file needs reading
        return False
    entries = committed_files(spark, table.location)
    if not entries:
        return False
    return bool(missing & field_paths(newest_file_schema(spark, entries)))


def _location(spark: SparkSession, table: CatalogTable) -> str | None:
    if not spark.catalog.tableExists(table.qualified.replace("`", "")):
        return None
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table.qualified}").collect()
    return next((r.data_type for r in rows if r.col_name == "Location"), None)
