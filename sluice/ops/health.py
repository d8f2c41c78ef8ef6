"""Is a stream healthy, and what should supervision do? Pure: every input is a number.

:func:`sluice.ops.stream.observe` gathers an :class:`Observation` (the run files, the
checkpoint's commit log, the broker's end offsets); :func:`assess` turns it into a
:class:`Verdict`: start, restart from the checkpoint, nothing, or fail loudly because the
stream is stalled or lagging.
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
    since_commit: float | None = None  # seconds since the last committed batch
    since_start: float | None = None  # seconds since the running driver was launched
    since_heartbeat: float | None = None  # seconds since the job last wrote its status


Action = Literal["start", "restart", "none", "unhealthy"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str


def assess(obs: Observation, *, max_stall: float, max_lag: int | None) -> Verdict:
    """Decide what supervision does."""
    if not obs.alive:
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
            f"stalled: {obs.lag} records wait in Kafka and no batch has committed for {idle:.0f}s (max_stall {max_stall:.0f}s)",
        )
    if max_lag is not None and obs.lag is not None and obs.lag > max_lag:
        return Verdict("unhealthy", f"lagging: {obs.lag} records behind the broker (max_lag {max_lag})")
    lag = "unknown" if obs.lag is None else str(obs.lag)
    ago = "none yet" if obs.since_commit is None else f"{obs.since_commit:.0f}s ago"
    return Verdict("none", f"healthy: running, last batch committed {ago}, lag {lag} records")
