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

from sluice.records import locks
from sluice.state import Claim, Claimed, Holder, LeaseLost, Store, live


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


def one_holder_then_takeover_with_a_new_epoch(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    a = store.acquire(claims, Holder("p", "host-a", 1, "owner-a"), ttl=1.0)
    with pytest.raises(Claimed, match=r"in use by 'p' \(driver pid 1 on host-a, lease epoch 1\)") as refused:
        store.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=1.0)
    assert refused.value.holder is not None and refused.value.holder.host == "host-a"
    store.put("status", "p", {"state": "running"}, fence=a)  # a's writes pass while it holds the lease
    a = store.renew(a)
    time.sleep(1.2)  # a's host is gone: nobody renews
    assert not live(store.holders(claims)[claims[0]], store.now())
    b = store.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=30.0)
    assert set(b.epochs.values()) == {2} and b.holder.epoch == 2
    # a wakes up (a paused VM): it may renew nothing and write nothing over b's records.
    with pytest.raises(LeaseLost, match=r"lost the lease on .* \(epoch 1\); it is held by 'p' .*host-b"):
        store.renew(a)
    with pytest.raises(LeaseLost):
        store.put("status", "p", {"state": "failed"}, fence=a)
    with pytest.raises(LeaseLost), store.exclusive("commit:t", fence=a, timeout=5):
        pytest.fail("a stale holder entered the commit section")
    assert store.get("status", "p") == {"state": "running"}
    store.release(a)  # not a's any more: nothing happens
    assert store.holders(claims)[claims[0]].owner == "owner-b"
    store.release(b)
    assert claims[0] not in store.holders(claims)
    c = store.acquire(claims, Holder("p", "host-c", 3, "owner-c"), ttl=30.0)
    assert c.holder.epoch == 3  # epochs never go back, also after a release
    store.release(c)


def a_launch_is_adopted_by_its_job(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    launch = store.acquire(claims, Holder("p", "host-a", 10, "launch-1"), ttl=30.0)
    job = store.acquire(claims, Holder("p", "host-a", 11, "launch-1"), ttl=30.0)  # same owner: adopted
    assert job.epochs == launch.epochs
    store.release(launch)  # the launcher gives up only what it still holds itself: nothing
    assert store.holders(claims)[claims[0]].pid == 11
    assert store.expire(claims, "launch-1", pid=10) is False
    assert store.expire(claims, "launch-1") is True  # its application ended: freed
    assert claims[0] not in store.holders(claims)


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
                store.acquire(claims, Holder("p", f"host-{n}", n, f"owner-{n}"), ttl=30.0)
                winners.append(f"owner-{n}")
            except Claimed:
                pass

        threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(winners) == 1, f"round {round_}: {winners}"
        assert {h.owner for h in store.holders(claims).values()} == set(winners)


def a_dead_local_holder_frees_at_once(store: Store, folder: Path, env: dict[str, str]) -> None:
    claims = _claims(folder)
    code = (
        "import os, signal; from sluice.records import locks\n"
        f"claims = [locks.Claim(p, r) for p, r in {[(c.path, c.role) for c in claims]!r}]\n"
        "locks.take('p', claims, ttl=600)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=os.environ | env, timeout=60).returncode == -9
    held = store.holders(claims)[claims[0]]
    assert held.expires_at > store.now() + 500 and not live(held, store.now())
    store.release(store.acquire(claims, Holder.me("p"), ttl=5.0))


def the_commit_section_is_one_at_a_time(store: Store, folder: Path) -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    def commit(n: int) -> None:
        for _ in range(5):
            with store.exclusive("commit:t", fence=None, timeout=30):
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


def a_keeper_stops_its_driver_when_the_lease_is_lost(store: Store, folder: Path) -> None:
    claims = _claims(folder)
    lease = store.acquire(claims, Holder.me("p"), ttl=2.0)
    stop = threading.Event()
    keeper = locks.Keeper(lease, stop, every=0.1).start()
    try:
        time.sleep(0.5)
        keeper.confirm()  # renewed meanwhile: still the writer
        # Taken over behind its back (an operator's expire, or its ttl passed while it was cut off).
        store.expire(claims, lease.holder.owner)
        store.acquire(claims, Holder("p", "host-b", 2, "owner-b"), ttl=30.0)
        assert stop.wait(5), "the keeper did not stop its driver"
        with pytest.raises(LeaseLost, match="host-b"):
            keeper.check()
    finally:
        keeper.close()
    # A paused driver: its own clock says the lease ran out, before it asks anyone.
    paused = store.acquire(_claims(folder / "paused", "q"), Holder.me("q"), ttl=1.0)
    keeper = locks.Keeper(paused, threading.Event(), every=60)  # never renews
    time.sleep(1.1)
    with pytest.raises(LeaseLost, match="could not be renewed"):
        keeper.check()


CHECKS = [
    records_round_trip,
    one_holder_then_takeover_with_a_new_epoch,
    a_launch_is_adopted_by_its_job,
    concurrent_acquisitions_have_one_winner,
    the_commit_section_is_one_at_a_time,
    a_keeper_stops_its_driver_when_the_lease_is_lost,
]
