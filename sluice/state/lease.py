"""The lease: one driver at a time on a checkpoint, a table and a pipeline's name, in one unit.

Two drivers on one checkpoint corrupt it (Spark notices only when both log the same batch,
with ``CONCURRENT_STREAM_LOG_UPDATE``, after one of them wrote it), and two streams
appending to one table write every record twice. So before it starts, a driver takes a
lease on its checkpoint, and on each table it writes in a role: ``stream`` (one live stream
per table) or ``backfill`` (one at a time: a backfill writes beside the live stream, on its
own checkpoint, but two backfills would both copy the same missing records). A stream also
takes its name, whose records supervision reads.

Leases are keyed by the claimed place, not by the pipeline, so specs with different names
that share a checkpoint or a table meet on the same lease. They live in the run-state store
(:mod:`sluice.state`), on one machine or across hosts, under the same rules, decided here in
the store's transactions:

- a lease is held by one driver for ``ttl`` seconds and renewed by its heartbeat
  (:class:`Fence`); its **epoch** grows each time it changes hands;
- it is free once it expires, or at once when its holder is a process of this host that is
  gone. No other host can know a driver is dead before its lease expires, so none takes it
  over sooner;
- a driver whose lease expired while the store did not answer takes it back, same epoch,
  if nobody else took it meanwhile; otherwise it has lost it (:class:`LeaseLost`) and a
  write it makes to the store's records is refused.

The lease keeps drivers from competing; it does not make a commit safe. A driver can pause
after any check (a GC pause, a slow retry, SIGSTOP), so every commit is decided by the
storage itself: a put-if-absent (Delta's log, Spark's checkpoint logs and the Parquet log on
S3, a hard link on a local disk), and Parquet files named by the epoch that staged them
(``jobs/tables/sinks.py``).

Example::

    with claim(pipeline.name, claims_for(pipeline)) as lease:
        ...                       # raises Claimed, naming the holder, if another driver has one
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import psutil

from sluice.errors import SluiceError
from sluice.state import Store, StoreUnavailable, Transaction, hostname, store

if TYPE_CHECKING:
    from sluice.spec import Pipeline

log = logging.getLogger("sluice.lease")

Role = Literal["checkpoint", "stream", "backfill", "name", "commit"]

#: How long a lease lasts without a heartbeat (seconds): the longest a driver on a lost or
#: paused host keeps its stream from being started elsewhere.
DEFAULT_TTL = 30.0
#: The environment variable that hands a launcher's lease to the job it starts.
OWNER_ENV = "SLUICE_LEASE_OWNER"


def lease_ttl() -> float:
    return float(os.environ.get("SLUICE_LEASE_TTL") or DEFAULT_TTL)


class Claimed(SluiceError):
    """Another driver holds a lease this one needs (``claim``, held by ``holder``)."""

    def __init__(self, message: str, claim: Claim | None = None, holder: Holder | None = None) -> None:
        super().__init__(message)
        self.claim, self.holder = claim, holder


class LeaseLost(SluiceError):
    """This driver's lease was taken over or given up: it must not write again."""


# --- what is claimed, and by whom ----------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    path: str
    role: Role

    @property
    def key(self) -> str:
        """One key per place (a ``name`` claim's path is a pipeline's name, not a place)."""
        return f"{self.role}:{self.path if self.role == 'name' else normalize(self.path)}"


def normalize(path: str) -> str:
    """One spelling per place: local paths resolved (symlinks too), URIs without a trailing /."""
    if path.startswith("file:"):
        path = "/" + path.removeprefix("file:").lstrip("/")
    if "://" in path:
        return path.rstrip("/")
    return os.path.realpath(path)


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a driver, or the action launching one (they share the ``owner``)."""

    pipeline: str
    host: str
    pid: int
    owner: str  # one launch: the launcher takes the lease, the job it starts adopts it
    epoch: int = 0  # the fencing token: grows each time the lease changes hands
    expires_at: float = 0.0  # on the store's clock
    acquired_at: float = 0.0
    app_id: str | None = None

    @classmethod
    def me(cls, pipeline: str, owner: str | None = None) -> Holder:
        return cls(pipeline, hostname(), os.getpid(), owner or uuid.uuid4().hex)

    def describe(self) -> str:
        return f"{self.pipeline!r} (driver pid {self.pid} on {self.host}, lease epoch {self.epoch})"


def holder_from_dict(data: dict[str, Any] | None) -> Holder | None:
    if not data:
        return None
    known = {k: v for k, v in data.items() if k in Holder.__dataclass_fields__}
    return Holder(**known)


def _process_gone(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        # A killed process releases its memory (its command line reads empty) before it is reaped.
        return proc.status() == psutil.STATUS_ZOMBIE or not proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def live(holder: Holder | None, now: float) -> bool:
    """Does ``holder`` still hold its lease? Not once it expired; and a holder on this host
    whose process is gone holds nothing (no other host can know that before the ttl)."""
    if holder is None or holder.expires_at <= now:
        return False
    return not (holder.host == hostname() and _process_gone(holder.pid))


@dataclass(frozen=True)
class Lease:
    """Leases taken together, on one holder (the epochs are per claim)."""

    holder: Holder
    epochs: dict[str, int]  # claim key -> epoch
    claims: tuple[Claim, ...] = ()
    ttl: float = DEFAULT_TTL
    renewed: float = field(default_factory=time.monotonic)  # this process's clock, at the last renewal

    def valid_for(self) -> float:
        """Seconds this process may still count on the lease without a renewal, by its own
        clock (a paused process wakes up with this negative)."""
        return self.ttl - (time.monotonic() - self.renewed)

    def epoch(self, role: Role = "checkpoint") -> int:
        """The epoch of this lease's claim in ``role``: the checkpoint's names one driver of it
        among all that ever ran it."""
        keys = [c.key for c in self.claims if c.role == role]
        return self.epochs[keys[0]] if keys else self.holder.epoch

    def check(self, txn: Transaction) -> None:
        """Raise :class:`LeaseLost` unless every claim is still this holder's, at its epoch (in
        a transaction of the store). A lease that expired while nobody took it is still its
        holder's: it takes it back at its next renewal."""
        for key, epoch in self.epochs.items():
            held = txn.rows.get(key)
            if held is None or held.owner != self.holder.owner or txn.epochs.get(key) != epoch:
                now_held = (
                    f"; it is held by {held.describe()}" if held is not None and held.owner != self.holder.owner else ""
                )
                raise LeaseLost(
                    f"{self.holder.pipeline}: lost the lease on {key.split(':', 1)[1]} (epoch {epoch}){now_held}: "
                    "this driver stops without writing again"
                )


def explain(name: str, claim: Claim, holder: Holder) -> str:
    """Why ``name`` may not take ``claim``, in the user's words."""
    who = holder.describe()
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
    return f"{name}: another driver named {name!r} runs: {who}; stop it first (sluice stop {name})"


def claims_for(pipeline: Pipeline, backfill_id: str | None = None) -> list[Claim]:
    """What a driver claims: its checkpoint, and its tables as the stream or as a backfill
    (which runs on a checkpoint of its own). A continuous branch writes topics, not tables."""
    role: Role = "stream" if backfill_id is None else "backfill"
    checkpoint = pipeline.checkpoint_path if backfill_id is None else pipeline.backfill_checkpoint_path(backfill_id)
    tables = [pipeline.sink_path, pipeline.quarantine_path] if pipeline.table_format else []
    claims = [Claim(checkpoint, "checkpoint"), *(Claim(t, role) for t in tables)]
    if backfill_id is None:  # its status and supervision records are the name's
        claims.append(Claim(pipeline.name, "name"))
    return claims


# --- the rules, in the store's transactions ------------------------------------------------


def acquire(claims: list[Claim], holder: Holder, ttl: float, *, on: Store | None = None) -> Lease:
    """Take every claim's lease (all or none); raise :class:`Claimed` naming a live holder.
    The launcher's lease is adopted by the job with the same ``owner``, epoch unchanged."""
    keys = sorted({c.key for c in claims})
    by_key = {c.key: c for c in claims}
    with (on or store()).transaction(keys) as txn:
        for key in keys:
            held = txn.rows.get(key)
            if held is not None and held.owner != holder.owner and live(held, txn.now):
                raise Claimed(explain(holder.pipeline, by_key[key], held), by_key[key], held)
        epochs = {}
        for key in keys:
            held = txn.rows.get(key)
            adopted = held is not None and held.owner == holder.owner
            epoch = txn.epochs.get(key, 0) + (0 if adopted else 1)
            acquired = held.acquired_at if adopted and held is not None else txn.now
            txn.written[key] = replace(holder, epoch=epoch, expires_at=txn.now + ttl, acquired_at=acquired)
            epochs[key] = epoch
    return Lease(replace(holder, epoch=max(epochs.values(), default=0)), epochs, tuple(claims), ttl)


def renew(lease: Lease, app_id: str | None = None, *, on: Store | None = None) -> Lease:
    """Extend the lease by its ttl, also once it expired if nobody took it meanwhile (the store
    did not answer, or this process was paused); raise :class:`LeaseLost` if it changed hands."""
    started = time.monotonic()
    with (on or store()).transaction(sorted(lease.epochs)) as txn:
        lease.check(txn)
        for key in lease.epochs:
            held = txn.rows[key]
            assert held is not None
            txn.written[key] = replace(held, expires_at=txn.now + lease.ttl, app_id=app_id or held.app_id)
    return replace(lease, renewed=started)


def confirm(lease: Lease, *, on: Store | None = None) -> None:
    """Raise :class:`LeaseLost` unless the lease is still this holder's."""
    with (on or store()).transaction(sorted(lease.epochs)) as txn:
        lease.check(txn)


def release(lease: Lease, *, on: Store | None = None) -> None:
    """Give the leases up, if this process still holds them (a store that does not answer
    lets them expire). A job that adopted the launcher's lease keeps it."""
    try:
        with (on or store()).transaction(sorted(lease.epochs)) as txn:
            for key, epoch in lease.epochs.items():
                held = txn.rows.get(key)
                mine = held is not None and held.owner == lease.holder.owner and held.pid == lease.holder.pid
                if mine and txn.epochs.get(key) == epoch:
                    txn.written[key] = None
    except SluiceError as exc:
        log.warning("%s: could not release its lease (%s); it expires in %.0fs", lease.holder.pipeline, exc, lease.ttl)


def holders(claims: list[Claim], *, on: Store | None = None) -> dict[Claim, Holder]:
    """The recorded holder of each claim (live or not: judge with :func:`live`)."""
    with (on or store()).transaction(sorted({c.key for c in claims})) as txn:
        return {c: h for c in claims if (h := txn.rows.get(c.key)) is not None}


def expire(claims: list[Claim], owner: str, pid: int | None = None, *, on: Store | None = None) -> bool:
    """Free the leases ``owner`` (its process ``pid``, if given) holds among ``claims``: a
    launch that failed gives back what its job never adopted. Those that changed hands
    meanwhile stay. Any freed?"""
    with (on or store()).transaction(sorted({c.key for c in claims})) as txn:
        for key, held in txn.rows.items():
            if held is not None and held.owner == owner and pid in (None, held.pid):
                txn.written[key] = None
        return bool(txn.written)


def running(name: str) -> Holder | None:
    """Who runs the pipeline ``name`` now, on any host: the live holder of its name's lease
    (its driver, or the action launching it)."""
    claim = Claim(name, "name")
    held = holders([claim]).get(claim)
    return held if live(held, store().now()) else None


# --- for actions ---------------------------------------------------------------------------


def take(name: str, claims: list[Claim], owner: str | None = None, ttl: float | None = None) -> Lease:
    """Take every claim's lease for this process (all or none); raise :class:`Claimed`."""
    return acquire(claims, Holder.me(name, owner), ttl or lease_ttl())


@contextmanager
def claim(name: str, claims: list[Claim], owner: str | None = None) -> Iterator[Lease]:
    """Hold every claim for the body (all or none); raise :class:`Claimed` naming a holder."""
    lease = take(name, claims, owner)
    try:
        yield lease
    finally:
        release(lease)


def check_free(name: str, claims: list[Claim]) -> None:
    """Raise :class:`Claimed` if a live driver holds any of ``claims`` now."""
    now = store().now()
    for c, holder in holders(claims).items():
        if live(holder, now):
            raise Claimed(explain(name, c, holder))


# --- the driver's side ---------------------------------------------------------------------


class Fence:
    """A driver's lease, renewed from a thread of its own, and what its writers ask of it.

    - :meth:`check` before a batch: raises :class:`LeaseLost` once the lease changed hands;
      while the store has not answered for as long as the lease lasts, it waits (nothing is
      written meanwhile) and goes on once this driver has its lease back;
    - :meth:`confirm` right before a commit: the same, after asking the store; a store that
      does not answer then is no reason to stop while the lease is still good by this
      process's own clock.

    Neither makes a commit safe on its own: a driver can pause right after either. They keep
    a driver that lost its lease from doing work that the storage would then refuse.

    ``stop`` is set when the lease is lost, and when ``stop_requested`` says yes (a stop
    asked for on any host reaches the driver so).
    """

    #: A batch or commit is not begun with less than this left of the lease (seconds).
    MARGIN = 5.0

    def __init__(
        self,
        lease: Lease,
        stop: threading.Event,
        stop_requested: Callable[[], bool] | None = None,
        every: float | None = None,
    ) -> None:
        self.lease, self.stop, self.stop_requested = lease, stop, stop_requested
        self.every = every or min(1.0, lease.ttl / 10)
        self.app_id: str | None = None
        self.lost: str | None = None
        self._unanswered: float | None = None  # since when the store has not answered (monotonic)
        self._renewed = threading.Condition()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-lease", daemon=True)

    def start(self) -> Fence:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        self._thread.join(10)

    @property
    def epoch(self) -> int:
        """The epoch of this driver's checkpoint lease (see :meth:`Lease.epoch`)."""
        return self.lease.epoch()

    @property
    def token(self) -> Lease | None:
        """The lease this driver's writes to the store's records are fenced by (None: unfenced)."""
        return self.lease

    def _margin(self) -> float:
        return min(self.MARGIN, self.lease.ttl / 3)

    def check(self, *, before_batch: bool = False) -> None:
        """Raise :class:`LeaseLost` unless this driver may still write. While its lease is out
        of date by its own clock, wait for the renewal; ``before_batch``, a stop asked for
        meanwhile ends the wait (the batch then declines to start, having written nothing)."""
        if self.lost is not None:
            raise LeaseLost(self.lost)
        if self.lease.valid_for() >= self._margin():
            return
        log.warning(
            "%s: the run-state store has not renewed this driver's lease for %.0fs (ttl %.0fs): nothing is "
            "written until it answers; then this driver takes its lease back, unless another one took it",
            self.lease.holder.pipeline,
            self.lease.ttl - self.lease.valid_for(),
            self.lease.ttl,
        )
        with self._renewed:
            while self.lost is None and self.lease.valid_for() < self._margin():
                if before_batch and self.stop.is_set():
                    return
                self._renewed.wait(1.0)
        if self.lost is not None:
            raise LeaseLost(self.lost)
        log.info("%s: the lease is this driver's again (epoch %d); writing on", self.lease.holder.pipeline, self.epoch)

    def confirm(self) -> None:
        """:meth:`check`, then ask the store (the last look before a commit)."""
        self.check()
        try:
            confirm(self.lease)
        except LeaseLost as exc:
            self._lose(str(exc))
            raise
        except StoreUnavailable:
            pass  # the lease is good by this process's clock (check), and the storage decides the commit

    def verify(self) -> str | None:
        """:attr:`lost`, after asking the store (when a run failed: was the lease the cause?)."""
        if self.lost is None:
            try:
                confirm(self.lease)
            except LeaseLost as exc:
                self._lose(str(exc))
            except SluiceError:
                pass  # a store that does not answer says nothing either way
        return self.lost

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            log.error("%s", why)
        self.stop.set()
        with self._renewed:
            self._renewed.notify_all()

    def _run(self) -> None:
        name = self.lease.holder.pipeline
        while not self._done.wait(self.every):
            try:
                lease = renew(self.lease, self.app_id)
            except LeaseLost as exc:
                self._lose(str(exc))
                return
            except Exception as exc:  # the store did not answer: try again, the lease runs out on its own
                if self._unanswered is None:
                    self._unanswered = time.monotonic()
                    log.warning("%s: lease renewal failed (%s); retrying", name, exc)
                continue
            with self._renewed:
                self.lease = lease
                self._renewed.notify_all()
            if self._unanswered is not None:
                log.info("%s: the run-state store answers again after %.0fs", name, time.monotonic() - self._unanswered)
                self._unanswered = None
            try:
                if self.stop_requested is not None and self.stop_requested():
                    self.stop.set()
            except Exception as exc:
                log.warning("%s: could not read its stop requests (%s)", name, exc)


class Unfenced(Fence):
    """A writer with no lease (tests, and tools that call a writer directly): every check passes."""

    def __init__(self) -> None:  # nothing to renew: no lease, no thread
        self.lost = None
        self.app_id = None
        self.stop = threading.Event()

    def start(self) -> Fence:
        return self

    def close(self) -> None:
        return None

    @property
    def epoch(self) -> int:
        return 0

    @property
    def token(self) -> Lease | None:
        return None

    def check(self, *, before_batch: bool = False) -> None:
        return None

    def confirm(self) -> None:
        return None

    def verify(self) -> str | None:
        return None


#: The fence of a writer that holds no lease.
UNFENCED = Unfenced()


@contextmanager
def commit_section(claim: Claim, fence: Fence, timeout: float = 120.0) -> Iterator[None]:
    """Take turns with every host's writers at a table's commit (a Parquet table's: list the
    log, then add the next number), entered only while ``fence`` holds.

    The turns keep writers from racing for one number; they do not make the commit safe, which
    the log's put-if-absent does. So a store that does not answer lets the commit go on
    without them, and a section that ended under its writer (frozen past the store's timeout)
    is no error once the commit is made."""
    section: AbstractContextManager[None] | None = store().exclusive(claim.key, timeout=timeout)
    try:
        section.__enter__()  # type: ignore[union-attr]
    except StoreUnavailable as exc:
        log.warning("%s: committing without taking turns with other writers: %s", claim.path, exc)
        section = None
    try:
        fence.confirm()
        yield
    finally:
        if section is not None:
            try:
                section.__exit__(*sys.exc_info())
            except StoreUnavailable as exc:
                log.warning("%s: the commit section ended under this writer (%s)", claim.path, exc)
