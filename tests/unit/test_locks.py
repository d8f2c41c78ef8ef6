"""Leases on checkpoints and tables, between real processes: what each driver claims, and
what the one refused is told. (The leases' own rules: tests/state_contract.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sluice.spec import Pipeline, load_pipeline
from sluice.state import hostname
from sluice.state import lease as locks
from tests.conftest import ROOT

SPEC = """
name: {name}
source: {{bootstrap_servers: localhost:9092, topics: [t]}}
schema: {schema}
event_time: {{field: timestamp, format: epoch_seconds}}
sink: {{format: parquet, path: {table}}}
checkpoint: {checkpoint}
"""


def pipeline(tmp_path: Path, name: str, table: str = "tables/t", checkpoint: str = "checkpoints/t") -> Pipeline:
    spec = tmp_path / f"{name}.yaml"
    schema = ROOT / "schemas/device_signal/v1.json"
    spec.write_text(SPEC.format(name=name, schema=schema, table=table, checkpoint=checkpoint))
    return load_pipeline(spec)


@contextmanager
def held_elsewhere(name: str, claims: list[locks.Claim]) -> Iterator[int]:
    """Another process holding ``claims`` until the block ends; yields its pid."""
    code = (
        "import sys; from sluice.state import lease as locks\n"
        f"claims = [locks.Claim(p, r) for p, r in {[(c.path, c.role) for c in claims]!r}]\n"
        f"with locks.claim({name!r}, claims):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.communicate("", timeout=10)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))


def test_two_specs_on_one_checkpoint_meet_on_one_lock(tmp_path) -> None:
    first = pipeline(tmp_path, "payments")
    renamed = pipeline(tmp_path, "payments_v2", table="tables/other")  # same checkpoint, other table
    with held_elsewhere("payments", locks.claims_for(first)) as pid, pytest.raises(locks.Claimed) as refused:
        locks.check_free(renamed.name, locks.claims_for(renamed))
    assert str(refused.value) == (
        f"payments_v2: the checkpoint {renamed.checkpoint_path} is in use by 'payments' (driver pid {pid} on "
        f"{hostname()}, lease epoch 1); two drivers on one checkpoint corrupt it. Stop that one first "
        "(sluice stop payments)"
    )
    locks.check_free(renamed.name, locks.claims_for(renamed))  # free again once the holder exited


def test_a_second_stream_into_one_table_is_refused_but_a_backfill_beside_it_is_not(tmp_path) -> None:
    live = pipeline(tmp_path, "live")
    other = pipeline(tmp_path, "other", checkpoint="checkpoints/other")  # same tables, own checkpoint
    with held_elsewhere("live", locks.claims_for(live)) as pid:
        with pytest.raises(
            locks.Claimed, match=rf"the table .*/tables/t is written by the stream of 'live' \(driver pid {pid} on"
        ):
            locks.check_free(other.name, locks.claims_for(other))
        # A backfill writes beside the live stream; a second backfill of the same tables waits.
        with (
            locks.claim("live", locks.claims_for(live, backfill_id="offsets-1")),
            pytest.raises(locks.Claimed, match="a backfill of 'live'"),
        ):
            locks.check_free("live", locks.claims_for(live, backfill_id="offsets-2"))
    assert [c.role for c in locks.claims_for(live, backfill_id="b")] == ["checkpoint", "backfill", "backfill"]
    assert locks.claims_for(live, backfill_id="b")[0].path == live.backfill_checkpoint_path("b")


def test_paths_are_compared_as_places_not_spellings(tmp_path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    a = locks.Claim(str(tmp_path / "link"), "checkpoint").key
    assert a == locks.Claim(f"file://{real}/", "checkpoint").key
    assert a != locks.Claim(str(real), "stream").key
    assert locks.normalize("s3a://bucket/cp/") == "s3a://bucket/cp"
    assert locks.Claim("payments", "name").key == "name:payments"  # a name, not a place


def test_a_claim_is_released_when_its_holder_dies(tmp_path) -> None:
    p = pipeline(tmp_path, "p")
    code = (
        "import os, signal; from sluice.state import lease as locks\n"
        f"with locks.claim('p', [locks.Claim({p.checkpoint_path!r}, 'checkpoint')]):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=os.environ).returncode == -9
    locks.check_free("p", locks.claims_for(p))


def test_a_fence_whose_lease_was_taken_over_stops_its_driver_and_ends_it_as_lost(tmp_path) -> None:
    """A driver paused past its lease wakes up between batches: its fence's next renewal is
    refused, which stops the query as cleanly as a stop request would; the driver still ends
    with LEASE_LOST (exit 5), so its supervisor knows another host has the stream."""
    from jobs import ingest
    from sluice.state.lease import UNFENCED, Fence, Holder, acquire

    claims = locks.claims_for(pipeline(tmp_path, "p"))
    paused = locks.take("p", claims, ttl=1.0)
    time.sleep(1.2)  # nobody renewed it
    acquire(claims, Holder("p", "worker-2", 1, "owner-b"), ttl=30.0)
    stop = threading.Event()
    fence = Fence(paused, stop, every=0.05).start()
    try:
        assert stop.wait(5), "the fence did not stop its driver"
        assert ingest.lost_lease(None, fence) == fence.lost
        assert "lost the lease" in (fence.lost or "") and "worker-2" in (fence.lost or "")
        with pytest.raises(locks.LeaseLost):
            fence.check()
    finally:
        fence.close()
    assert ingest.lost_lease(None, UNFENCED) is None  # a driver without a lease stopped because it was asked to
