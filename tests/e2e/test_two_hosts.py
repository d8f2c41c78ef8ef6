"""Two hosts, one run-state store (a real PostgreSQL): the race that needs no cluster.

Each "host" is this machine under another SLUICE_HOSTNAME, so the other's pids mean nothing
to it and only the store and the lease tell it whether a driver lives. (The paused-driver
drill runs on the production layout, in tests/e2e/test_cluster.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sluice.ops import stream
from sluice.state import store
from tests.fixtures import make_pipeline, shared_state

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


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
