"""What every run-state store must do (sluice.state), checked the same way for each backend:
tests/unit/test_state.py runs it on files, tests/integration/test_state_postgres.py on a real
PostgreSQL. Holders on "another host" are simulated by their host name: their pids mean
nothing here, so only their lease's expiry frees what they hold.

Each check takes the store and a scratch folder, and uses a short ttl so expiry is real."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sluice.state import Store
from sluice.state import lease as leases
from sluice.state.lease import Claim, Claimed, Holder, LeaseLost, live


def _claims(folder: Path, name: str = "p") -> list[Claim]:
    return [Claim(str(folder / "cp"), "checkpoint"), Claim(str(folder / "t"), "stream"), Claim(name, "name")]


def records_round_trip(store: Store, folder: Path) -> None:
    assert store.get("driver", "p") is None
    store.put("driver", "p", {"pipeline": "p", "desired": "running"})
    store.put("driver", "p", {"pipeline": "p", "desired": "stopped"})
    assert store.get("driver", "p") == {"pipeline": "p", "desired": "stopped"}
    assert store.get("status", "p") is None  # kinds are apart
    store.delete("driver", "p")
    assert store.get("driver", "p") is None


def a_record_is_compared_and_set_on_its_version(store: Store, folder: Path) -> None:
    assert store.put_if("driver", "p", {"desired": "running"}, 0)  # no record yet: version 0
    assert not store.put_if("driver", "p", {"desired": "running"}, 0)  # it exists now
    assert store.get("driver", "p") == {"desired": "running", "version": 1}
    assert store.put_if("driver", "p", {"desired": "stopped"}, 1)
    assert not store.put_if("driver", "p", {"desired": "running"}, 1)  # read before the stop: refused
    assert store.get("driver", "p") == {"desired": "stopped", "version": 2}


def one_holder_then_takeover_with_a_new_epoch(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    a = leases.acquire(claims, Holder("p", "host-a", 1, "owner-a"), ttl=1.0, on=store)
    with pytest.raises(Claimed, match=r"in use by 'p' \(driver pid 1 on host-a, lease epoch 1\)") as refused:
        leases.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=1.0, on=store)
    assert refused.value.holder is not None and refused.value.holder.host == "host-a"
    store.put("status", "p", {"state": "running"}, fence=a)  # a's writes pass while it holds the lease
    a = leases.renew(a, on=store)
    time.sleep(1.2)  # a's host is gone: nobody renews
    assert not live(leases.holders(claims, on=store)[claims[0]], store.now())
    b = leases.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=30.0, on=store)
    assert set(b.epochs.values()) == {2} and b.holder.epoch == 2
    # a wakes up (a paused VM): it may renew nothing and write nothing over b's records.
    with pytest.raises(LeaseLost, match=r"lost the lease on .* \(epoch 1\); it is held by 'p' .*host-b"):
        leases.renew(a, on=store)
    with pytest.raises(LeaseLost):
        store.put("status", "p", {"state": "failed"}, fence=a)
    assert store.get("status", "p") == {"state": "running"}
    leases.release(a, on=store)  # not a's any more: nothing happens
    assert leases.holders(claims, on=store)[claims[0]].owner == "owner-b"
    leases.release(b, on=store)
    assert claims[0] not in leases.holders(claims, on=store)
    c = leases.acquire(claims, Holder("p", "host-c", 3, "owner-c"), ttl=30.0, on=store)
    assert c.holder.epoch == 3  # epochs never go back, also after a release
    leases.release(c, on=store)


def a_lease_that_expired_unclaimed_is_taken_back_at_its_epoch(store: Store, folder: Path) -> None:
    """A driver cut off from the store (or paused) past its ttl, which nobody took over
    meanwhile, takes its lease back when it reaches the store again: same epoch."""
    claims = _claims(folder)
    a = leases.acquire(claims, Holder("p", "host-a", 1, "owner-a"), ttl=0.5, on=store)
    time.sleep(0.7)
    assert not live(leases.holders(claims, on=store)[claims[0]], store.now())
    a = leases.renew(a, on=store)
    assert live(leases.holders(claims, on=store)[claims[0]], store.now())
    assert set(a.epochs.values()) == {1}
    store.put("status", "p", {"state": "running"}, fence=a)
    leases.release(a, on=store)


def a_launch_is_adopted_by_its_job(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    launch = leases.acquire(claims, Holder("p", "host-a", 10, "launch-1"), ttl=30.0, on=store)
    job = leases.acquire(claims, Holder("p", "host-a", 11, "launch-1"), ttl=30.0, on=store)  # same owner: adopted
    assert job.epochs == launch.epochs
    leases.release(launch, on=store)  # the launcher gives up only what it still holds itself: nothing
    assert leases.holders(claims, on=store)[claims[0]].pid == 11
    assert leases.expire(claims, "launch-1", pid=10, on=store) is False  # a failed launch frees only its own
    assert leases.expire(claims, "launch-1", on=store) is True
    assert claims[0] not in leases.holders(claims, on=store)


def concurrent_acquisitions_have_one_winner(store: Store, folder: Path) -> None:
    """Twenty rounds of eight threads (each as another host) taking one pipeline's leases."""
    for round_ in range(20):
        claims = _claims(folder / str(round_))
        winners: list[str] = []
        barrier = threading.Barrier(8)

        def take(
            n: int, claims: list[Claim] = claims, barrier: threading.Barrier = barrier, winners: list[str] = winners
        ) -> None:
            barrier.wait()
            try:
                leases.acquire(claims, Holder("p", f"host-{n}", n, f"owner-{n}"), ttl=30.0, on=store)
                winners.append(f"owner-{n}")
            except Claimed:
                pass

        threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(winners) == 1, f"round {round_}: {winners}"
        assert {h.owner for h in leases.holders(claims, on=store).values()} == set(winners)


def a_dead_local_holder_frees_at_once(store: Store, folder: Path, env: dict[str, str]) -> None:
    claims = _claims(folder)
    code = (
        "import os, signal; from sluice.state import lease\n"
        f"claims = [lease.Claim(p, r) for p, r in {[(c.path, c.role) for c in claims]!r}]\n"
        "lease.take('p', claims, ttl=600)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=os.environ | env, timeout=60).returncode == -9
    held = leases.holders(claims, on=store)[claims[0]]
    assert held.expires_at > store.now() + 500 and not live(held, store.now())
    leases.release(leases.acquire(claims, Holder.me("p"), ttl=5.0, on=store), on=store)


def the_commit_section_is_one_at_a_time(store: Store, folder: Path) -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    def commit(n: int) -> None:
        for _ in range(5):
            with store.exclusive("commit:t", timeout=30):
                inside.append(n)
                if len(inside) > 1:
                    overlaps.append(n)
                time.sleep(0.005)
                inside.remove(n)

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert overlaps == []


def a_fence_stops_its_driver_when_the_lease_is_lost(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    lease = leases.acquire(claims, Holder.me("p"), ttl=2.0, on=store)
    stop = threading.Event()
    fence = leases.Fence(lease, stop, every=0.1).start()
    try:
        time.sleep(0.5)
        fence.confirm()  # renewed meanwhile: still the writer
        # Taken over behind its back (its launch's clean-up, or its ttl passed while it was cut off).
        leases.expire(claims, lease.holder.owner, on=store)
        leases.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=30.0, on=store)
        assert stop.wait(5), "the fence did not stop its driver"
        with pytest.raises(LeaseLost, match="freed|host-b"):
            fence.check()
        with pytest.raises(LeaseLost), leases.commit_section(Claim("t", "commit"), fence, timeout=5):
            pytest.fail("a stale holder entered the commit section")
    finally:
        fence.close()


def a_paused_driver_waits_for_its_lease_and_takes_it_back(store: Store, folder: Path) -> None:
    """Its own clock says the lease ran out (it was paused, or the store did not answer): a
    batch waits, and goes on once the lease is this driver's again, same epoch."""
    claims = _claims(folder / "paused", "q")
    paused = leases.acquire(claims, Holder.me("q"), ttl=1.0, on=store)
    fence = leases.Fence(paused, threading.Event(), every=60)  # its renewals have not run yet
    time.sleep(1.1)
    waited = threading.Event()
    checker = threading.Thread(target=lambda: (fence.check(), waited.set()))
    checker.start()
    time.sleep(0.5)
    assert not waited.is_set(), "a batch began with the lease out of date"
    fence.every = 0.05
    fence.start()  # the store answers: the renewal takes the lease back
    checker.join(10)
    assert waited.is_set() and fence.lost is None and fence.epoch == 1
    fence.close()


CHECKS = [
    records_round_trip,
    a_record_is_compared_and_set_on_its_version,
    one_holder_then_takeover_with_a_new_epoch,
    a_lease_that_expired_unclaimed_is_taken_back_at_its_epoch,
    a_launch_is_adopted_by_its_job,
    concurrent_acquisitions_have_one_winner,
    the_commit_section_is_one_at_a_time,
    a_fence_stops_its_driver_when_the_lease_is_lost,
    a_paused_driver_waits_for_its_lease_and_takes_it_back,
]
