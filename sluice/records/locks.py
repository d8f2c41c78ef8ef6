"""Claims on what a driver writes: its checkpoint, and its tables.

Two drivers on one checkpoint corrupt it (Spark notices only when both log the same batch,
with ``CONCURRENT_STREAM_LOG_UPDATE``, after one of them wrote it), and two streams
appending to one table write every record twice. So before it starts, a driver claims its
checkpoint, and each table it writes in a role: ``stream`` (one live stream per table) or
``backfill`` (one at a time: a backfill writes beside the live stream, on its own
checkpoint, but two backfills would both copy the same missing records). A stream also
claims its name, whose run folder holds its status for supervision.

A claim is an exclusive ``flock`` on a file under ``$SLUICE_HOME/run/locks/`` named after
the claimed path, not after the pipeline, so specs with different names that share a
checkpoint or a table meet on the same lock. The kernel releases it when the process
exits, however it exits. Claims cover the drivers started from one ``SLUICE_HOME``, which
is where Sluice runs its drivers (client mode, on the machine that launched them).

Example::

    with claim(pipeline.name, claims_for(pipeline)):
        ...                       # raises Claimed, naming the holder, if another driver has one
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import psutil

from sluice import config
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.spec import Pipeline

Role = Literal["checkpoint", "stream", "backfill", "name", "commit"]


class Claimed(SluiceError):
    """Another driver holds a claim this one needs."""


@dataclass(frozen=True)
class Claim:
    path: str
    role: Role


@dataclass(frozen=True)
class Holder:
    pid: int
    pipeline: str


def normalize(path: str) -> str:
    """One spelling per place: local paths resolved (symlinks too), URIs without a trailing /."""
    if path.startswith("file:"):
        path = "/" + path.removeprefix("file:").lstrip("/")
    if "://" in path:
        return path.rstrip("/")
    return os.path.realpath(path)


def lock_file(claim: Claim) -> Path:
    key = normalize(claim.path)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", key.rstrip("/").rsplit("/", 1)[-1])[:40]
    return config.sluice_home() / "run" / "locks" / f"{readable}-{digest}.{claim.role}.lock"


def claims_for(pipeline: Pipeline, backfill_id: str | None = None) -> list[Claim]:
    """What a driver claims: its checkpoint, and its tables as the stream or as a backfill
    (which runs on a checkpoint of its own). A continuous branch writes topics, not tables."""
    role: Role = "stream" if backfill_id is None else "backfill"
    checkpoint = pipeline.checkpoint_path if backfill_id is None else pipeline.backfill_checkpoint_path(backfill_id)
    tables = [] if pipeline.spec.sink.format == "kafka" else [pipeline.sink_path, pipeline.quarantine_path]
    claims = [Claim(checkpoint, "checkpoint"), *(Claim(t, role) for t in tables)]
    if backfill_id is None:  # its status and supervision records live under run/<name>/
        claims.append(Claim(str(config.sluice_home() / "run" / pipeline.name), "name"))
    return claims


def _explain(name: str, claim: Claim, holder: Holder) -> str:
    who = f"{holder.pipeline!r} (driver pid {holder.pid})"
    if claim.role == "checkpoint":
        return (
            f"{name}: the checkpoint {claim.path} is in use by {who}; two drivers on one checkpoint "
            f"corrupt it. Stop that one first (sluice stop {holder.pipeline})"
        )
    if claim.role == "stream":
        return (
            f"{name}: the table {claim.path} is written by the stream of {who}; a second stream into one "
            f"table would write its records twice. Give {name} its own sink.path, or stop {holder.pipeline}"
        )
    if claim.role == "backfill":
        return f"{name}: a backfill of {who} is writing to {claim.path}; run one backfill of a table at a time"
    return f"{name}: another driver named {name!r} runs (pid {holder.pid}); stop it first (sluice stop {name})"


def _read_holder(handle: IO[str]) -> Holder:
    handle.seek(0)
    try:
        data = json.loads(handle.read() or "{}")
        return Holder(int(data.get("pid", 0)), str(data.get("pipeline", "?")))
    except (ValueError, TypeError):
        return Holder(0, "?")


#: How long to wait for a claim whose holder is dead or dying (killed, its threads still exiting).
DYING_HOLDER_WAIT = 10.0


def _dying(pid: int) -> bool:
    """Gone, a zombie, or exiting: a process that exits releases its memory (its command line
    reads empty) before its open files, and turns zombie only after that."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE or not proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def _take(handle: IO[str], name: str, claim: Claim) -> None:
    """Lock the open claim file; refuse at once if a live driver holds it. A killed driver
    closes its files last as it exits, so its claim can outlive it by a moment: wait for that."""
    deadline = time.monotonic() + DYING_HOLDER_WAIT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _read_holder(handle)
            if not _dying(holder.pid) or time.monotonic() > deadline:
                raise Claimed(_explain(name, claim, holder)) from None
            time.sleep(0.05)


def _open(claim: Claim) -> IO[str]:
    path = lock_file(claim)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a+", encoding="utf-8")


def _record_holder(handle: IO[str], name: str, claim: Claim) -> None:
    """Write who holds the (locked) claim, for the message of whoever is refused it."""
    handle.truncate(0)
    handle.write(json.dumps({"pid": os.getpid(), "pipeline": name, "path": claim.path, "role": claim.role}))
    handle.flush()


@contextmanager
def claim(name: str, claims: list[Claim]) -> Iterator[None]:
    """Hold every claim for the body (all or none); raise :class:`Claimed` naming a holder."""
    handles: list[IO[str]] = []
    try:
        for c in claims:
            handle = _open(c)
            handles.append(handle)
            _take(handle, name, c)
            _record_holder(handle, name, c)
        yield
    finally:
        for held in handles:
            held.close()  # closing releases the flock


@contextmanager
def hold(claim: Claim, timeout: float = 120.0) -> Iterator[None]:
    """Hold one claim for a short critical section, waiting for it if another process has
    it (a Parquet table's commit: list the log, then add the next number, as one step)."""
    deadline = time.monotonic() + timeout
    with _open(claim) as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Claimed(
                        f"{claim.path}: waited {timeout:.0f}s for {claim.role} ({_read_holder(handle)})"
                    ) from None
                time.sleep(0.01)
        _record_holder(handle, "-", claim)
        yield


def check_free(name: str, claims: list[Claim]) -> None:
    """Raise :class:`Claimed` if a driver holds any of ``claims`` now (for a launcher to ask first)."""
    with claim(name, claims):
        pass
