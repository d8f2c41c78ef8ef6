"""Two hosts, one run-state store (a real PostgreSQL): the races that need no cluster.

Each "host" is this machine under another SLUICE_HOSTNAME, so the other's pids mean nothing
to it and only the store and the lease tell it whether a driver lives: two supervisions at
once, and a driver paused at each named point of its commit path while the other host takes
its stream over. (The randomized schedule of kills, pauses and outages runs on the
production layout, in tests/e2e/test_cluster.py.)
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

from sluice import faults
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import drivers, processes, stream
from sluice.ops.target import LocalTarget
from sluice.records.run import Driver
from sluice.state import store
from tests.fixtures import exactly_once, make_pipeline, new_topic, python_driver, shared_state, wait_written

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


#: Rounds of two supervisions at once (more with SLUICE_SUPERVISION_ROUNDS); the store's
#: compare-and-set decides each one.
ROUNDS = int(os.environ.get("SLUICE_SUPERVISION_ROUNDS", "8"))

SUPERVISE = """
import json, sys, time
from sluice.errors import AlreadyRunning
from sluice.ops import supervision
from sluice.spec import load_pipeline
from tests.unit.fake_target import FakeTarget
from pathlib import Path

pipeline, at = load_pipeline(sys.argv[1]), float(sys.argv[3])
target = FakeTarget(Path(sys.argv[2]))
time.sleep(max(0.0, at - time.time()))
done = supervision.supervise(pipeline, target, by="drill", offsets=lambda _: {})
print(json.dumps({"started": done.started is not None}))
"""


def test_two_hosts_supervising_at_once_start_one_driver(sluice_home, postgres, tmp_path: Path, monkeypatch) -> None:
    """Both Airflow workers' supervision passes fire together, ROUNDS times: never two drivers.
    (The stream is a fake driver process that adopts and renews the lease like the job.)"""
    env = shared_state(postgres, monkeypatch)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    pipeline = make_pipeline(tmp_path, "drill-topic", name="twice")
    for round_ in range(ROUNDS):
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
        found = [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(part.endswith("fake/ingest.py") for part in p.info["cmdline"] or [])
            and "twice" in (p.info["cmdline"] or [])
        ]
        assert len(started) == 1 and len(found) == 1, f"round {round_}: {outs}, {len(found)} drivers"
        holder = drivers.running(pipeline)
        assert holder is not None and holder.pid == found[0].pid
        monkeypatch.setenv("SLUICE_HOSTNAME", "worker-c")  # stopped from a third host, through the store
        assert "gracefully" in stream.stop(pipeline, by="drill", timeout=30)
        found[0].wait(10)


#: The fault points of each format's commit path where a driver pauses (sluice/faults.py).
PAUSE_POINTS = {
    "delta": ["delta.before-write", "batch.written"],
    "parquet": ["parquet.before-commit", "parquet.after-commit", "batch.written"],
}


def wait_paused(proc: psutil.Process, log: Path, timeout: float = 240) -> int:
    """Wait until the driver stopped itself at its fault point; the batch it paused in."""
    deadline = time.monotonic() + timeout
    while proc.status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"the driver did not pause:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    found = faults.paused_at(proc.pid)
    assert found is not None and found[1] is not None, found
    return found[1]


# Parquet's three points in CI (its own commit protocol); Delta's two with `make drills`, and
# Delta's commit refused on S3 in tests/e2e/test_object_store.py.
@pytest.mark.parametrize("fmt", [pytest.param("delta", marks=pytest.mark.drill), "parquet"])
def test_a_driver_paused_at_each_point_of_its_commit_loses_and_doubles_nothing(
    broker, postgres, tmp_path: Path, monkeypatch, capsys, fmt: str
) -> None:
    """At each named point of the commit path, a driver pauses (SIGSTOP, as a GC pause or a
    frozen VM does, with its JVM) past its lease; a driver on the other host takes the stream over and
    writes the batch the paused one was in; then the paused one goes on (SIGCONT), right at
    its act: a Delta write, a Parquet commit, its clean-up, or Spark's own commit entry. The
    storage refuses what it would have done twice: it exits 5, and every record is in the
    tables once (delta-rs; pyarrow over the files the Parquet log lists). On local disk, where
    a batch takes a second; on S3 the production layout's schedule pauses drivers at random
    points (tests/e2e/test_cluster.py), and tests/e2e/test_object_store.py races each commit."""
    ttl = 8.0
    shared_state(postgres, monkeypatch, ttl=ttl)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    topic = new_topic(broker, partitions=2)
    p = make_pipeline(
        tmp_path,
        topic,
        sink={"format": fmt},
        source={"max_offsets_per_trigger": 100},
        trigger={"processing_time": "500 milliseconds"},
    )
    gen = EventGenerator(p, seed=31 if fmt == "delta" else 37)
    sent: set[tuple[str, int, int]] = set()

    def produce(n: int) -> None:
        report = send(broker.bootstrap, topic, synthetic(gen, n, bad_fraction=0.1), keep=True)
        sent.update((topic, d.partition, d.offset) for d in report.delivered)

    produce(60)
    hosts = ["host-a", "host-b"]
    paused: tuple[int, Path, str] | None = None  # the paused driver's launch (its group's leader), log, point
    took: list[float] = []
    next_batch: int | None = None
    for i, point in enumerate([*PAUSE_POINTS[fmt], None]):
        if paused is not None:
            began = time.monotonic()
            while drivers.running(p) is not None:  # the paused driver's lease runs out; nobody takes it sooner
                assert time.monotonic() - began < ttl + 30, "the paused driver's lease did not expire"
                time.sleep(0.2)
            took.append(time.monotonic() - began)
        monkeypatch.setenv("SLUICE_HOSTNAME", hosts[i % 2])
        if point is not None:  # it pauses in the batch after the one the paused driver was in
            monkeypatch.setenv(faults.ENV, f"pause@{point}" + ("" if next_batch is None else f"#{next_batch}"))
        else:
            monkeypatch.delenv(faults.ENV, raising=False)
        started = stream.start(p, LocalTarget("local[1]"), by=f"drill {hosts[i % 2]}")
        monkeypatch.delenv(faults.ENV, raising=False)
        log = Path(started.driver.log)
        produce(60)  # batches for it: the paused one's again, and one to pause in
        proc = python_driver(started)
        if point is not None:
            next_batch = wait_paused(proc, log) + 1
        else:
            wait_written(p, len(sent), lambda log=log: log.read_text()[-3000:], timeout=300)
        if paused is not None:  # the batch it paused in is written by now: it goes on, at its act
            launch, old_log, where = paused
            os.killpg(os.getpgid(launch), signal.SIGCONT)  # the driver and its JVM
            code = psutil.Process(launch).wait(timeout=180)  # spark-submit's, which exits as its Python driver did
            text = old_log.read_text()
            assert code == 5 and "lost the lease" in text, f"paused at {where}: exit {code}\n{text[-3000:]}"
        paused = (started.driver.pid, log, point) if point is not None else None
    produce(40)
    wait_written(p, len(sent), lambda: processes.log_tail((Driver.read(p.name) or started.driver).log, 60))
    stream.stop(p, by="drill")
    result = exactly_once(p, sent)
    with capsys.disabled():
        print(
            f"\npause points ({fmt}): paused at {', '.join(PAUSE_POINTS[fmt])}, each taken over "
            f"{', '.join(f'{t:.1f}s' for t in took)} after its lease ran out; {result}"
        )
    assert result["lost"] == 0 and result["duplicated"] == 0, result
