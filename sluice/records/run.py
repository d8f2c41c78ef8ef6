"""A stream's run files, in ``$SLUICE_HOME/run/<pipeline>/`` on the driver's machine.

``driver.json`` (:class:`Driver`) is written by whoever launches the stream: how it was
started, by whom, and what the user wants of it now. ``status.json`` (:class:`Status`) is
written by the job every second while it runs: its state, Spark ids and last progress.
``failures.json`` (:class:`Failures`) is the job's memory of how often in a row it failed
on the same batch, which supervision reads to stop restarting a stream that cannot pass it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Self

from sluice import config

#: What the user asked for last: keep it running, it was stopped on purpose, or run it once (available-now).
Desired = Literal["running", "stopped", "once"]


def run_dir(pipeline: str) -> Path:
    return config.sluice_home() / "run" / pipeline


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace a small JSON file atomically, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Only the fields this version knows: a newer writer's extra fields are not an error."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Driver:
    """How a detached run was started (``driver.json``)."""

    pipeline: str
    pid: int  # the spark-submit process, leader of its own process group
    command: list[str]
    log: str
    launched_at: float
    launched_by: str
    desired: Desired = "running"
    stopped_at: float | None = None
    stopped_by: str | None = None

    @classmethod
    def read(cls, pipeline: str) -> Self | None:
        data = read_json(run_dir(pipeline) / "driver.json")
        return cls(**known_fields(cls, data)) if data else None

    def save(self) -> None:
        write_json(run_dir(self.pipeline) / "driver.json", asdict(self))


@dataclass
class Status:
    """What the job reports about itself (``status.json``)."""

    pipeline: str
    state: str  # starting | running | stopped | finished | failed
    pid: int  # the Python driver process
    updated_at: float
    app_id: str | None = None
    query_id: str | None = None
    run_id: str | None = None
    ui: str | None = None
    error: str | None = None
    last_progress: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, pipeline: str, name: str = "status.json") -> Self | None:
        data = read_json(run_dir(pipeline) / name)
        return cls(**known_fields(cls, data)) if data else None

    def save(self, name: str = "status.json") -> None:
        write_json(run_dir(self.pipeline) / name, asdict(self))


#: Failures further apart than this (seconds) are not "in a row".
FORGET_AFTER = 3600.0


@dataclass
class Failures:
    """How many runs in a row failed on the same batch (``failures.json``), and why.

    Written by the job as it fails; cleared by a start a person asked for, so that a
    changed rule or fixed data gets its own attempts.
    """

    pipeline: str
    batch: int  # the batch a restart runs next: the one that failed
    count: int
    cause: str  # the root cause's one line
    first_at: float
    last_at: float

    @classmethod
    def read(cls, pipeline: str) -> Self | None:
        data = read_json(run_dir(pipeline) / "failures.json")
        return cls(**known_fields(cls, data)) if data else None

    @classmethod
    def record(cls, pipeline: str, batch: int, cause: str, now: float | None = None) -> Self:
        """Count one more failure: the next in a row on ``batch``, or the first on a new one.
        A failure long after the last one starts counting again: an idle stream that meets a
        passing outage now and then, on the same next batch, is not failing in a loop."""
        now = time.time() if now is None else now
        last = cls.read(pipeline)
        if last is not None and last.batch == batch and now - last.last_at <= FORGET_AFTER:
            failures = cls(pipeline, batch, last.count + 1, cause, last.first_at, now)
        else:
            failures = cls(pipeline, batch, 1, cause, now, now)
        write_json(run_dir(pipeline) / "failures.json", asdict(failures))
        return failures

    @staticmethod
    def clear(pipeline: str) -> None:
        (run_dir(pipeline) / "failures.json").unlink(missing_ok=True)
