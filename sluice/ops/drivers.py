"""A stream's driver processes: launched detached under the pipeline's leases, found again
through the lease on any host, and waited for until the job reports its query running.

The launch takes the pipeline's leases (:mod:`sluice.state.lease`), starts spark-submit in
its own session and records how it was started (``driver``); the job adopts the leases,
renews them, and reports its state, Spark application id and last progress (``status``).
All of it lives in the run-state store (:mod:`sluice.state`), so any host sees which driver
runs where.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

from sluice.errors import AlreadyRunning, StartFailed
from sluice.ops.processes import alive, launch_detached, log_tail, process_named
from sluice.records.run import Desired, Driver, Status
from sluice.spec import Pipeline
from sluice.state import hostname
from sluice.state import lease as leases
from sluice.state.lease import Claimed, Holder

#: How long after its record a recorded process may have started (the record is written
#: right after the launch, the driver's status right after it starts).
_START_SLACK = 5.0


def is_drivers(proc: psutil.Process | None, pipeline: Pipeline, recorded_at: float) -> psutil.Process | None:
    """``proc`` if it runs this pipeline's spec and started before its record was written: a
    pid in a run record can name another pipeline's driver, or anything, once pids are reused
    (a container restart begins counting again)."""
    if proc is None:
        return None
    try:
        cmd, started, cwd = proc.cmdline(), proc.create_time(), proc.cwd()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    spec = cmd[cmd.index("--spec") + 1] if "--spec" in cmd[:-1] else None
    if spec is None or started > recorded_at + _START_SLACK:
        return None
    if spec == pipeline.name or os.path.realpath(os.path.join(cwd, spec)) == os.path.realpath(pipeline.spec_path):
        return proc
    return None


def running(pipeline: Pipeline) -> Holder | None:
    """Who runs the pipeline's stream now, on any host: the live holder of its name's lease
    (its driver, or the action launching it)."""
    return leases.running(pipeline.name)


def driver_process(pipeline: Pipeline) -> psutil.Process | None:
    """The running Python driver of this pipeline's stream, if it runs on this host."""
    held = running(pipeline)
    if held is None or held.host != hostname():
        return None
    return process_named(held.pid)


#: How long a launch holds the leases for the job it starts, which adopts them once it runs.
LAUNCH_TTL = 240.0


def launch(
    pipeline: Pipeline,
    command: list[str],
    env: dict[str, str],
    *,
    launched_by: str,
    desired: Desired = "running",
    as_of: int | None = None,
) -> Driver:
    """Take the pipeline's leases and start its job detached (see :func:`launch_detached`);
    the job adopts the leases. Raises :class:`AlreadyRunning` if the stream runs (or is being
    launched) anywhere, :class:`sluice.state.lease.Claimed` if another pipeline's driver
    holds its checkpoint or tables (the job would refuse to start anyway, less visibly), and
    :class:`IntentChanged` if the driver record is no longer at version ``as_of`` (None: the
    launch is a person's own, against the record as it is now)."""
    owner = uuid.uuid4().hex
    try:
        lease = leases.take(pipeline.name, leases.claims_for(pipeline), owner, ttl=LAUNCH_TTL)
    except Claimed as exc:
        if exc.holder is not None and exc.holder.pipeline == pipeline.name:  # another launch won the race
            raise AlreadyRunning(already_running(pipeline, exc.holder)) from None
        raise
    try:
        return launch_detached(
            pipeline.name,
            command,
            env | {leases.OWNER_ENV: owner},
            launched_by=launched_by,
            desired=desired,
            owner=owner,
            as_of=as_of,
        )
    except BaseException:
        leases.release(lease)
        raise


def already_running(pipeline: Pipeline, holder: Holder) -> str:
    where = "" if holder.host == hostname() else f" on {holder.host}"
    return (
        f"{pipeline.name} is already running{where}; restart it to apply new settings (`sluice status {pipeline.name}`)"
    )


def wait_running(pipeline: Pipeline, driver: Driver, timeout: float = 180.0) -> Status:
    """Wait until the job reports its query running (or finished, for a run-once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Status.read(pipeline.name)
        if status and status.updated_at >= driver.launched_at and status.state != "starting":
            if status.state == "failed":
                raise StartFailed(f"{pipeline.name} failed to start: {status.error}\n{log_tail(driver.log)}")
            return status
        if not alive(driver.pid):
            raise StartFailed(f"{pipeline.name}: spark-submit (pid {driver.pid}) exited\n{log_tail(driver.log)}")
        time.sleep(0.2)
    raise StartFailed(f"{pipeline.name} did not report a running query within {timeout:.0f}s\n{log_tail(driver.log)}")
