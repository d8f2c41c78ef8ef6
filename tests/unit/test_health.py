"""Supervision's decisions and the checkpoint reader: pure logic, no broker, no JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from sluice.ops import processes
from sluice.ops.health import Observation, Verdict, assess
from sluice.records.checkpoint import Committed, read_committed

STALL = 600.0


@pytest.mark.parametrize(
    ("obs", "action", "words"),
    [
        (Observation(desired=None, alive=False), "start", "no run"),
        (Observation(desired="running", alive=False, state="failed", error="boom"), "restart", "failed: boom"),
        (Observation(desired="running", alive=False, state="running"), "restart", "last state: running"),
        (Observation(desired="stopped", alive=False, state="stopped"), "none", "stopped on request"),
        (Observation(desired="once", alive=False, state="finished"), "none", "ended (finished)"),
        (Observation(desired="once", alive=False, state="failed", error="bad"), "unhealthy", "failed: bad"),
        (
            Observation(desired="running", alive=True, since_heartbeat=700, lag=0, since_commit=5, since_start=900),
            "unhealthy",
            "has not reported for 700s",
        ),
        (
            Observation(desired="running", alive=True, since_heartbeat=1, lag=40, since_commit=900, since_start=800),
            "unhealthy",
            "40 records wait in Kafka and no batch has committed for 800s",
        ),
        (
            Observation(desired="running", alive=True, since_heartbeat=1, lag=0, since_commit=5000, since_start=900),
            "none",
            "healthy",
        ),
    ],
)
def test_assess(obs: Observation, action: str, words: str) -> None:
    v = assess(obs, max_stall=STALL, max_lag=None)
    assert v.action == action
    assert words in v.reason


def test_without_start_new_a_stream_nobody_started_is_left_alone_and_a_started_one_kept_up() -> None:
    never = assess(Observation(desired=None, alive=False), max_stall=STALL, max_lag=None, name="pay", start_new=False)
    assert never == Verdict(
        "none", "not started yet, so not supervised: start it (action=start, or `sluice start pay`)"
    )
    died = Observation(desired="running", alive=False, state="running")
    assert assess(died, max_stall=STALL, max_lag=None, start_new=False).action == "restart"


@pytest.mark.parametrize(
    ("failures", "since", "action"),
    [(1, 5.0, "wait"), (1, 10.0, "restart"), (2, 15.0, "wait"), (2, 20.0, "restart"), (3, 1e6, "failed")],
)
def test_a_failed_stream_is_restarted_after_a_doubling_back_off_then_given_up_on(
    failures: int, since: float, action: str
) -> None:
    obs = Observation(
        desired="running",
        alive=False,
        state="failed",
        error="expectation 'x' failed",
        failures=failures,
        failed_batch=7,
        since_failure=since,
    )
    v = assess(obs, max_stall=STALL, max_lag=None, max_failures=3, backoff=10.0, name="pay")
    assert v.action == action and not v.healthy  # failing is never green, restarting or not
    assert "batch 7" in v.reason and "expectation 'x' failed" in v.reason
    # What a failure does not change: a stream stopped on purpose stays stopped.
    stopped = Observation(desired="stopped", alive=False, state="failed", error="x", failures=failures)
    assert assess(stopped, max_stall=STALL, max_lag=None).action == "none"


def test_a_just_restarted_stream_is_not_blamed_for_the_time_it_was_down() -> None:
    obs = Observation(desired="running", alive=True, since_heartbeat=1, lag=500, since_commit=86_400, since_start=30)
    assert assess(obs, max_stall=STALL, max_lag=None).action == "none"


def test_lag_bound() -> None:
    obs = Observation(desired="running", alive=True, since_heartbeat=1, lag=1_001, since_commit=1, since_start=99)
    assert assess(obs, max_stall=STALL, max_lag=1_000) == Verdict(
        "unhealthy", "lagging: 1001 records behind the broker (max_lag 1000)"
    )
    assert assess(obs, max_stall=STALL, max_lag=2_000).action == "none"


def test_read_committed_takes_the_newest_committed_batch(tmp_path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, offsets in enumerate([{"t": {"0": 5, "1": 7}}, {"t": {"0": 9, "1": 7}}, {"t": {"0": 20, "1": 30}}]):
        (tmp_path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offsets)}\n')
    for batch in (0, 1):  # batch 2 is planned but not committed
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (tmp_path / "commits" / ".1.crc").write_text("x")
    c = read_committed(str(tmp_path))
    assert c.batch_id == 1
    assert c.offsets == {"t": {0: 9, 1: 7}}
    assert c.lag({"t": {0: 10, 1: 7}}) == 1
    assert c.lag({"t": {0: 10, 1: 7, 2: 4}, "u": {0: 3}}) == 1 + 4 + 3  # new partition and topic count from 0


def test_read_committed_on_an_empty_or_unsupported_checkpoint(tmp_path) -> None:
    assert read_committed(str(tmp_path / "nothing")) == Committed()
    assert read_committed(f"file://{tmp_path}") == Committed()
    with pytest.raises(ValueError, match="on local disk and on s3a:// only"):
        read_committed("abfss://c@account.dfs.core.windows.net/checkpoints/x")


def test_process_identity_guards_against_reused_pids() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ingest.py"])
    try:
        # Until the child has exec'd, its command line is still this process's (seen on a busy machine).
        deadline = time.monotonic() + 10
        while "ingest.py" not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes.process_named(proc.pid, "ingest.py") is not None
        assert processes.process_named(proc.pid, "maintain.py") is None
        assert processes.process_named(os.getpid(), "ingest.py") is None
    finally:
        proc.kill()
        proc.wait()
    assert processes.process_named(proc.pid, "ingest.py") is None
