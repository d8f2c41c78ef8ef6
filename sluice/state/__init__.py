"""Where run state lives: one interface, a backend per deployment.

Run state is what the actions and the jobs tell each other: what the user wants of each
stream (``driver``), what each job reports of itself every second (``status``), its failures
in a row (``failures``), the last published batch (``published``), the SQL endpoint's report
(``endpoint``), and the **leases** on what a driver writes (its checkpoint and tables, and its
pipeline's name).

- :class:`~sluice.state.files.FileStore` keeps it in ``$SLUICE_HOME/run/``: the embedded
  default, one machine.
- :class:`~sluice.state.postgres.PostgresStore` keeps it in PostgreSQL, which every host of a
  cluster reaches: ``SLUICE_STATE=postgresql://user@host:5432/db`` (the password from libpq's
  ``PGPASSFILE`` or ``PGPASSWORD``, never the URL in a shared file).

A lease is held by one driver at a time for ``ttl`` seconds and renewed by its heartbeat. Its
**epoch** grows each time the lease changes hands: a driver checks its epoch before each batch
and each commit (see ``jobs/fence.py``), and a write a driver makes on a lease it lost is
refused by the store (:class:`LeaseLost`). A lease is free once it expires, or at once when
its holder is a process of this host that is gone; supervision also frees a lease whose
Spark application the cluster's master reports ended (:meth:`Store.expire`).

The decisions are made once, here (:class:`TransactionalStore`); a backend gives a
transaction over some lease rows and the records.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal, Protocol

import psutil

from sluice.errors import SluiceError

#: The records actions and jobs share, each keyed by a pipeline's (or the endpoint's) name.
Kind = Literal["driver", "status", "failures", "published", "endpoint", "requested"]
Role = Literal["checkpoint", "stream", "backfill", "name", "commit"]

#: How long a lease lasts without a heartbeat (seconds): the longest a driver on a lost or
#: paused host keeps its stream from being started elsewhere.
DEFAULT_TTL = 30.0


class Claimed(SluiceError):
    """Another driver holds a lease this one needs (``claim``, held by ``holder``)."""

    def __init__(self, message: str, claim: Claim | None = None, holder: Holder | None = None) -> None:
        super().__init__(message)
        self.claim, self.holder = claim, holder


class LeaseLost(SluiceError):
    """This driver's lease expired or was taken over: it must not write again."""


def hostname() -> str:
    """This host's name in leases and run records (``SLUICE_HOSTNAME`` names a simulated host)."""
    return os.environ.get("SLUICE_HOSTNAME") or socket.gethostname()


def lease_ttl() -> float:
    return float(os.environ.get("SLUICE_LEASE_TTL") or DEFAULT_TTL)


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


@dataclass
class Transaction:
    """What a backend gives :class:`TransactionalStore`: the rows of some leases, locked, and
    the records, all committed together or not at all."""

    now: float
    rows: dict[str, Holder | None]
    epochs: dict[str, int]  # the last epoch of each key, also once released
    written: dict[str, Holder | None] = field(default_factory=dict)
    puts: list[tuple[Kind, str, dict[str, Any] | None]] = field(default_factory=list)


class Store(Protocol):
    def get(self, kind: Kind, name: str) -> dict[str, Any] | None: ...

    def put(self, kind: Kind, name: str, data: dict[str, Any], *, fence: Lease | None = None) -> None:
        """Write a record; with ``fence``, only while that lease is still the writer's."""
        ...

    def delete(self, kind: Kind, name: str, *, fence: Lease | None = None) -> None: ...

    def acquire(self, claims: list[Claim], holder: Holder, ttl: float) -> Lease:
        """Take every claim's lease (all or none); raise :class:`Claimed` naming a live holder.
        The launcher's lease is adopted by the job with the same ``owner``, epoch unchanged."""
        ...

    def renew(self, lease: Lease, app_id: str | None = None) -> Lease:
        """Extend the lease by its ttl; raise :class:`LeaseLost` if it is no longer held."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the leases up, if this process still holds them."""
        ...

    def confirm(self, lease: Lease) -> None:
        """Raise :class:`LeaseLost` unless the lease is still this holder's, unexpired."""
        ...

    def holders(self, claims: list[Claim]) -> dict[Claim, Holder]:
        """The recorded holder of each claim (live or not: judge with :func:`live`)."""
        ...

    def expire(self, claims: list[Claim], owner: str, pid: int | None = None) -> bool:
        """Free the leases ``owner`` (its process ``pid``, if given) holds among ``claims``,
        known to be gone (its Spark application ended; its launch failed); those that changed
        hands meanwhile stay. Any freed?"""
        ...

    def exclusive(self, key: str, *, fence: Lease | None, timeout: float = 120.0) -> AbstractContextManager[None]:
        """A short critical section over ``key`` for every host (a table's commit), entered
        only while ``fence`` is still held."""
        ...

    def now(self) -> float: ...


class TransactionalStore:
    """The lease rules, once for every backend (which implements ``_transaction``)."""

    def _transaction(self, keys: list[str]) -> AbstractContextManager[Transaction]:
        raise NotImplementedError

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def put(self, kind: Kind, name: str, data: dict[str, Any], *, fence: Lease | None = None) -> None:
        with self._transaction(sorted(fence.epochs) if fence else []) as txn:
            if fence is not None:
                check_fence(txn, fence)
            txn.puts.append((kind, name, data))

    def delete(self, kind: Kind, name: str, *, fence: Lease | None = None) -> None:
        with self._transaction(sorted(fence.epochs) if fence else []) as txn:
            if fence is not None:
                check_fence(txn, fence)
            txn.puts.append((kind, name, None))

    def acquire(self, claims: list[Claim], holder: Holder, ttl: float) -> Lease:
        keys = sorted({c.key for c in claims})
        by_key = {c.key: c for c in claims}
        with self._transaction(keys) as txn:
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

    def renew(self, lease: Lease, app_id: str | None = None) -> Lease:
        started = time.monotonic()
        with self._transaction(sorted(lease.epochs)) as txn:
            check_fence(txn, lease)
            for key in lease.epochs:
                held = txn.rows[key]
                assert held is not None
                txn.written[key] = replace(held, expires_at=txn.now + lease.ttl, app_id=app_id or held.app_id)
        return replace(lease, renewed=started)

    def release(self, lease: Lease) -> None:
        with self._transaction(sorted(lease.epochs)) as txn:
            for key, epoch in lease.epochs.items():
                held = txn.rows.get(key)
                # Only while it is still this process's: a job that adopted the launcher's lease keeps it.
                mine = held is not None and held.owner == lease.holder.owner and held.pid == lease.holder.pid
                if mine and txn.epochs.get(key) == epoch:
                    txn.written[key] = None

    def confirm(self, lease: Lease) -> None:
        """Raise :class:`LeaseLost` unless the lease is still this holder's, unexpired."""
        with self._transaction(sorted(lease.epochs)) as txn:
            check_fence(txn, lease)

    def holders(self, claims: list[Claim]) -> dict[Claim, Holder]:
        with self._transaction(sorted({c.key for c in claims})) as txn:
            return {c: h for c in claims if (h := txn.rows.get(c.key)) is not None}

    def expire(self, claims: list[Claim], owner: str, pid: int | None = None) -> bool:
        with self._transaction(sorted({c.key for c in claims})) as txn:
            for key, held in txn.rows.items():
                if held is not None and held.owner == owner and pid in (None, held.pid):
                    txn.written[key] = None
            return bool(txn.written)


def check_fence(txn: Transaction, lease: Lease) -> None:
    for key, epoch in lease.epochs.items():
        held = txn.rows.get(key)
        if (
            held is None
            or held.owner != lease.holder.owner
            or txn.epochs.get(key) != epoch
            or held.expires_at <= txn.now
        ):
            now_held = (
                f"; it is held by {held.describe()}" if held is not None and held.owner != lease.holder.owner else ""
            )
            raise LeaseLost(
                f"{lease.holder.pipeline}: lost the lease on {key.split(':', 1)[1]} (epoch {epoch}){now_held}: "
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


def holder_from_dict(data: dict[str, Any] | None) -> Holder | None:
    if not data:
        return None
    known = {k: v for k, v in data.items() if k in Holder.__dataclass_fields__}
    return Holder(**known)


@cache
def _store(url: str, home: str) -> Store:
    if url.startswith(("postgresql://", "postgres://")):
        from sluice.state.postgres import PostgresStore

        return PostgresStore(url)
    from pathlib import Path

    from sluice.state.files import FileStore

    return FileStore(Path(home) / "run")


def store() -> Store:
    """The store this process uses: ``SLUICE_STATE`` (a PostgreSQL URL), else files."""
    from sluice import config

    url = os.environ.get("SLUICE_STATE") or ""
    if url and not url.startswith(("postgresql://", "postgres://", "file")):
        raise SluiceError(f"SLUICE_STATE={url!r}: expected a postgresql:// URL, or nothing for files in SLUICE_HOME")
    return _store(url, str(config.sluice_home()))
