"""How a pipeline is handed to Spark: one spark-submit description for every caller.

``sluice run`` executes it; the Airflow side passes the same fields to the Spark
provider's ``SparkSubmitOperator``. Neither builds its own command line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice import config, storage
from sluice.errors import SluiceError
from sluice.ops import cds
from sluice.records.backfill import BackfillPlan
from sluice.sql.settings import DATABASE, Endpoint

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
    one-pass parse (jobs.one_pass) and its Delta append (jobs.sinks.idempotent_append)."""
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
    """The driver's class-data archive option on this host (sluice.ops.cds), or '' without one."""
    try:
        return cds.java_options(spark_home(), spark_jars())
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


@dataclass(frozen=True)
class Submission:
    """What spark-submit needs; field names follow SparkSubmitOperator's arguments."""

    application: str
    application_args: list[str]
    name: str
    conf: dict[str, str] = field(default_factory=dict)
    jars: list[str] = field(default_factory=list)
    master: str = "local[2]"

    def operator_kwargs(self) -> dict[str, Any]:
        """The same submission as arguments of the Spark provider's SparkSubmitOperator/Hook
        (the master comes from the Airflow connection instead)."""
        return {
            "application": self.application,
            "application_args": list(self.application_args),
            "name": self.name,
            "conf": dict(self.conf),
            "jars": ",".join(self.jars) or None,
        }

    def command(self, binary: str | None = None) -> list[str]:
        cmd = [binary or spark_submit_binary(), "--master", self.master, "--name", self.name]
        for key, value in sorted(self.conf.items()):
            cmd += ["--conf", f"{key}={value}"]
        if self.jars:
            cmd += ["--jars", ",".join(self.jars)]
        return [*cmd, self.application, *self.application_args]


def ingest_submission(
    spec_path: str | Path,
    *,
    pipeline_name: str,
    available_now: bool = False,
    processing_time: str | None = None,
    backfill: BackfillPlan | None = None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    rebuild: bool = False,
) -> Submission:
    """The ingest job for one spec, or for a backfill plan of it."""
    args = ["--spec", str(spec_path)]
    if rebuild:
        args.append("--rebuild")
    if available_now:
        args.append("--available-now")
    if processing_time:
        args += ["--processing-time", processing_time]
    if backfill:
        args += ["--backfill", backfill.to_json()]
    return Submission(
        application=str(JOBS_DIR / "ingest.py"),
        application_args=args,
        name=f"sluice-{pipeline_name}" + ("-backfill" if backfill else ""),
        conf=spark_conf(conf),
        jars=spark_jars(),
        master=master or default_master(),
    )


def maintenance_submission(spec_path: str | Path, *, pipeline_name: str, master: str | None = None) -> Submission:
    """OPTIMIZE and VACUUM of one pipeline's Delta tables."""
    return Submission(
        application=str(JOBS_DIR / "maintain.py"),
        application_args=["--spec", str(spec_path)],
        name=f"sluice-{pipeline_name}-maintenance",
        conf=spark_conf(),
        jars=spark_jars(),
        master=master or default_master(),
    )


def validation_submission(
    spec_path: str | Path, *, pipeline_name: str, dates: str, report: str | Path, master: str | None = None
) -> Submission:
    """Great Expectations on the table's date partitions (``dates``: see ``Selection.parse``)."""
    return Submission(
        application=str(JOBS_DIR / "validate.py"),
        application_args=["--spec", str(spec_path), "--dates", dates, "--report", str(report)],
        name=f"sluice-{pipeline_name}-validate",
        conf=spark_conf(),
        jars=spark_jars(),
        master=master or default_master(),
    )


def endpoint_submission(endpoint: Endpoint, *, master: str | None = None) -> Submission:
    """The SQL endpoint: Spark's Thrift server on the catalog (``jobs/sql_endpoint.py``).

    Its jars go on the driver's own class path too: the Thrift server opens each client's
    session on a thread that sees only that class path, not ``--jars``.
    """
    from sluice.sql.passwords import password_file_option

    args = ["--host", endpoint.host, "--port", str(endpoint.port), "--auth", endpoint.auth]
    java = [LOG4J_OPTION]
    if endpoint.auth == "password":
        java += [
            "-Dhive.server2.authentication=CUSTOM",
            "-Dhive.server2.custom.authentication.class=sluice.sql.PasswordFile",
            password_file_option(),
        ]
    conf = catalog_conf() | {
        "spark.driver.extraJavaOptions": " ".join(java),
        "spark.hadoop.hive.server2.thrift.bind.host": endpoint.host,
        "spark.hadoop.hive.server2.thrift.port": str(endpoint.port),
        # How long a stop waits for open client connections (the default is 60 s): a client
        # that holds one idle, as connection pools do, would hold up every stop.
        "spark.hadoop.hive.server2.thrift.worker.keepalive.time": "5s",
        "spark.sluice.sql.allowWrites": str(endpoint.allow_writes).lower(),
    }
    if endpoint.allow_writes:
        args.append("--allow-writes")
    return Submission(
        application=str(JOBS_DIR / "sql_endpoint.py"),
        application_args=args,
        name="sluice-sql-endpoint",
        conf=spark_conf(conf),
        jars=[*spark_jars(), *sql_jars()],
        master=master or default_master(),
    )


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
