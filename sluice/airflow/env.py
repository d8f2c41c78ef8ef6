"""The environment Airflow runs in: its own virtualenv, this project's DAGs and the Spark runtime.

``sluice airflow ...`` (run from the Spark runtime) execs ``.venv-airflow/bin/airflow`` with
these variables (``standalone`` runs as its child: :func:`run_standalone`), so the
scheduler's tasks find ``spark-submit``, the Spark runtime's Python and the jars, and
``dags/`` is the DAG folder. SQLite and ``$SLUICE_HOME/airflow``
hold Airflow's state for the embedded default.

The Spark connection (``sluice_spark``) picks the deploy target: ``local[2]`` by default,
or a standalone cluster with ``SLUICE_SPARK_MASTER=spark://host:7077``. It is provided as
an ``AIRFLOW_CONN_SLUICE_SPARK`` variable, which Airflow reads before its database.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sluice import config, runtime

CONN_ID = "sluice_spark"


def airflow_venv() -> Path:
    return Path(os.environ.get("SLUICE_AIRFLOW_VENV") or config.PROJECT_ROOT / ".venv-airflow")


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or config.sluice_home() / "airflow")


def spark_connection(master: str) -> str:
    """The connection as JSON; ``host`` holds the whole master URL (local[N] or spark://h:p)."""
    return json.dumps({"conn_type": "spark", "host": master, "description": "Sluice's Spark deploy target"})


def sized_to_machine(cores: int | None = None) -> dict[str, str]:
    """Airflow's process counts for this machine, unless the environment sets them.

    Airflow's defaults suit a server: 32 LocalExecutor worker processes (``parallelism``), 4
    API server workers and 2 DAG-parsing processes; on a 2-core laptop that is 5.7 GB of
    RSS for Airflow alone. Sluice's tasks are short (a stream runs detached, outside any
    worker slot), so one worker per core keeps every task moving.
    """
    cores = cores or os.cpu_count() or 2
    defaults = {
        "AIRFLOW__CORE__PARALLELISM": str(cores),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
    }
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def airflow_env(master: str | None = None, port: int | None = None) -> dict[str, str]:
    """Variables for every Airflow process; computed in the Spark runtime, where pyspark is real."""
    master = master or runtime.default_master()
    spark_bin = Path(sys.executable).parent
    host = os.environ.get("AIRFLOW__API__HOST", "127.0.0.1")
    port = port or int(os.environ.get("AIRFLOW__API__PORT", "8080"))
    env = {
        "AIRFLOW_HOME": str(airflow_home()),
        "AIRFLOW__CORE__DAGS_FOLDER": str(config.PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        # Task processes report to the API server's execution API: same host and port.
        # (On hosts other than the API server's, the deployment sets it: it is kept.)
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": os.environ.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL")
        or f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/execution/",  # noqa: S104
        # New spec files show up within a minute.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": os.environ.get("AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL", "30"),
        **sized_to_machine(),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": os.environ.get(f"AIRFLOW_CONN_{CONN_ID.upper()}")
        or spark_connection(master),
        # The Spark runtime, seen from Airflow's environment (whose `pyspark` is pyspark-client).
        "SPARK_HOME": runtime.spark_home(),
        "SLUICE_SPARK_PYTHON": os.environ.get("SLUICE_SPARK_PYTHON") or sys.executable,
        "SLUICE_HOME": str(config.sluice_home()),
        "SLUICE_JARS": str(config.jars_dir("spark").parent),
        "SLUICE_KAFKA_BOOTSTRAP": config.bootstrap_servers(),
        # airflow first; spark-submit (which the Spark provider looks up on PATH) from the Spark runtime.
        "PATH": os.pathsep.join([str(airflow_venv() / "bin"), str(spark_bin), os.environ.get("PATH", "")]),
    }
    if master.startswith("local"):
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def airflow_binary() -> Path:
    binary = airflow_venv() / "bin" / "airflow"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} not found: run `make setup` (it installs Airflow in its own venv)")
    return binary


def run_standalone(binary: Path, args: list[str], env: dict[str, str], grace: float = 60.0) -> int:
    """``airflow standalone`` as a child that a SIGTERM stops whole; its exit code.

    Airflow's standalone stops its components only on Ctrl-C (SIGINT): on SIGTERM (``kill``,
    systemd, ``docker stop``) it died alone and left its scheduler, DAG processor, API server
    and triggerer running, with their workers. Here SIGTERM, SIGINT and SIGHUP become one
    SIGINT to it; whatever of its process group outlives it, or the grace period, is killed.
    The streams its tasks started run in their own sessions and are not touched.
    """
    asked: list[float] = []
    proc: subprocess.Popen[bytes] | None = None

    def stop(_signum: int, _frame: object) -> None:
        if not asked:
            asked.append(time.monotonic())
            if proc is not None:
                proc.send_signal(signal.SIGINT)  # not once it has been reaped

    # Before the child exists: a SIGTERM meanwhile would end this process and orphan it.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    proc = subprocess.Popen([str(binary), *args], env=env, start_new_session=True)
    if asked:  # it came before the child did
        proc.send_signal(signal.SIGINT)
    while True:
        try:
            code = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if asked and time.monotonic() - asked[0] > grace:
                _end_group(proc.pid, signal.SIGKILL)
    _end_group(proc.pid, signal.SIGTERM)  # a worker its component left behind
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    _end_group(proc.pid, signal.SIGKILL)
    if asked and code in (0, -signal.SIGINT):
        return 0
    return 128 - code if code < 0 else code  # killed by a signal: the shell's way of saying so


def _end_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
