"""Run state in PostgreSQL, which every host of a cluster reaches (``SLUICE_STATE``).

Two tables, created on first use: ``sluice_records`` (kind, name, a JSON document) and
``sluice_leases`` (a claim's key, its holder, its epoch, when it expires). A transaction locks
the lease rows it reads (``SELECT ... FOR UPDATE``, in key order, so two hosts never
deadlock), and the expiry is judged on the server's clock, so hosts need no synchronised
clocks. A table's commit section (:meth:`PostgresStore.exclusive`) is a transaction-level
advisory lock; the connection's ``idle_in_transaction_session_timeout`` ends it if its holder
freezes (a paused VM) inside, so a frozen driver cannot block the others' commits for good.

Each thread has its own connection (the job's heartbeat runs beside its batches), with
timeouts on everything that can hang on a server or network that went away: connecting,
each statement, and TCP keepalives (with a user timeout), so a driver learns within seconds
that the store is gone instead of waiting on a dead socket for minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from sluice.state import VERSION, Kind, StoreUnavailable, Transaction, TransactionalStore
from sluice.state.lease import Claimed, Lease, holder_from_dict, lease_ttl

SCHEMA = """
CREATE TABLE IF NOT EXISTS sluice_records (
    kind text NOT NULL, name text NOT NULL, data jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (kind, name));
CREATE TABLE IF NOT EXISTS sluice_leases (
    key text PRIMARY KEY, holder jsonb, epoch bigint NOT NULL DEFAULT 0);
"""

#: Seconds before a statement counts as no answer.
STATEMENT_TIMEOUT = 10
#: Seconds a connection may sit unused before it is checked to be alive before its next use.
IDLE_CHECK = 2.0
#: libpq's settings for a connection that cannot hang: a connection attempt gives up after 5 s,
#: and a peer that went silent (a server gone, a network cut) is noticed by TCP keepalives
#: within about 11 s, or by the user timeout for data that is not acknowledged.
CONNECTION = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": str(STATEMENT_TIMEOUT * 1000),
    "application_name": "sluice",
}


@contextmanager
def _answering(url: str) -> Iterator[None]:
    """The server's or the network's failure as one line naming the store."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.IdleInTransactionSessionTimeout) as exc:
        raise StoreUnavailable(f"the run-state store {_safe(url)} did not answer: {_first(exc)}") from None


def conninfo(url: str) -> str:
    """The URL with :data:`CONNECTION`'s settings (those the URL gives itself win)."""
    return psycopg.conninfo.make_conninfo("", **(CONNECTION | psycopg.conninfo.conninfo_to_dict(url)))


class PostgresStore(TransactionalStore):
    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._schema_ready = False

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not (conn.closed or conn.broken) and self._stale(conn):
            conn.close()
        if conn is None or conn.closed or conn.broken:
            with _answering(self.url):
                conn = psycopg.connect(
                    conninfo(self.url),
                    autocommit=True,
                    # A holder frozen inside a commit section must not hold the others' commits forever.
                    options=f"-c statement_timeout={STATEMENT_TIMEOUT * 1000} "
                    f"-c idle_in_transaction_session_timeout={int(lease_ttl() * 1000)}",
                )
                if not self._schema_ready:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(hashtext('sluice_schema'))")
                        conn.execute(SCHEMA)
                    self._schema_ready = True
            self._local.conn = conn
        self._local.used = time.monotonic()
        return conn

    def _stale(self, conn: psycopg.Connection[Any]) -> bool:
        """Is an idle connection dead (the server restarted since it was last used)? Its first
        statement would fail, once: asked before a connection idle for a while is used."""
        if time.monotonic() - getattr(self._local, "used", 0.0) < IDLE_CHECK:
            return False
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False  # inside a transaction (a commit section): its own statements tell
        try:
            conn.execute("SELECT 1")
            return False
        except psycopg.Error:
            return True

    def now(self) -> float:
        with _answering(self.url):
            row = self._conn().execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0])

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        with _answering(self.url):
            row = (
                self._conn()
                .execute("SELECT data FROM sluice_records WHERE kind = %s AND name = %s", (kind, name))
                .fetchone()
            )
        return dict(row[0]) if row else None

    def put_if(self, kind: Kind, name: str, data: dict[str, Any], version: int) -> bool:
        document = Jsonb(data | {VERSION: version + 1})
        with _answering(self.url):
            conn = self._conn()
            if version == 0:  # no record yet (or one written before records had versions)
                done = conn.execute(
                    "INSERT INTO sluice_records (kind, name, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (kind, name) DO UPDATE SET data = excluded.data, updated_at = now() "
                    "WHERE COALESCE((sluice_records.data->>'version')::bigint, 0) = 0",
                    (kind, name, document),
                )
            else:
                done = conn.execute(
                    "UPDATE sluice_records SET data = %s, updated_at = now() WHERE kind = %s AND name = %s "
                    "AND COALESCE((data->>'version')::bigint, 0) = %s",
                    (document, kind, name, version),
                )
        return done.rowcount == 1

    def put(self, kind: Kind, name: str, data: dict[str, Any], *, fence: Lease | None = None) -> None:
        if fence is None:
            with _answering(self.url):
                self._put(self._conn(), kind, name, data)
        else:
            super().put(kind, name, data, fence=fence)

    @staticmethod
    def _put(conn: psycopg.Connection[Any], kind: Kind, name: str, data: dict[str, Any] | None) -> None:
        if data is None:
            conn.execute("DELETE FROM sluice_records WHERE kind = %s AND name = %s", (kind, name))
            return
        conn.execute(
            "INSERT INTO sluice_records (kind, name, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (kind, name) DO UPDATE SET data = excluded.data, updated_at = now()",
            (kind, name, Jsonb(data)),
        )

    @contextmanager
    def transaction(self, keys: list[str]) -> Iterator[Transaction]:
        conn = self._conn()
        with _answering(self.url), conn.transaction():
            rows: dict[str, Any] = {}
            if keys:
                conn.execute(
                    "INSERT INTO sluice_leases (key) SELECT unnest(%s::text[]) ON CONFLICT (key) DO NOTHING", (keys,)
                )
                found = conn.execute(
                    "SELECT key, holder, epoch FROM sluice_leases WHERE key = ANY(%s) ORDER BY key FOR UPDATE", (keys,)
                ).fetchall()
                rows = {key: (holder, epoch) for key, holder, epoch in found}
            now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            assert now is not None
            txn = Transaction(
                float(now[0]),
                {k: holder_from_dict(h) for k, (h, _) in rows.items()},
                {k: int(e) for k, (_, e) in rows.items()},
            )
            yield txn
            for key, holder in txn.written.items():
                if holder is None:
                    conn.execute("UPDATE sluice_leases SET holder = NULL WHERE key = %s", (key,))
                else:
                    conn.execute(
                        "UPDATE sluice_leases SET holder = %s, epoch = %s WHERE key = %s",
                        (Jsonb(asdict(holder)), holder.epoch, key),
                    )
            for kind, name, data in txn.puts:
                self._put(conn, kind, name, data)

    @contextmanager
    def exclusive(self, key: str, *, timeout: float = 120.0) -> Iterator[None]:
        conn = self._conn()
        with _answering(self.url), conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = {int(timeout * 1000)}")
            conn.execute(f"SET LOCAL statement_timeout = {int(timeout * 1000) + 1000}")
            try:
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
            except psycopg.errors.LockNotAvailable:
                raise Claimed(f"{key}: waited {timeout:.0f}s for the commit section") from None
            conn.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT * 1000}")
            # Leaving raises if the server ended the section meanwhile (its holder froze past the
            # timeout): the commit inside was decided by the storage either way.
            yield


def _safe(url: str) -> str:
    """The URL without a password."""
    head, sep, tail = url.partition("@")
    if not sep:
        return url
    scheme, _, cred = head.partition("://")
    return f"{scheme}://{cred.split(':', 1)[0]}@{tail}"


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
