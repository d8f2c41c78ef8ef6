"""The stream's actions: start, stop, restart and rebuild, as the CLI and the Airflow tasks call them.

A streaming job runs for weeks, so neither ``sluice`` nor an Airflow task may wait on it: a
start launches its driver detached (:mod:`sluice.ops.drivers`) and returns once the query
runs; a stop is recorded with a compare-and-set, reaches the driver on whichever host it runs,
and lets the batch in progress commit. Supervision and status are in
:mod:`sluice.ops.supervision`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from sluice.errors import AlreadyRunning, InvalidInput, StartFailed, StopFailed
from sluice.ops.drivers import already_running, is_drivers, launch, running, wait_running
from sluice.ops.processes import log_tail, process_named, terminate
from sluice.ops.submit import ingest_submission
from sluice.ops.target import SparkTarget
from sluice.records.run import Driver, Failures, Status, record_stop
from sluice.spec import Pipeline
from sluice.spec.model import normalize_duration
from sluice.state import hostname
from sluice.state import lease as leases
from sluice.topics import total_partitions


def continuous_conf(pipeline: Pipeline, master: str) -> dict[str, str]:
    """A continuous branch runs one long-lived task per Kafka partition. On a local master
    that many cores must be there (raises ContinuousError); on a cluster the application asks
    for them, since a shared standalone master gives each application only its default share
    and a branch short of slots hangs without an error."""
    if pipeline.spec.mode != "continuous":
        return {}
    from sluice.spec.continuous import precheck, required_slots

    src = pipeline.kafka
    partitions = total_partitions(src.bootstrap_servers, src.topics or [])
    precheck(pipeline.name, partitions, master)
    return {} if required_slots(master) is not None else {"spark.cores.max": str(partitions)}


#: How long a continuous branch on a cluster may wait for its cores.
CORES_TIMEOUT = 90.0


def wait_cores(pipeline: Pipeline, target: SparkTarget, started: Started, needed: int) -> None:
    """A continuous branch on a cluster runs once the master grants it a core per partition;
    short of them its query reports running and reads nothing. Wait for them; stop it and say
    so when the cluster does not give them (other applications hold the cores)."""
    app_id = started.status.app_id
    deadline = time.monotonic() + CORES_TIMEOUT
    while app_id and (cores := target.app_cores(app_id)) is not None and cores < needed:
        if time.monotonic() > deadline:
            stop(pipeline, by="start: too few cores")
            raise StartFailed(
                f"{pipeline.name}: the Spark cluster granted {cores} of the {needed} cores a continuous branch "
                f"needs (one per Kafka partition) within {CORES_TIMEOUT:.0f}s, so it would read nothing; it was "
                f"stopped. Free cores on the cluster (other applications hold them) or add workers, then start it again."
            )
        time.sleep(1)


# --- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    driver: Driver
    status: Status

    def summary(self) -> str:
        return (
            f"started {self.driver.pipeline}: spark-submit pid {self.driver.pid}, Python driver pid {self.status.pid}, "
            f"Spark app {self.status.app_id}, "
            f"{self.status.state}, log {self.driver.log}"
        )

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.driver.log, lines)


def start(
    pipeline: Pipeline,
    target: SparkTarget,
    *,
    by: str,
    available_now: bool = False,
    processing_time: str | None = None,
    timeout: float = 180.0,
    fresh: bool = True,
    rebuild: bool = False,
    as_of: int | None = None,
) -> Started:
    """Launch the stream detached and wait until its query runs (or, run-once, has finished).

    A start a person asks for is ``fresh``: it forgets the failures in a row that made
    supervision give up, so that a changed rule or fixed data gets its own tries.
    Supervision's restarts are not, and pass ``as_of``: the version of the driver record they
    decided on, so that a stop recorded since wins (:class:`IntentChanged`).
    """
    if as_of is None:
        now = Driver.read(pipeline.name)
        as_of = now.version if now else 0
    held = running(pipeline)
    if held is not None:
        raise AlreadyRunning(already_running(pipeline, held))
    if fresh:
        Failures.clear(pipeline.name)
    if processing_time is not None:
        try:
            processing_time = normalize_duration(processing_time)  # '1h' reaches Spark as '1 hour'
        except ValueError as exc:
            raise InvalidInput(f"processing time: {exc}") from None
    continuous = pipeline.spec.mode == "continuous"
    # Run-once when asked, or when the spec says so and no interval overrides it.
    once = not continuous and (available_now or (processing_time is None and pipeline.spec.trigger.available_now))
    conf = continuous_conf(pipeline, target.master)
    sub = ingest_submission(
        pipeline.spec_path,
        pipeline_name=pipeline.name,
        available_now=once,
        processing_time=None if continuous else processing_time,
        rebuild=rebuild,
        conf=conf,
    )
    command, env = target.launch_command(sub)
    driver = launch(pipeline, command, env, launched_by=by, desired="once" if once else "running", as_of=as_of)
    try:
        started = Started(driver, wait_running(pipeline, driver, timeout))
        if "spark.cores.max" in conf:
            wait_cores(pipeline, target, started, int(conf["spark.cores.max"]))
        return started
    except StartFailed:
        # Its leases, unless the job took them over (then it gives them up as it exits).
        leases.expire(leases.claims_for(pipeline), driver.owner, pid=os.getpid())
        raise


def stop(pipeline: Pipeline, *, by: str, timeout: float = 120.0, grace: float = 30.0) -> str:
    """Stop the stream after the batch in progress commits; say what was done.

    SIGTERM goes to the Python driver, whose handler lets the running batch commit and then
    stops the query; spark-submit's JVM exits with it. Only if that takes longer than
    ``timeout`` is the whole process group terminated, and killed after ``grace`` more
    seconds (the checkpoint makes that safe too).
    Supervision does not restart a stream stopped here: the stop is recorded with a
    compare-and-set, so a supervision that read the record before it cannot write over it.
    """
    driver = record_stop(pipeline.name, by)  # the driver reads it within a second, on whichever host it runs
    held = running(pipeline)
    if held is None:
        return f"{pipeline.name} is not running; it stays stopped"
    started = time.monotonic()
    proc = process_named(held.pid) if held.host == hostname() else None
    if proc is None:  # on another host: it stops by itself once its batch commits
        if not _released(pipeline, timeout):
            raise StopFailed(
                f"{pipeline.name} on {held.host} was asked to stop {timeout:.0f}s ago and still holds its lease; "
                f"it stops by itself when it next reaches the run-state store, or its lease expires"
            )
        return f"stopped {pipeline.name} gracefully on {held.host} in {time.monotonic() - started:.1f}s"
    group = is_drivers(process_named(driver.pid), pipeline, driver.launched_at) if driver.pid else None
    if terminate(proc, group, timeout=timeout, grace=grace):
        return f"stopped {pipeline.name} gracefully in {time.monotonic() - started:.1f}s (Python driver pid {proc.pid})"
    return f"{pipeline.name} did not stop within {timeout:.0f}s; terminated its process group (restart resumes from the checkpoint)"


def _released(pipeline: Pipeline, timeout: float) -> bool:
    """Wait until no driver holds the pipeline's name; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while running(pipeline) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


@dataclass(frozen=True)
class Restarted:
    stopped: str | None  # what stopping said; None when it was not running
    started: Started


def restart(
    pipeline: Pipeline,
    target: SparkTarget,
    *,
    by: str,
    available_now: bool = False,
    processing_time: str | None = None,
) -> Restarted:
    """Stop the stream if it runs (after its batch commits), then start it from its checkpoint."""
    stopped = stop(pipeline, by=by) if running(pipeline) is not None else None
    return Restarted(
        stopped, start(pipeline, target, by=by, available_now=available_now, processing_time=processing_time)
    )


def rebuild(pipeline: Pipeline, target: SparkTarget, *, by: str, available_now: bool = False) -> Restarted:
    """Recompute a derived pipeline from its upstream table as it is now: stop it, then start
    it with its checkpoint, table and quarantine deleted (by the job, under its claims)."""
    if pipeline.upstream is None:
        raise InvalidInput(
            f"{pipeline.name} reads Kafka, not a table: only a pipeline derived from another pipeline's table "
            "is rebuilt (Kafka may no longer hold what its table has)"
        )
    stopped = stop(pipeline, by=by) if running(pipeline) is not None else None
    return Restarted(stopped, start(pipeline, target, by=by, available_now=available_now, rebuild=True))
