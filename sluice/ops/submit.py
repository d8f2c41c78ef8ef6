"""How a pipeline is handed to Spark: one spark-submit description for every caller.

``sluice run`` executes it; the Airflow side passes the same fields to the Spark
provider's ``SparkSubmitOperator``. Neither builds its own command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.records.backfill import BackfillPlan
from sluice.runtime import (
    JOBS_DIR,
    LOG4J_OPTION,
    catalog_conf,
    default_master,
    spark_conf,
    spark_jars,
    spark_submit_binary,
    sql_jars,
)
from sluice.sql.settings import Endpoint


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
