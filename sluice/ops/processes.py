"""The processes a launch starts on this host: spark-submit started detached, found again by
its pid and command line, its log's tail, and its end (SIGTERM, then the process group).

Apart from :mod:`sluice.ops.drivers` so that what needs only these (the SQL endpoint's
commands) does not import the spec loader."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from sluice import config, faults
from sluice.errors import IntentChanged
from sluice.records.run import Desired, Driver

#: The job's file name: a process whose command line names it is a Sluice driver.
DRIVER_SCRIPT = "ingest.py"


def process_named(pid: int | None, marker: str = DRIVER_SCRIPT) -> psutil.Process | None:
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


def alive(pid: int) -> bool:
    """Is the process there and not a zombie? (Right after a launch, when the pid cannot have
    been reused, and while spark-submit execs Java its command line may read empty.)"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def launch_detached(
    name: str,
    command: list[str],
    env: dict[str, str],
    *,
    launched_by: str,
    desired: Desired = "running",
    owner: str = "",
    as_of: int | None = None,
) -> Driver:
    """Record the launch (the ``driver`` record), then start spark-submit detached (own session,
    output to a log file on this host).

    The record is written with a compare-and-set on ``as_of``, the version of the record the
    decision to launch was made on (0: there was none; None: the record as it is now, for a
    person's own launch): if anyone wrote it since (a person's stop), nothing is started and
    :class:`IntentChanged` says why. A stop recorded after that is the launched job's to read
    (its owner is the launch's): it stops before its first batch."""
    if as_of is None:
        now = Driver.read(name)
        as_of = now.version if now else 0
    logs = config.sluice_home() / "logs" / name
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / time.strftime("%Y%m%dT%H%M%S.log", time.gmtime())
    driver = Driver(name, 0, command, str(log), time.time(), launched_by, desired, owner=owner, version=as_of)
    if not driver.save_if_unchanged():
        now = Driver.read(name)
        why = (
            f"it was stopped by {now.stopped_by} meanwhile"
            if now and now.desired == "stopped"
            else "it changed meanwhile"
        )
        raise IntentChanged(f"{name}: not started: {why} (its driver record was read before); nothing was launched")
    faults.point("launch.recorded")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=os.environ | env,
            start_new_session=True,  # survives the task that launched it; stoppable as a group
        )
    driver.pid = proc.pid
    while not driver.save_if_unchanged():  # a stop was recorded meanwhile: keep it, add the pid
        now = Driver.read(name)
        if now is None or now.owner != owner:
            break  # another launch's record (this one's job finds the leases taken and exits)
        now.pid, driver = proc.pid, now
    return driver


def log_tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def terminate(proc: psutil.Process, group: psutil.Process | None, *, timeout: float, grace: float) -> bool:
    """SIGTERM to the Python driver, then wait for it and spark-submit (``group``, the leader
    of its process group); past ``timeout`` the group is terminated, past ``grace`` more
    killed. True when it stopped by itself."""
    proc.send_signal(signal.SIGTERM)
    waiting = [p for p in (proc, group) if p is not None]
    _, alive = psutil.wait_procs(waiting, timeout=timeout)
    if not alive:
        return True
    for p in alive:
        os.killpg(os.getpgid(p.pid), signal.SIGTERM)
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)
    return False
