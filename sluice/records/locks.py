"""Leases on what a driver writes: its checkpoint, and its tables.

Two drivers on one checkpoint corrupt it (Spark notices only when both log the same batch,
with ``CONCURRENT_STREAM_LOG_UPDATE``, after one of them wrote it), and two streams
appending to one table write every record twice. So before it starts, a driver takes a
lease on its checkpoint, and on each table it writes in a role: ``stream`` (one live stream
per table) or ``backfill`` (one at a time: a backfill writes beside the live stream, on its
own checkpoint, but two backfills would both copy the same missing records). A stream also
takes its name, whose records supervision reads.

Leases are keyed by the claimed place, not by the pipeline, so specs with different names
that share a checkpoint or a table meet on the same lease. They live in the run-state store
(:mod:`sluice.state`): on one machine or across hosts, the rules are the same. A lease is
renewed by the job's heartbeat (:class:`Keeper`) and carries an epoch, which the job checks
before each batch and each commit.

Example::

    with claim(pipeline.name, claims_for(pipeline)) as lease:
        ...                       # raises Claimed, naming the holder, if another driver has one
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sluice.errors import SluiceError
from sluice.state import Claim, Claimed, Holder, Lease, LeaseLost, Role, explain, lease_ttl, live, normalize, store

if TYPE_CHECKING:
    from sluice.spec import Pipeline

__all__ = ["Claim", "Claimed", "Keeper", "Lease", "LeaseLost", "Role", "check_free", "claim", "claims_for", "hold"]
__all__ += ["OWNER_ENV", "normalize", "release", "take"]

log = logging.getLogger("sluice.locks")

#: The environment variable that hands a launcher's lease to the job it starts.
OWNER_ENV = "SLUICE_LEASE_OWNER"


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


def take(name: str, claims: list[Claim], owner: str | None = None, ttl: float | None = None) -> Lease:
    """Take every claim's lease for this process (all or none); raise :class:`Claimed`."""
    return store().acquire(claims, Holder.me(name, owner), ttl or lease_ttl())


@contextmanager
def claim(name: str, claims: list[Claim], owner: str | None = None) -> Iterator[Lease]:
    """Hold every claim for the body (all or none); raise :class:`Claimed` naming a holder."""
    lease = take(name, claims, owner)
    try:
        yield lease
    finally:
        release(lease)


def release(lease: Lease) -> None:
    """Give the lease up (a store that does not answer lets it expire)."""
    try:
        store().release(lease)
    except SluiceError as exc:
        log.warning("%s: could not release its lease (%s); it expires in %.0fs", lease.holder.pipeline, exc, lease.ttl)


def check_free(name: str, claims: list[Claim]) -> None:
    """Raise :class:`Claimed` if a live driver holds any of ``claims`` now."""
    now = store().now()
    for c, holder in store().holders(claims).items():
        if live(holder, now):
            raise Claimed(explain(name, c, holder))


@contextmanager
def hold(claim: Claim, fence: Lease | None = None, timeout: float = 120.0) -> Iterator[None]:
    """A short critical section every host's writers take in turn (a Parquet table's commit:
    list the log, then add the next number, as one step), entered only while ``fence`` holds."""
    with store().exclusive(claim.key, fence=fence, timeout=timeout):
        yield


class Keeper:
    """Renews a job's lease from a thread of its own, and stops the job when it must.

    When the store refuses a renewal (another driver took over), or the lease ran out because
    the store did not answer, :meth:`check` raises from then on and ``stop`` is set; so is it
    when ``stop_requested`` says yes (a stop asked for on any host reaches the driver so).
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
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-lease", daemon=True)

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        self._thread.join(10)

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this driver may still write (before a batch or commit)."""
        if self.lost is not None:
            raise LeaseLost(self.lost)
        left = self.lease.valid_for()
        if left < min(self.MARGIN, self.lease.ttl / 3):
            self._lose(
                f"{self.lease.holder.pipeline}: its lease could not be renewed for {self.lease.ttl - left:.0f}s "
                f"(ttl {self.lease.ttl:.0f}s): this driver stops without writing again"
            )
            raise LeaseLost(self.lost or "")

    def confirm(self) -> None:
        """:meth:`check`, then ask the store: the fence right before a commit."""
        self.check()
        try:
            store().confirm(self.lease)
        except LeaseLost as exc:
            self._lose(str(exc))
            raise

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            log.error("%s", why)
        self.stop.set()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                self.lease = store().renew(self.lease, self.app_id)
            except LeaseLost as exc:
                self._lose(str(exc))
                return
            except Exception as exc:  # the store did not answer: the lease runs out on its own
                log.warning("%s: lease renewal failed (%s); retrying", self.lease.holder.pipeline, exc)
                continue
            try:
                if self.stop_requested is not None and self.stop_requested():
                    self.stop.set()
            except Exception as exc:
                log.warning("%s: could not read its stop requests (%s)", self.lease.holder.pipeline, exc)
