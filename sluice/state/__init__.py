"""Where run state lives: one interface, a backend per deployment.

Run state is what the actions and the jobs tell each other: what the user wants of each
stream (``driver``), what each job reports of itself every second (``status``), its failures
in a row (``failures``), the last published batch (``published``), the supervision passes
(``supervised``), the SQL endpoint's report (``endpoint``), and the **leases** on what a driver
writes (:mod:`sluice.state.lease`, whose rules run in this store's transactions).

- :class:`~sluice.state.files.FileStore` keeps it in ``$SLUICE_HOME/run/``: the embedded
  default, one machine.
- :class:`~sluice.state.postgres.PostgresStore` keeps it in PostgreSQL, which every host of a
  cluster reaches: ``SLUICE_STATE=postgresql://user@host:5432/db`` (the password from libpq's
  ``PGPASSFILE`` or ``PGPASSWORD``, never the URL in a shared file).

A backend gives a transaction over some lease rows (:meth:`Store.transaction`), the records,
and a compare-and-set on a record (:meth:`Store.put_if`), so that an intent a person records
(a stop) is never overwritten by an action that read the record before it.
"""

from __future__ import annotations

import os
import socket
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, Protocol

from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.state.lease import Holder, Lease

#: The records actions and jobs share, each keyed by a pipeline's (or the endpoint's) name.
Kind = Literal["driver", "status", "failures", "published", "endpoint", "requested", "supervised"]


class StoreUnavailable(SluiceError):
    """The run-state store did not answer (a server down, a network cut)."""

    transient = True


def hostname() -> str:
    """This host's name in leases and run records (``SLUICE_HOSTNAME`` names a simulated host)."""
    return os.environ.get("SLUICE_HOSTNAME") or socket.gethostname()


@dataclass
class Transaction:
    """What a backend gives for the lease rules: the rows of some leases, locked, and the
    records, all committed together or not at all."""

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

    def put_if(self, kind: Kind, name: str, data: dict[str, Any], version: int) -> bool:
        """Write a record only if its ``version`` is still ``version`` (0: no record yet); the
        record is then at ``version + 1``. False, and nothing written, if it changed."""
        ...

    def delete(self, kind: Kind, name: str, *, fence: Lease | None = None) -> None: ...

    def transaction(self, keys: list[str]) -> AbstractContextManager[Transaction]:
        """Lock the lease rows of ``keys`` (created when missing) for one transaction."""
        ...

    def exclusive(self, key: str, *, timeout: float = 120.0) -> AbstractContextManager[None]:
        """A short critical section over ``key`` for every host (a table's commit)."""
        ...

    def now(self) -> float: ...


#: The key a record's version is kept under, in its document.
VERSION = "version"


def version_of(data: dict[str, Any] | None) -> int:
    """A record's version (0: no record, or one written before records had versions)."""
    return int((data or {}).get(VERSION) or 0)


class TransactionalStore:
    """Fenced record writes, once for every backend (which implements ``transaction``)."""

    def transaction(self, keys: list[str]) -> AbstractContextManager[Transaction]:
        raise NotImplementedError

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def put(self, kind: Kind, name: str, data: dict[str, Any], *, fence: Lease | None = None) -> None:
        with self.transaction(sorted(fence.epochs) if fence else []) as txn:
            if fence is not None:
                fence.check(txn)
            txn.puts.append((kind, name, data))

    def delete(self, kind: Kind, name: str, *, fence: Lease | None = None) -> None:
        with self.transaction(sorted(fence.epochs) if fence else []) as txn:
            if fence is not None:
                fence.check(txn)
            txn.puts.append((kind, name, None))


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
