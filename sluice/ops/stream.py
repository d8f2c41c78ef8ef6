"""Run a pipeline's stream detached, find it again, judge its health, stop it gracefully.

A streaming job runs for weeks, so neither ``sluice`` nor an Airflow task may wait on it.
:func:`launch` starts spark-submit in its own session and records how to find it
(``driver.json``); the job itself reports its state, Spark application id and last
progress (``status.json``, written by ``jobs/ingest.py`` every second). Both files live in
``$SLUICE_HOME/run/<pipeline>/`` on the machine that runs the driver (Python drivers always
run in client mode, even on a cluster).

Supervision reads those two files, the checkpoint's commit log and the broker's end
offsets (Spark never commits offsets to Kafka), and :func:`assess` decides: start, restart
from the checkpoint, nothing, or fail loudly because the stream is stalled or lagging.
This module is pure Python: the Airflow tasks and the CLI both call it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from sluice import config
from sluice.records import locks
from sluice.records.checkpoint import Committed, read_committed
from sluice.spec import Pipeline, duration_seconds
from sluice.topics import end_offsets, list_topics

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
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


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
    def read(cls, pipeline: str) -> Driver | None:
        data = read_json(run_dir(pipeline) / "driver.json")
        return cls(**data) if data else None

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
    def read(cls, pipeline: str) -> Status | None:
        data = read_json(run_dir(pipeline) / "status.json")
        if not data:
            return None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _process(pid: int | None, marker: str) -> psutil.Process | None:
    """The live process with this pid, if its command line still names ``marker`` (pids get reused)."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or not any(
            os.path.basename(part) == marker for part in proc.cmdline()
        ):
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _alive(pid: int) -> bool:
    """Is the process there and not a zombie? (Right after a launch, when the pid cannot have
    been reused, and while spark-submit execs Java its command line may read empty.)"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def driver_process(pipeline: Pipeline) -> psutil.Process | None:
    """The running Python driver of this pipeline's stream, whoever started it."""
    status = Status.read(pipeline.name)
    if status and status.state in ("starting", "running"):
        proc = _process(status.pid, "ingest.py")
        if proc is not None:
            return proc
    driver = Driver.read(pipeline.name)
    return _process(driver.pid, "ingest.py") if driver else None


def launch(
    pipeline: Pipeline,
    command: list[str],
    env: dict[str, str],
    *,
    launched_by: str,
    desired: Desired = "running",
) -> Driver:
    """Start spark-submit detached (own session, output to a log file) and record it.

    Raises :class:`sluice.records.locks.Claimed` first if another driver holds the pipeline's
    checkpoint or tables (the job would refuse to start anyway, less visibly).
    """
    locks.check_free(pipeline.name, locks.claims_for(pipeline))
    logs = config.sluice_home() / "logs" / pipeline.name
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / time.strftime("%Y%m%dT%H%M%S.log", time.gmtime())
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=os.environ | env,
            start_new_session=True,  # survives the task that launched it; stoppable as a group
        )
    driver = Driver(pipeline.name, proc.pid, command, str(log), time.time(), launched_by, desired)
    driver.save()
    return driver


class StartFailed(RuntimeError):
    pass


def log_tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def wait_running(pipeline: Pipeline, driver: Driver, timeout: float = 180.0) -> Status:
    """Wait until the job reports its query running (or finished, for a run-once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Status.read(pipeline.name)
        if status and status.updated_at >= driver.launched_at and status.state != "starting":
            if status.state == "failed":
                raise StartFailed(f"{pipeline.name} failed to start: {status.error}\n{log_tail(driver.log)}")
            return status
        if not _alive(driver.pid):
            raise StartFailed(f"{pipeline.name}: spark-submit (pid {driver.pid}) exited\n{log_tail(driver.log)}")
        time.sleep(1)
    raise StartFailed(f"{pipeline.name} did not report a running query within {timeout:.0f}s\n{log_tail(driver.log)}")


def stop(pipeline: Pipeline, *, stopped_by: str, timeout: float = 120.0) -> str:
    """Stop the stream after the batch in progress commits; say what was done.

    SIGTERM goes to the Python driver, whose handler lets the running batch commit and then
    stops the query; spark-submit's JVM exits with it. Only if that takes longer than
    ``timeout`` is the whole process group terminated (the checkpoint makes that safe too).
    """
    driver = Driver.read(pipeline.name)
    if driver is not None:
        driver.desired, driver.stopped_at, driver.stopped_by = "stopped", time.time(), stopped_by
        driver.save()
    proc = driver_process(pipeline)
    if proc is None:
        return f"{pipeline.name} is not running; it stays stopped"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    group = _process(driver.pid, "ingest.py") if driver else None
    waiting = [p for p in (proc, group) if p is not None]
    _, alive = psutil.wait_procs(waiting, timeout=timeout)
    if not alive:
        return f"stopped {pipeline.name} gracefully in {time.monotonic() - started:.1f}s (driver pid {proc.pid})"
    for p in alive:
        os.killpg(os.getpgid(p.pid), signal.SIGTERM)
    _, alive = psutil.wait_procs(alive, timeout=30)
    for p in alive:
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    return f"{pipeline.name} did not stop within {timeout:.0f}s; terminated its process group (restart resumes from the checkpoint)"


# --- health ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """Everything supervision looked at, in numbers."""

    desired: Desired | None  # None: never launched here
    alive: bool
    state: str | None = None  # the job's last reported state
    error: str | None = None
    lag: int | None = None  # records in Kafka not yet committed
    since_commit: float | None = None  # seconds since the last committed batch
    since_start: float | None = None  # seconds since the running driver was launched
    since_heartbeat: float | None = None  # seconds since the job last wrote its status


Action = Literal["start", "restart", "none", "unhealthy"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str


def assess(obs: Observation, *, max_stall: float, max_lag: int | None) -> Verdict:
    """Decide what supervision does. Pure: every input is in ``obs``."""
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


def broker_end_offsets(pipeline: Pipeline) -> dict[str, dict[int, int]]:
    """End offsets of the pipeline's topics (a topic pattern is matched against the broker's topics)."""
    src = pipeline.spec.source
    topics = list(src.topics or [])
    if not topics and src.topic_pattern:
        topics = [t for t in list_topics(src.bootstrap_servers) if re.fullmatch(src.topic_pattern, t)]
    return {t: end_offsets(src.bootstrap_servers, t) for t in topics}


def observe(pipeline: Pipeline, now: float | None = None) -> tuple[Observation, Committed]:
    now = time.time() if now is None else now
    driver, status = Driver.read(pipeline.name), Status.read(pipeline.name)
    proc = driver_process(pipeline)
    committed = read_committed(pipeline.checkpoint_path)
    lag = committed.lag(broker_end_offsets(pipeline))
    since_start = None
    if proc is not None:
        since_start = now - proc.create_time()
    obs = Observation(
        desired=driver.desired if driver else ("running" if proc is not None else None),
        alive=proc is not None,
        state=status.state if status else None,
        error=status.error if status else None,
        lag=lag,
        since_commit=None if committed.committed_at is None else now - committed.committed_at,
        since_start=since_start,
        since_heartbeat=None if status is None or proc is None else now - status.updated_at,
    )
    return obs, committed


class StreamUnhealthy(RuntimeError):
    """The stream runs but does not keep up: a person has to look."""


def supervise(pipeline: Pipeline, start: Callable[[], Driver]) -> tuple[Verdict, Observation]:
    """One idempotent supervision pass: start or restart if needed, raise if unhealthy."""
    obs, _ = observe(pipeline)
    s = pipeline.spec.supervision
    verdict = assess(obs, max_stall=duration_seconds(s.max_stall), max_lag=s.max_lag)
    if verdict.action == "unhealthy":
        raise StreamUnhealthy(f"{pipeline.name}: {verdict.reason}")
    if verdict.action in ("start", "restart"):
        wait_running(pipeline, start())
    return verdict, obs
