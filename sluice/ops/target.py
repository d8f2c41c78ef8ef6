"""Where a Spark job runs: the one thing the CLI and Airflow do differently.

An action builds a :class:`~sluice.ops.submit.Submission` and hands it to a target. The
target either gives the command line to launch it detached (a stream, which outlives
whoever started it) or runs it and waits (a backfill, a validation). :class:`LocalTarget`
runs the Spark runtime's own spark-submit; ``sluice.airflow.target.AirflowTarget`` builds
the same command through the Spark provider's hook and connection.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Protocol

from sluice.errors import JobFailed
from sluice.ops.submit import Submission, default_master, spark_submit_binary, submit_env


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

    def run(self, sub: Submission) -> None:
        command, env = self.launch_command(sub)
        # The job's log is diagnostics: it goes to stderr, so stdout carries only results (--json).
        code = subprocess.call(command, env=os.environ | env, stdout=sys.stderr)
        if code:
            raise JobFailed(f"{sub.name} exited with {code} (its log is above)", code)
