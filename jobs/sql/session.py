"""SQL on the pipelines' tables in this process's own Spark session.

:class:`LocalSession` is what ``sluice sql`` uses when no endpoint runs: the same catalog
(it opens the metastore, registers the tables) and the same read-only rule, in a local
Spark. :func:`register_tables` makes temporary views instead, for the demo's report, which
must not depend on the metastore.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from jobs.session import local_session
from jobs.sql import catalog, thrift
from jobs.tables.readers import read_table, table_exists
from sluice import registry
from sluice.errors import SluiceError, first_line
from sluice.runtime import catalog_conf
from sluice.spec import Pipeline, valid_pipelines
from sluice.sql.client import Result, SqlError, limited
from sluice.sql.settings import DATABASE


class LocalSession:
    where = "a local Spark session"

    def __init__(self, warn: Callable[[str], None] = lambda _: None) -> None:
        self.spark = local_session("sluice-sql", conf=catalog_conf() | {"spark.ui.enabled": "false"})
        # PySpark logs every failed statement with its Java stack; the message is shown instead.
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
        thrift.give_metastore_password(self.spark)
        thrift.trust(self.spark)
        pipelines, invalid = valid_pipelines(registry.schema_file)
        for exc in invalid:
            warn(f"skipping a spec: {exc}")
        try:
            catalog.sync(self.spark, pipelines, warn)
        except Exception as exc:
            self.spark.stop()
            if "Another instance of Derby" in str(exc) or (
                "Unable to instantiate" in str(exc) and not os.environ.get("SLUICE_METASTORE_URL")
            ):
                raise SluiceError(
                    "the embedded Derby metastore is open in another Spark process (another `sluice sql`?): "
                    "start the endpoint with `sluice sql serve` so that clients share it"
                ) from None
            raise
        # Queries run in a session of their own: only the one above may write the catalog.
        self.session = self.spark.newSession()
        self.session.catalog.setCurrentDatabase(DATABASE)

    def run(self, sql: str, limit: int | None = None) -> Result:
        try:
            df = self.session.sql(sql.strip().rstrip(";"))
            rows = df.collect() if limit is None else df.limit(limit + 1).collect()
        except PySparkException as exc:  # AnalysisException, ParseException: Spark's message
            raise SqlError(first_line(exc)) from None
        except Py4JJavaError as exc:  # the read-only rule's SecurityException
            if "java.lang.SecurityException" not in str(exc):
                raise
            raise SqlError(_security_message(exc)) from None
        return limited(df.columns, rows, limit)

    def close(self) -> None:
        self.spark.stop()


def _security_message(exc: BaseException) -> str:
    text = str(exc)
    start = text.find("sluice: ")
    return text[start:].splitlines()[0] if start >= 0 else first_line(exc)


def register_tables(spark: SparkSession, pipelines: list[Pipeline], warn: Callable[[str], None]) -> dict[str, str]:
    """Create a temp view per table that exists; return view name -> path.

    Only table sinks have tables (a continuous branch writes Kafka topics). A table that
    cannot be read is reported through ``warn`` once and left out, so queries on the
    others still run.
    """
    views = {}
    for p in pipelines:
        if p.table_format is None:
            continue
        fmt = p.table_format.name
        for view, path in ((p.name, p.sink_path), (p.quarantine_table, p.quarantine_path)):
            try:
                if table_exists(spark, fmt, path):
                    read_table(spark, fmt, path).createOrReplaceTempView(view)
                    views[view] = path
            except Exception as exc:  # any reader error: this view is skipped, the others go on
                warn(f"{view}: cannot read the {fmt} table at {path}: {first_line(exc)}")
    return views
