"""Spark's runtime on this host, as every Sluice job runs on it: where Spark is, its jars, the
settings every job runs with, the catalog's, and the drivers' class-data archive option.

Below both sides: the launcher (:mod:`sluice.ops.submit`) puts these on the spark-submit
command line, and the jobs (``jobs/session.py``, ``jobs/sql/session.py``) open in-process sessions
with the same. Nothing here starts a process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from sluice import config, storage
from sluice.errors import SluiceError
from sluice.sql.settings import DATABASE

JOBS_DIR = config.PROJECT_ROOT / "jobs"
#: The driver's JVM option for Sluice's job logging (warnings from Spark, progress from Sluice).
LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{JOBS_DIR / 'log4j2.properties'}"

#: Spark settings every Sluice job runs with.
BASE_CONF = {
    # Delta Lake as the default table format, on the built-in catalog.
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Event dates are computed in each spec's timezone from UTC timestamps.
    "spark.sql.session.timeZone": "UTC",
    # Streaming batches are small; the default of 200 shuffle partitions only adds tasks.
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    # Every Delta commit rebuilds the table's state to look up the writer's last batch
    # (txnAppId); Delta's default of 50 tasks for that made it most of a small batch's cost
    # (benchmarks/results/trials/01-snapshot-partitions-2.json: 2.95 s -> 1.71 s a batch).
    "spark.databricks.delta.snapshotPartitions": "2",
    # VACUUM lists a table's folders in this many Spark tasks, 10,000 by default whatever the
    # table's size: most of the maintenance job's time on a small table (docs/measured.md,
    # benchmarks/results/trials/12-vacuum-listing.json).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "16",
    "spark.driver.memory": "1g",
    # Each record is also read as a VARIANT for the fields its schema does not declare; with
    # a key twice, from_json keeps the last value, and so must the VARIANT (else it is NULL).
    "spark.sql.variant.allowDuplicateKeys": "true",
}


def spark_jars() -> list[str]:
    """The connector jars `make setup` resolved (Kafka source/sink and Delta), Sluice's
    own commit classes for S3 (sluice.storage.PUT_IF_ABSENT), and, when they were built, its
    one-pass parse (jobs.stream.one_pass) and its Delta append (jobs.tables.sinks.idempotent_append)."""
    jars = sorted(str(p) for p in config.jars_dir("spark").glob("*.jar"))
    if not jars:
        raise SluiceError(f"no jars in {config.jars_dir('spark')}: run `make setup`")
    own = [config.jars_dir("sluice") / name for name in ("sluice-parse.jar", "sluice-delta.jar")]
    return jars + storage.commit_jars() + [str(jar) for jar in own if jar.is_file()]


def spark_conf(extra: dict[str, str] | None = None) -> dict[str, str]:
    python = os.environ.get("SLUICE_SPARK_PYTHON") or sys.executable
    # S3A's settings and jars when this host is set up for S3 (sluice.storage).
    s3 = storage.spark_conf()
    java = LOG4J_OPTION
    if "spark.driver.extraClassPath" not in s3:
        java = f"{java} {class_data_options()}".strip()
    return (
        BASE_CONF
        | s3
        | {"spark.pyspark.python": python, "spark.pyspark.driver.python": python, "spark.driver.extraJavaOptions": java}
        | (extra or {})
    )


def class_data_options() -> str:
    """The driver's class-data archive option on this host (see below), or '' without one."""
    try:
        return java_options(spark_home(), spark_jars())
    except (SluiceError, FileNotFoundError):  # no Spark runtime or jars here: nothing to archive
        return ""


def spark_home() -> str:
    """The Spark installation spark-submit runs from: the pyspark wheel of this environment,
    unless ``SPARK_HOME`` names another (a cluster's, or the Spark runtime seen from Airflow)."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        raise FileNotFoundError("pyspark is not installed here: set SPARK_HOME or run `make setup`")
    return str(Path(found.origin).parent)


def submit_env(master: str | None = None) -> dict[str, str]:
    """Environment for spark-submit, so it works without an activated virtualenv."""
    python = os.environ.get("SLUICE_SPARK_PYTHON") or sys.executable
    env = {"SPARK_HOME": spark_home(), "PYSPARK_PYTHON": python, "SLUICE_HOME": str(config.sluice_home())}
    if (master or default_master()).startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    return env


def default_master() -> str:
    return os.environ.get("SLUICE_SPARK_MASTER", "local[2]")


def spark_submit_binary() -> str:
    """spark-submit of the Spark runtime environment (the pyspark wheel ships it)."""
    explicit = os.environ.get("SLUICE_SPARK_SUBMIT")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if not found:
        raise FileNotFoundError("spark-submit not found: run `make setup` or set SLUICE_SPARK_SUBMIT")
    return found


def catalog_conf() -> dict[str, str]:
    """A Spark session on the catalog, as the endpoint and a local ``sluice sql`` open it: the
    metastore, and the read-only rule for every session but the one trusted to register tables."""
    from sluice.sql.settings import metastore_conf

    s3 = storage.spark_conf().get("spark.driver.extraClassPath")
    return metastore_conf() | {
        "spark.sql.extensions": BASE_CONF["spark.sql.extensions"] + ",sluice.sql.ReadOnly",
        "spark.driver.extraClassPath": ":".join([*spark_jars(), *sql_jars(), *([s3] if s3 else [])]),
        # Partitions are read from each table's files (and a Parquet table's commit log), so
        # a new date is visible without MSCK REPAIR.
        "spark.sql.hive.manageFilesourcePartitions": "false",
        "spark.sluice.sql.databases": DATABASE,
    }


def sql_jars() -> list[str]:
    """Sluice's own JVM classes (read-only sessions, password logins) and the metastore's
    JDBC driver, built and resolved by `make setup`."""
    own = config.jars_dir("sluice") / "sluice-sql.jar"
    if not own.is_file():
        raise SluiceError(f"no sluice-sql.jar in {config.jars_dir('sluice')}: run `make setup`")
    return [str(own), *sorted(str(p) for p in config.jars_dir("metastore").glob("*.jar"))]


# --- the drivers' class-data archive ---------------------------------------------------------
# Built by `make setup` (sluice/ops/cds.py, which says why); looked up here for each driver.

ARCHIVE = "driver.jsa"
FINGERPRINT = "driver.fingerprint"
#: Java reports an archive it cannot map on stdout, where a job's output goes; the
#: fingerprint is what keeps an archive current, and tests/integration/test_cds.py's
#: ``-Xshare:on`` is what fails loudly when Java stops taking it.
QUIET = "-Xlog:cds*=off"


def archive_folder() -> Path:
    return config.jars_dir("cds")


def java_home() -> Path | None:
    """The JDK spark-submit runs: ``JAVA_HOME``, else the ``java`` on the PATH."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    found = shutil.which("java")
    return Path(os.path.realpath(found)).parent.parent if found else None


def fingerprint(spark_home: str, jars: list[str]) -> str | None:
    """What the archive depends on: the JDK's build and every jar on the driver's class path
    or in ``--jars`` (name, size, modification time). None without a JDK."""
    java = java_home()
    if java is None:
        return None
    digest = hashlib.sha256()
    release = java / "release"
    digest.update(release.read_bytes() if release.exists() else str(java).encode())
    for jar in sorted((Path(spark_home) / "jars").glob("*.jar")) + [Path(j) for j in jars]:
        st = jar.stat()
        digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def java_options(spark_home: str, jars: list[str]) -> str:
    """``-XX:SharedArchiveFile=...`` while this host's archive matches its JDK and jars; else ''
    (and with ``SLUICE_CLASS_DATA=off``, as benchmarks/throughput.py's trial compares)."""
    archive, stamp = archive_folder() / ARCHIVE, archive_folder() / FINGERPRINT
    if os.environ.get("SLUICE_CLASS_DATA") == "off" or not (archive.exists() and stamp.exists()):
        return ""
    if stamp.read_text().strip() != fingerprint(spark_home, jars):
        return ""
    return f"-XX:SharedArchiveFile={archive} {QUIET}"
