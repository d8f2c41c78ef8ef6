"""The Airflow Spark target: the only module that touches the Spark provider.

Jobs are submitted with the command the provider's ``SparkSubmitHook`` builds from the
``sluice_spark`` connection, so a deployment changes its master, deploy mode or binary in
Airflow's connection, not in Sluice. The stream needs that command line without running it
(it is launched detached and outlives the task), which the provider offers only privately:
:data:`PRIVATE` names the two private members used, and :func:`check_provider` (run by
``tests/e2e/test_airflow_dags.py::test_the_airflow_target_builds_the_local_command_through_the_provider``) fails
loudly when a provider release changes them.
"""

from __future__ import annotations

import os
import signal
from functools import cached_property
from types import FrameType

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from sluice.airflow.env import CONN_ID
from sluice.errors import JobFailed, SluiceError
from sluice.ops.submit import Submission
from sluice.ops.target import standalone_app_cores
from sluice.runtime import submit_env

#: Private members of SparkSubmitHook this module relies on (provider 6.x).
PRIVATE = ("_build_spark_submit_command", "_connection")


def check_provider() -> None:
    """Raise if the provider no longer has what :class:`AirflowTarget` relies on."""
    hook = SparkSubmitHook(conn_id=CONN_ID)
    build = getattr(SparkSubmitHook, PRIVATE[0], None)
    conn = getattr(hook, PRIVATE[1], None)
    if not callable(build) or not isinstance(conn, dict) or not isinstance(conn.get("master"), str):
        raise RuntimeError(
            "apache-airflow-providers-apache-spark changed: SparkSubmitHook no longer has "
            f"{PRIVATE[0]}() and a {PRIVATE[1]} dict with 'master'; update sluice/airflow/target.py"
        )


def check_spark_runtime() -> None:
    """spark-submit must come from the Spark runtime; `sluice airflow` points Airflow at it."""
    missing = [k for k in ("SPARK_HOME", "SLUICE_SPARK_PYTHON") if not os.environ.get(k)]
    if missing:
        raise SluiceError(
            f"{', '.join(missing)} not set: start Airflow with `sluice airflow ...` (make airflow), which points it at "
            "the Spark runtime; Airflow's own environment only has pyspark-client"
        )


def _hook(sub: Submission, conn_id: str) -> tuple[SparkSubmitHook, str]:
    kwargs = sub.operator_kwargs()
    application = kwargs.pop("application")
    return SparkSubmitHook(conn_id=conn_id, **kwargs), application


class AirflowTarget:
    """Submit through the Spark provider's hook and the Airflow connection."""

    def __init__(self, conn_id: str = CONN_ID) -> None:
        self.conn_id = conn_id

    @cached_property
    def master(self) -> str:
        """Resolved once per target: each hook resolves the connection anew (a metadata-DB or
        secrets-backend lookup when it is not an environment variable)."""
        return str(SparkSubmitHook(conn_id=self.conn_id)._connection["master"])

    def app_cores(self, app_id: str) -> int | None:
        return standalone_app_cores(self.master, app_id)

    def launch_command(self, sub: Submission) -> tuple[list[str], dict[str, str]]:
        check_spark_runtime()
        hook, application = _hook(sub, self.conn_id)
        return hook._build_spark_submit_command(application), submit_env(self.master)

    def run(self, sub: Submission) -> None:
        """``hook.submit``, as the operator runs it; a task killed meanwhile kills spark-submit."""
        check_spark_runtime()
        hook, application = _hook(sub, self.conn_id)
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> None:
            hook.on_kill()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
        try:
            hook.submit(application)
        except Exception as exc:  # AirflowException: spark-submit exited with an error
            raise JobFailed(str(exc)) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
