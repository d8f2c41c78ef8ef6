"""Is a stream healthy, and what should supervision do? Pure: every input is a number.

:func:`sluice.ops.supervision.status` gathers an :class:`Observation` (the run files, the
checkpoint's commit log, the broker's end offsets or the upstream table's versions);
:func:`assess` turns it into a :class:`Verdict`: start, restart from the checkpoint, wait
before restarting a stream that just failed, nothing, or fail loudly because the stream is
stalled, lagging, or failed on the same batch too many times in a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.records.run import Desired


@dataclass(frozen=True)
class Observation:
    """Everything supervision looked at, in numbers."""

    desired: Desired | None  # None: never launched here
    alive: bool
    state: str | None = None  # the job's last reported state
    error: str | None = None
    lag: int | None = None  # records in Kafka not yet committed; None: unknown (broker unreachable)
    #: What ``lag`` counts, and where it waits: a derived pipeline's upstream table has versions (Delta) or files.
    lag_unit: str = "records"
    lag_source: str = "Kafka"
    since_commit: float | None = None  # seconds since the last committed batch
    since_start: float | None = None  # seconds since the running driver was launched
    since_heartbeat: float | None = None  # seconds since the job last wrote its status
    #: Runs in a row that failed on the batch a restart runs next (see sluice.records.run.Failures).
    failures: int = 0
    failed_batch: int | None = None
    since_failure: float | None = None  # seconds since the last of them failed


#: ``wait``: the stream failed and is restarted once its back-off has passed;
#: ``failed``: it failed on the same batch too often to restart it again.
Action = Literal["start", "restart", "wait", "none", "unhealthy", "failed"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    failing: bool = False  # its last run failed: running it again may not help

    @property
    def healthy(self) -> bool:
        return self.action not in ("unhealthy", "failed") and not self.failing


def backoff_seconds(failures: int, first: float) -> float:
    """How long to wait before the next restart after ``failures`` failures in a row: doubling."""
    return first * 2 ** max(0, failures - 1)


def assess(
    obs: Observation,
    *,
    max_stall: float,
    max_lag: int | None,
    max_failures: int = 3,
    backoff: float = 0.0,
    name: str = "<pipeline>",
    start_new: bool = True,
) -> Verdict:
    """Decide what supervision does. Without ``start_new`` (a scheduled supervision, unless
    the spec says ``autostart``) it keeps up a stream someone started, and starts none."""
    if not obs.alive and obs.desired == "running" and obs.state == "failed" and obs.failures:
        return _after_failure(obs, max_failures, backoff, name)
    if not obs.alive:
        if obs.desired is None and not start_new:
            return Verdict(
                "none", f"not started yet, so not supervised: start it (action=start, or `sluice start {name}`)"
            )
        if obs.desired is None:
            return Verdict("start", "no run of this pipeline is recorded; starting it")
        if obs.desired == "stopped":
            return Verdict("none", "stopped on request; not restarting it (trigger action=start to resume)")
        if obs.desired == "once":
            if obs.state == "failed":
                return Verdict("unhealthy", f"the run-once (available-now) job failed: {obs.error}")
            return Verdict("none", f"the run-once (available-now) job ended ({obs.state or 'no status'})")
        why = f"it failed: {obs.error}" if obs.state == "failed" and obs.error else f"last state: {obs.state}"
        return Verdict("restart", f"the stream is not running ({why}); restarting it from its checkpoint")
    if obs.since_heartbeat is not None and obs.since_heartbeat > max_stall:
        return Verdict(
            "unhealthy",
            f"stalled: the driver is alive but has not reported for {obs.since_heartbeat:.0f}s (max_stall {max_stall:.0f}s)",
        )
    # Time before this driver started is not its fault: count from its start at the earliest.
    idle = min((t for t in (obs.since_commit, obs.since_start) if t is not None), default=None)
    if obs.lag and idle is not None and idle > max_stall:
        return Verdict(
            "unhealthy",
            f"stalled: {obs.lag} {obs.lag_unit} wait in {obs.lag_source} and no batch has committed for {idle:.0f}s (max_stall {max_stall:.0f}s)",
        )
    if max_lag is not None and obs.lag is not None and obs.lag > max_lag:
        return Verdict("unhealthy", f"lagging: {obs.lag} records behind the broker (max_lag {max_lag})")
    lag = "unknown" if obs.lag is None else str(obs.lag)
    ago = "none yet" if obs.since_commit is None else f"{obs.since_commit:.0f}s ago"
    return Verdict("none", f"healthy: running, last batch committed {ago}, lag {lag} {obs.lag_unit}")


def _after_failure(obs: Observation, max_failures: int, backoff: float, name: str) -> Verdict:
    """A stream whose last run failed: restart it after a back-off, or give up on it."""
    tries = f"{obs.failures} of {max_failures} tries"
    if obs.failures >= max_failures:
        return Verdict(
            "failed",
            f"failed {obs.failures} times in a row on batch {obs.failed_batch}, so it is not restarted again: "
            f"{obs.error}. Once the cause is dealt with, start it again (`sluice start {name}`, or action=start)",
            failing=True,
        )
    wait = backoff_seconds(obs.failures, backoff) - (obs.since_failure or 0.0)
    if wait > 0:
        return Verdict(
            "wait",
            f"failed on batch {obs.failed_batch} ({tries}): {obs.error}; restarting in {wait:.0f}s",
            failing=True,
        )
    return Verdict(
        "restart",
        f"failed on batch {obs.failed_batch} ({tries}): {obs.error}; restarting it from its checkpoint",
        failing=True,
    )
