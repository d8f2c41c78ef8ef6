"""The three JVM calls the SQL endpoint needs that PySpark has no Python API for.

They go through ``spark._jvm`` and ``spark._jsc``, PySpark's private gateway, so they live
here and nowhere else; ``tests/integration/test_sql_endpoint.py`` starts a real endpoint through them, so a
PySpark release that moves any of them fails that test, loudly.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def trust(spark: SparkSession) -> None:
    """Let this session write the catalog (see ``jobs/java/sluice/sql/ReadOnly.java``);
    the sessions the Thrift server opens for clients stay read-only."""
    spark._jvm.sluice.sql.ReadOnly.trust(spark._jsparkSession)  # type: ignore[union-attr]


def start_thrift_server(spark: SparkSession) -> Any:
    """Spark's Thrift JDBC/ODBC server (HiveServer2's protocol) on this session's catalog,
    with its host, port and authentication from the ``hive.server2.*`` settings."""
    jvm = spark._jvm
    assert jvm is not None
    server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
    return server.startWithContext(spark._jsparkSession.sqlContext())


#: Where Hive's metastore client reads its database password (javax.jdo.option.ConnectionPassword).
_METASTORE_PASSWORD = "javax.jdo.option.ConnectionPassword"  # noqa: S105 - its name, not a password


def give_metastore_password(spark: SparkSession) -> None:
    """Put the metastore's password (from its file) into the Hadoop configuration the Hive
    client is built from, before anything opens the catalog. Not a Spark setting: those are
    copied into every session, where a client's ``SET key`` could read them back."""
    from sluice.sql.settings import metastore_password

    password = metastore_password()
    if password is not None:
        spark._jsc.hadoopConfiguration().set(_METASTORE_PASSWORD, password)
