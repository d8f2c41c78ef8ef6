"""The SQL endpoint: Spark's Thrift JDBC/ODBC server on the pipelines' catalog.

    spark-submit ... jobs/sql_endpoint.py --host 127.0.0.1 --port 10000 --auth none

Started detached by ``sluice sql serve`` (or the ``sluice_sql_endpoint`` DAG) with the
settings of :func:`sluice.ops.submit.endpoint_submission`. It registers every pipeline's
tables, starts the server, and then, until SIGTERM, registers tables that appear and reports
itself in ``endpoint.json`` (:class:`sluice.records.endpoint.EndpointStatus`).

Clients get read-only sessions (``jobs/java/sluice/sql/ReadOnly.java``); this driver's own
session, which registers tables, is the one trusted to write the catalog.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from pyspark.sql import SparkSession

from jobs.lifecycle import configure_logging, stop_on_signals
from jobs.sql import catalog, thrift
from sluice import registry
from sluice.errors import first_line
from sluice.records.endpoint import EndpointStatus
from sluice.spec import valid_pipelines
from sluice.sql.settings import DATABASE, metastore_name

log = logging.getLogger("sluice.sql_endpoint")
#: How often tables that appeared since are registered (seconds); the heartbeat is every second.
SYNC_EVERY = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sql_endpoint.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--auth", choices=("none", "password"), required=True)
    parser.add_argument("--allow-writes", action="store_true")
    args = parser.parse_args(argv)
    configure_logging()

    status = EndpointStatus(
        "starting", os.getpid(), time.time(), args.host, args.port, args.auth, args.allow_writes, metastore_name()
    )
    status.save()
    stop = stop_on_signals(log)
    try:
        spark = SparkSession.builder.appName("sluice-sql-endpoint").getOrCreate()
        status.app_id, status.ui = spark.sparkContext.applicationId, spark.sparkContext.uiWebUrl
        thrift.give_metastore_password(spark)
        thrift.trust(spark)
        status.tables = _sync(spark)
        thrift.start_thrift_server(spark)
    except Exception as exc:  # the metastore or the port: say so where `sluice sql serve` looks
        log.exception("the SQL endpoint failed to start")
        status.state, status.error, status.updated_at = "failed", first_line(exc), time.time()
        status.save()
        return 1
    log.info("serving %s on %s:%d (auth %s): %s", DATABASE, args.host, args.port, args.auth, ", ".join(status.tables))
    status.state = "running"
    # The heartbeat has a thread of its own: a slow registration (many tables, an object
    # store) must not make the endpoint look hung to supervision.
    beat = threading.Thread(target=_heartbeat, args=(status, stop), name="sluice-heartbeat", daemon=True)
    beat.start()
    while not stop.wait(SYNC_EVERY):
        try:
            status.tables = _sync(spark)
        except Exception:  # the metastore away for a moment: the tables served stay, retry later
            log.warning("registering tables failed; retrying in %.0f s", SYNC_EVERY, exc_info=True)
    beat.join()
    status.state, status.updated_at = "stopped", time.time()
    status.save()
    spark.stop()
    log.info("stopped")
    return 0


def _heartbeat(status: EndpointStatus, stop: threading.Event) -> None:
    while not stop.is_set():
        status.updated_at = time.time()
        status.save()
        stop.wait(1.0)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A table that cannot be registered is reported once, not at every pass."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _sync(spark: SparkSession) -> list[str]:
    pipelines, invalid = valid_pipelines(registry.schema_file)
    for exc in invalid:
        _warn_once(f"skipping a spec: {exc}")
    return catalog.sync(spark, pipelines, _warn_once)


if __name__ == "__main__":
    sys.exit(main())
