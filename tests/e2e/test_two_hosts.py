"""Two hosts, one run-state store (a real PostgreSQL): the drills that need no cluster.

Each "host" is this machine under another SLUICE_HOSTNAME, so the other's pids mean nothing
to it and only the store and the lease's expiry tell it whether a driver lives. The tables
are read without Spark (delta-rs, pyarrow over the Parquet log), and each drill says the
records lost and duplicated (both must be 0) and how long it took to recover.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.errors import AlreadyRunning
from sluice.ops import stream
from sluice.ops.target import LocalTarget
from sluice.state import store
from tests.fixtures import exactly_once, make_pipeline, new_topic, shared_state, wait_written

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

TTL = 8.0


def test_a_paused_driver_writes_nothing_after_another_host_took_over(
    broker, postgres, tmp_path: Path, monkeypatch
) -> None:
    """Delta on local disk; the Parquet case (a put-if-absent commit on S3) is drilled on the
    production layout, in tests/e2e/test_cluster.py."""
    fmt = "delta"
    shared_state(postgres, monkeypatch, ttl=TTL)
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": fmt}, trigger={"processing_time": "500 milliseconds"})
    gen = EventGenerator(pipeline, seed=25)
    sent = {
        (topic, d.partition, d.offset) for d in send(broker.bootstrap, topic, synthetic(gen, 300), keep=True).delivered
    }

    monkeypatch.setenv("SLUICE_HOSTNAME", "host-a")
    a = stream.start(pipeline, LocalTarget(), by="drill host-a")
    wait_written(pipeline, 300, lambda: stream.log_tail(a.driver.log, 60))

    # host-a freezes (a paused VM): spark-submit's JVM and the Python driver, mid-stream.
    group = os.getpgid(a.driver.pid)
    os.killpg(group, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        sent |= {
            (topic, d.partition, d.offset)
            for d in send(broker.bootstrap, topic, synthetic(gen, 300), keep=True).delivered
        }
        monkeypatch.setenv("SLUICE_HOSTNAME", "host-b")
        with pytest.raises(AlreadyRunning, match="already running on host-a"):
            stream.start(pipeline, LocalTarget(), by="drill host-b")  # its lease is live: no second driver
        while stream.running(pipeline) is not None:  # until the lease runs out
            assert time.monotonic() - frozen < TTL + 10
            time.sleep(0.2)
        b = stream.start(pipeline, LocalTarget(), by="drill host-b")
        wait_written(pipeline, 600, lambda: stream.log_tail(b.driver.log, 60))
        recovered = time.monotonic() - frozen
    finally:
        os.killpg(group, signal.SIGCONT)

    # host-a wakes up: it finds its lease gone and stops without writing.
    code = psutil.Process(a.driver.pid).wait(timeout=120)
    log_a = Path(a.driver.log).read_text()
    assert code == 5, log_a[-3000:]
    assert "lost the lease" in log_a and "host-b" in log_a, log_a[-3000:]
    st = stream.status(pipeline)
    assert st.observation.alive and st.status is not None and st.status.host == "host-b"  # a reported nothing over b
    sent |= {
        (topic, d.partition, d.offset) for d in send(broker.bootstrap, topic, synthetic(gen, 100), keep=True).delivered
    }
    wait_written(pipeline, 700, lambda: stream.log_tail(b.driver.log, 60))
    assert "gracefully" in stream.stop(pipeline, by="drill host-a")  # stopped from the other host
    figures = exactly_once(pipeline, sent)
    print(f"\nSIGSTOP drill ({fmt}): {figures}, recovered in {recovered:.1f}s (lease ttl {TTL:.0f}s)")
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


SUPERVISE = """
import json, sys, time
from sluice.errors import AlreadyRunning
from sluice.ops import stream
from sluice.spec import load_pipeline
from tests.unit.fake_target import FakeTarget
from pathlib import Path

pipeline, at = load_pipeline(sys.argv[1]), float(sys.argv[3])
target = FakeTarget(Path(sys.argv[2]))
time.sleep(max(0.0, at - time.time()))
done = stream.supervise(pipeline, target, by="drill", offsets=lambda _: {})
print(json.dumps({"started": done.started is not None}))
"""


def test_two_hosts_supervising_at_once_start_one_driver(sluice_home, postgres, tmp_path: Path, monkeypatch) -> None:
    """Both Airflow workers' supervision passes fire together, 20 times: never two drivers.
    (The stream is a fake driver process that adopts and renews the lease like the job.)"""
    env = shared_state(postgres, monkeypatch)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    pipeline = make_pipeline(tmp_path, "drill-topic", name="twice")
    for round_ in range(20):
        store().delete("driver", pipeline.name)  # nothing recorded: both passes want to start it
        at = time.time() + 1.5
        passes = [
            subprocess.Popen(
                [sys.executable, "-c", SUPERVISE, str(pipeline.spec_path), str(tmp_path), str(at)],
                env=os.environ | env | {"SLUICE_HOSTNAME": host},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(Path(__file__).resolve().parents[2]),
            )
            for host in ("worker-a", "worker-b")
        ]
        outs = [p.communicate(timeout=60) for p in passes]
        assert all(p.returncode == 0 for p in passes), outs
        started = [o for o, _ in outs if '"started": true' in o]
        drivers = [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(part.endswith("fake/ingest.py") for part in p.info["cmdline"] or [])
            and "twice" in (p.info["cmdline"] or [])
        ]
        assert len(started) == 1 and len(drivers) == 1, f"round {round_}: {outs}, {len(drivers)} drivers"
        holder = stream.running(pipeline)
        assert holder is not None and holder.pid == drivers[0].pid
        monkeypatch.setenv("SLUICE_HOSTNAME", "worker-c")  # stopped from a third host, through the store
        assert "gracefully" in stream.stop(pipeline, by="drill", timeout=30)
        drivers[0].wait(10)
