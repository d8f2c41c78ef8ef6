"""A stream's run records, in the run-state store (:mod:`sluice.state`) every host reaches.

``driver`` (:class:`Driver`) is written by whoever launches the stream: how it was started,
by whom, on which host, and what the user wants of it now (a stop asked for on any host
reaches the driver through it). It is only ever written with a compare-and-set on its
``version``, so an action that read it before a person's stop cannot write over the stop. ``status`` (:class:`Status`) is written by the job every
second while it runs: its state, Spark ids and last progress. ``failures`` (:class:`Failures`)
is the job's memory of how often in a row it failed on the same batch, which supervision
reads to stop restarting a stream that cannot pass it. The job writes its records fenced by
its lease: a driver that lost it writes nothing over its successor's.

What stays on the driver's machine is under :func:`run_dir`: its logs and event spool.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from sluice import config, faults
from sluice.state import hostname, store

if TYPE_CHECKING:
    from sluice.state.lease import Lease

#: What the user asked for last: keep it running, it was stopped on purpose, or run it once (available-now).
Desired = Literal["running", "stopped", "once"]


def run_dir(pipeline: str) -> Path:
    return config.sluice_home() / "run" / pipeline


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Only the fields this version knows: a newer writer's extra fields are not an error."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Driver:
    """How a detached run was started (the ``driver`` record)."""

    pipeline: str
    pid: int  # the spark-submit process, leader of its own process group
    command: list[str]
    log: str
    launched_at: float
    launched_by: str
    desired: Desired = "running"
    stopped_at: float | None = None
    stopped_by: str | None = None
    host: str = field(default_factory=hostname)  # where the launcher ran: the log is there
    owner: str = ""  # the launch's lease owner: a stop of this record is a stop of that run
    version: int = 0  # the record's version when it was read (0: not written yet)

    @classmethod
    def read(cls, pipeline: str) -> Self | None:
        data = store().get("driver", pipeline)
        return cls(**known_fields(cls, data)) if data else None

    def save_if_unchanged(self) -> bool:
        """Write the record if nobody wrote it since it was read (compare-and-set on its
        version): True, and :attr:`version` is the new one; False, and nothing written."""
        if not store().put_if("driver", self.pipeline, asdict(self), self.version):
            return False
        self.version += 1
        return True


def record_stop(pipeline: str, by: str) -> Driver:
    """Record that ``by`` wants the stream stopped, over whatever the record says now: a
    compare-and-set, tried again on the record as it is until it holds. A launch that read the
    record before cannot write over it then; a stream never started is recorded stopped too,
    so that a supervision deciding to start it meanwhile does not."""
    while True:
        driver = Driver.read(pipeline) or Driver(pipeline, 0, [], "", 0.0, "")
        faults.point("stop.read")
        driver.desired, driver.stopped_at, driver.stopped_by = "stopped", time.time(), by
        if driver.save_if_unchanged():
            return driver


@dataclass
class SupervisionPass:
    """The last supervision pass over a stream (the ``supervised`` record): who ran it, where
    and when, so that ``sluice status`` can say whether anything supervises the stream."""

    pipeline: str
    by: str
    at: float
    host: str = field(default_factory=hostname)

    @classmethod
    def read(cls, pipeline: str) -> Self | None:
        data = store().get("supervised", pipeline)
        return cls(**known_fields(cls, data)) if data else None

    def save(self) -> None:
        store().put("supervised", self.pipeline, asdict(self))


@dataclass
class Status:
    """What the job reports about itself (the ``status`` record)."""

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
    host: str = field(default_factory=hostname)

    @classmethod
    def read(cls, pipeline: str) -> Self | None:
        data = store().get("status", pipeline)
        return cls(**known_fields(cls, data)) if data else None

    def save(self, fence: Lease | None = None) -> None:
        store().put("status", self.pipeline, asdict(self), fence=fence)


#: Failures further apart than this (seconds) are not "in a row".
FORGET_AFTER = 3600.0


@dataclass
class Failures:
    """How many runs in a row failed on the same batch (the ``failures`` record), and why.

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
        data = store().get("failures", pipeline)
        return cls(**known_fields(cls, data)) if data else None

    @classmethod
    def record(
        cls, pipeline: str, batch: int, cause: str, now: float | None = None, fence: Lease | None = None
    ) -> Self:
        """Count one more failure: the next in a row on ``batch``, or the first on a new one.
        A failure long after the last one starts counting again: an idle stream that meets a
        passing outage now and then, on the same next batch, is not failing in a loop."""
        now = time.time() if now is None else now
        last = cls.read(pipeline)
        if last is not None and last.batch == batch and now - last.last_at <= FORGET_AFTER:
            failures = cls(pipeline, batch, last.count + 1, cause, last.first_at, now)
        else:
            failures = cls(pipeline, batch, 1, cause, now, now)
        store().put("failures", pipeline, asdict(failures), fence=fence)
        return failures

    @staticmethod
    def clear(pipeline: str, fence: Lease | None = None) -> None:
        store().delete("failures", pipeline, fence=fence)
