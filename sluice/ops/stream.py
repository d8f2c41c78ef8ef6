"""The stream's actions: start, stop, restart, supervise and status.

A streaming job runs for weeks, so neither ``sluice`` nor an Airflow task may wait on it.
:func:`launch` takes the pipeline's leases (see :mod:`sluice.records.locks`), starts
spark-submit in its own session, and records how it was started (``driver``); the job adopts
the leases, renews them, and reports its state, Spark application id and last progress
(``status``). All of it lives in the run-state store (:mod:`sluice.state`), so any host sees
which driver runs where, and a stop asked for on one host reaches a driver on another.

Supervision reads those records, the lease (the driver's liveness), the checkpoint's commit
log and the broker's end offsets (Spark never commits offsets to Kafka), and
:func:`sluice.ops.health.assess` decides. Every action here is called as it is by the CLI
and by the Airflow tasks.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from confluent_kafka import KafkaException

from sluice import faults
from sluice.errors import AlreadyRunning, IntentChanged, InvalidInput, StartFailed, StopFailed, StreamUnhealthy
from sluice.ops.health import Observation, Verdict, assess
from sluice.ops.processes import alive, launch_detached, log_tail, process_named, terminate
from sluice.ops.submit import ingest_submission
from sluice.ops.target import SparkTarget
from sluice.records import audit as audits
from sluice.records.checkpoint import Committed, read_committed
from sluice.records.run import Desired, Driver, Failures, Status, SupervisionPass, record_stop
from sluice.records.tables import upstream_lag
from sluice.spec import Pipeline, duration_seconds
from sluice.spec.model import normalize_duration
from sluice.state import hostname
from sluice.state import lease as leases
from sluice.state.lease import Claimed, Holder
from sluice.topics import end_offsets, kafka_reason, list_topics, total_partitions

#: How long after its record a recorded process may have started (the record is written
#: right after the launch, the driver's status right after it starts).
_START_SLACK = 5.0


def _is_drivers(proc: psutil.Process | None, pipeline: Pipeline, recorded_at: float) -> psutil.Process | None:
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
    group = _is_drivers(process_named(driver.pid), pipeline, driver.launched_at) if driver.pid else None
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


#: Offsets of the pipeline's topics, by topic and partition (the broker's, or a test's).
EndOffsets = Callable[[Pipeline], dict[str, dict[int, int]]]


def broker_end_offsets(pipeline: Pipeline, timeout: float = 3.0) -> dict[str, dict[int, int]]:
    """End offsets of the pipeline's topics (a topic pattern is matched against the broker's
    topics); a broker that does not answer within ``timeout`` raises KafkaException. A derived
    pipeline reads a table, not Kafka: it has none."""
    if pipeline.upstream is not None:
        return {}
    src = pipeline.kafka
    topics = list(src.topics or [])
    if not topics and src.topic_pattern:
        topics = [t for t in list_topics(src.bootstrap_servers, timeout) if re.fullmatch(src.topic_pattern, t)]
    return {t: end_offsets(src.bootstrap_servers, t, timeout) for t in topics}


@dataclass(frozen=True)
class StreamStatus:
    """What ``sluice status`` shows and supervision decides from."""

    pipeline: str
    observation: Observation
    committed: Committed
    verdict: Verdict
    driver: Driver | None
    status: Status | None
    broker_error: str | None = None  # the broker did not answer: lag unknown
    rescued: audits.Rescued | None = None  # recent batches kept undeclared fields in _rescued
    holder: Holder | None = None  # the driver's lease: on which host, which epoch
    supervision: str = ""  # who supervises the stream, or why nothing does

    @property
    def healthy(self) -> bool:
        return self.verdict.healthy

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "healthy": self.healthy,
            "verdict": asdict(self.verdict),
            "observation": asdict(self.observation),
            "last_committed_batch": self.committed.batch_id,
            "driver": asdict(self.driver) if self.driver else None,
            "status": asdict(self.status) if self.status else None,
            "broker_error": self.broker_error,
            "rescued": asdict(self.rescued) if self.rescued else None,
            "lease": asdict(self.holder) if self.holder else None,
            "supervision": self.supervision,
        }


# Final states a driver reports on its way out, just before it releases its lease.
FINAL = ("finished", "stopped", "failed")


def status(
    pipeline: Pipeline, offsets: EndOffsets = broker_end_offsets, now: float | None = None, *, start_new: bool = True
) -> StreamStatus:
    """Observe the stream (without changing anything) and judge it (``start_new``: see :func:`assess`)."""
    now = time.time() if now is None else now
    driver, st = Driver.read(pipeline.name), Status.read(pipeline.name)
    held = running(pipeline)
    if held is not None and st is not None and st.state in FINAL and st.updated_at >= held.acquired_at:
        held = None  # the driver said it ended and is letting go of its lease: it is not running
    committed = read_committed(pipeline.checkpoint_path)
    lag, broker_error, lag_unit, lag_source = None, None, "records", "Kafka"
    up = pipeline.upstream
    if up is not None:  # it reads a table: its lag is what that table has that it has not read
        assert up.table_format is not None  # the loader refuses a derived pipeline over a topic
        lag = upstream_lag(pipeline.checkpoint_path, up.table_format.name, up.sink_path)
        lag_unit, lag_source = up.table_format.lag_unit, f"the table of {up.name}"
    else:
        try:
            lag = committed.lag(offsets(pipeline))
        except KafkaException as exc:
            broker_error = f"Kafka at {pipeline.kafka.bootstrap_servers} did not answer: {kafka_reason(exc)}"
    failures = Failures.read(pipeline.name)
    obs = Observation(
        desired=driver.desired if driver else ("running" if held is not None else None),
        alive=held is not None,
        state=st.state if st else None,
        error=st.error if st else None,
        lag=lag,
        lag_unit=lag_unit,
        lag_source=lag_source,
        since_commit=None if committed.committed_at is None else now - committed.committed_at,
        since_start=None if held is None else max(0.0, now - held.acquired_at),
        since_heartbeat=None if st is None or held is None else now - st.updated_at,
        failures=failures.count if failures else 0,
        failed_batch=failures.batch if failures else None,
        since_failure=None if failures is None else now - failures.last_at,
    )
    s = pipeline.spec.supervision
    verdict = assess(
        obs,
        max_stall=duration_seconds(s.max_stall),
        max_lag=s.max_lag if up is None else None,  # records in Kafka; a table's lag is versions or files
        max_failures=s.max_failures,
        backoff=duration_seconds(s.backoff),
        name=pipeline.name,
        start_new=start_new,
    )
    rescued = audits.rescued(pipeline) if pipeline.table_format else None
    supervision = supervised_by(pipeline, SupervisionPass.read(pipeline.name), now)
    return StreamStatus(pipeline.name, obs, committed, verdict, driver, st, broker_error, rescued, held, supervision)


def supervised_by(pipeline: Pipeline, last: SupervisionPass | None, now: float) -> str:
    """Who supervises the stream, or why nothing does: the last supervision pass against the
    DAG's schedule (a pass missing for two of its runs means nothing runs it now)."""
    dag, schedule = f"sluice_{pipeline.name}", pipeline.spec.supervision.schedule
    ago = "" if last is None else f"{_ago(now - last.at)} ago on {last.host} ({last.by})"
    if schedule is None or schedule in ("@once", "@continuous"):
        why = f"supervision.schedule is {schedule or 'null'}"
        return f"on demand only ({why}); last pass {ago}" if last else f"not supervised: {why}"
    if last is None:
        return f"not supervised: no supervision pass recorded (is DAG {dag} paused, or not deployed?)"
    from croniter import croniter

    runs = croniter(_cron(schedule), now)
    runs.get_prev(float)
    missed_since = runs.get_prev(float)  # the run before the latest: a pass since then is on time
    if last.at < missed_since - 60:
        return f"not supervised: the last supervision pass was {ago}; DAG {dag} runs {schedule}: is it paused?"
    return f"supervised: last pass {ago}; DAG {dag} runs {schedule}"


#: Airflow's presets as cron expressions (sluice.spec.model.SCHEDULE_PRESETS).
_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}


def _cron(schedule: str) -> str:
    return _PRESETS.get(schedule, schedule)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Supervised:
    status: StreamStatus
    started: Started | None = None  # set when this pass started or restarted the stream
    note: str | None = None  # why a start it decided on did not happen


def supervise(
    pipeline: Pipeline,
    target: SparkTarget,
    *,
    by: str,
    available_now: bool = False,
    processing_time: str | None = None,
    offsets: EndOffsets = broker_end_offsets,
    start_new: bool = True,
) -> Supervised:
    """One idempotent supervision pass: start or restart if needed, raise if unhealthy or failed.
    Without ``start_new`` a stream nobody started yet is left alone (see :func:`assess`).

    A driver that stopped reporting is restarted only once its lease has expired: no host can
    know sooner that it is dead (it may be paused, or cut off), and the launch takes the lease.
    The launch is recorded against the driver record this pass read, so a stop a person
    recorded meanwhile stands (the pass then starts nothing)."""
    SupervisionPass(pipeline.name, by, time.time()).save()
    st = status(pipeline, offsets, start_new=start_new)
    if st.verdict.action in ("unhealthy", "failed"):
        raise StreamUnhealthy(f"{pipeline.name}: {st.verdict.reason}")
    if st.verdict.action in ("start", "restart"):
        faults.point("supervise.decided")
        try:
            started = start(
                pipeline,
                target,
                by=by,
                available_now=available_now,
                processing_time=processing_time,
                fresh=False,
                as_of=st.driver.version if st.driver else 0,
            )
        except AlreadyRunning:  # another supervisor (another host's) started it a moment ago
            return Supervised(status(pipeline, offsets))
        except IntentChanged as exc:  # a person stopped it after this pass read its record
            return Supervised(status(pipeline, offsets), note=str(exc))
        return Supervised(st, started)
    return Supervised(st)
