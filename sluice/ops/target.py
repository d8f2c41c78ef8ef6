"""Where a Spark job runs: the one thing the CLI and Airflow do differently.

An action builds a :class:`~sluice.ops.submit.Submission` and hands it to a target. The
target either gives the command line to launch it detached (a stream, which outlives
whoever started it) or runs it and waits (a backfill, a validation). :class:`LocalTarget`
runs the Spark runtime's own spark-submit; ``sluice.airflow.target.AirflowTarget`` builds
the same command through the Spark provider's hook and connection.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import urllib.request
from typing import Protocol

from sluice.errors import JobFailed
from sluice.ops.submit import Submission
from sluice.runtime import default_master, spark_submit_binary, submit_env


class SparkTarget(Protocol):
    @property
    def master(self) -> str:
        """The Spark master URL jobs are submitted to (``local[2]``, ``spark://h:7077``)."""
        ...

    def launch_command(self, sub: Submission) -> tuple[list[str], dict[str, str]]:
        """The command line and extra environment that start ``sub``, for a detached launch."""
        ...

    def run(self, sub: Submission) -> None:
        """Run ``sub`` to its end; raise :class:`~sluice.errors.JobFailed` if it fails."""
        ...

    def app_cores(self, app_id: str) -> int | None:
        """The cores the cluster granted the application, or None when it cannot tell."""
        ...


def standalone_app(master: str, app_id: str, ui: str | None = None) -> dict[str, object] | None:
    """What a standalone master's JSON API reports of ``app_id`` (the cores it was granted): the master knows every application, wherever its driver runs. Its web UI is
    ``SLUICE_SPARK_MASTER_UI`` (e.g. http://spark-master:8080); None without one, or when the
    master does not answer."""
    ui = ui or os.environ.get("SLUICE_SPARK_MASTER_UI")
    if not master.startswith("spark://") or not ui:
        return None
    try:
        with urllib.request.urlopen(f"{ui.rstrip('/')}/json/", timeout=3) as resp:  # noqa: S310 - the operator's URL
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return next(
        (a for a in [*data.get("activeapps", []), *data.get("completedapps", [])] if a.get("id") == app_id), None
    )


def standalone_app_cores(master: str, app_id: str) -> int | None:
    cores = (standalone_app(master, app_id) or {}).get("cores")
    return cores if isinstance(cores, int) else None


class LocalTarget:
    """spark-submit from the Spark runtime on this machine, to ``master``."""

    def __init__(self, master: str | None = None, conf: dict[str, str] | None = None) -> None:
        self._master = master or default_master()
        self.conf = dict(conf or {})

    @property
    def master(self) -> str:
        return self._master

    def _final(self, sub: Submission) -> Submission:
        return dataclasses.replace(sub, master=self._master, conf=sub.conf | self.conf)

    def launch_command(self, sub: Submission) -> tuple[list[str], dict[str, str]]:
        return self._final(sub).command(spark_submit_binary()), submit_env(self._master)

    def app_cores(self, app_id: str) -> int | None:
        return standalone_app_cores(self._master, app_id)

    def run(self, sub: Submission) -> None:
        command, env = self.launch_command(sub)
        # The job's log is diagnostics: it goes to stderr, so stdout carries only results (--json).
        code = subprocess.call(command, env=os.environ | env, stdout=sys.stderr)
        if code:
            raise JobFailed(f"{sub.name} exited with {code} (its log is above)", code)
