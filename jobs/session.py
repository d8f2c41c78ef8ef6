"""A Spark session configured like a submitted Sluice job, for in-process use
(``sluice sql``, the demo's report, tests), from the settings submitted jobs get on the
spark-submit command line (:mod:`sluice.runtime`)."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from sluice.runtime import default_master, spark_conf, spark_jars


def local_session(app: str = "sluice", master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    if (master or default_master()).startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (pandas UDFs, applyInPandasWithState) run this environment's Python,
    # which has pyarrow; PySpark reads the variable, not spark.pyspark.python, in-process.
    os.environ.setdefault("PYSPARK_PYTHON", spark_conf()["spark.pyspark.python"])
    builder = SparkSession.builder.master(master or default_master()).appName(app)
    for key, value in (spark_conf(conf) | {"spark.jars": ",".join(spark_jars())}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
