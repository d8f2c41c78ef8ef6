"""Airflow runs a pipeline's life with `airflow dags test` on the real broker, Spark and Delta:
start, backfill what the stream skipped, survive a killed driver, fail loudly on a stall,
stop gracefully and stay stopped."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.sinks import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import stream
from sluice.records.run import Driver, Status
from sluice.spec import Pipeline
from tests.fixtures import audit_totals, make_pipeline, new_topic

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def produce(pipeline: Pipeline, topic: str, broker, count: int, seed: int) -> list:
    report = send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=seed), count), keep=True)
    assert len(report.delivered) == count
    return report.delivered


def wait_for(what: str, condition: Callable[[], bool], pipeline: Pipeline, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            driver = Driver.read(pipeline.name)
            tail = stream.log_tail(driver.log, 60) if driver else "(no driver)"
            pytest.fail(f"timed out waiting for {what}; totals {audit_totals(pipeline)}\n{tail}")
        time.sleep(1)


def committed_in(pipeline: Pipeline) -> int:
    return audit_totals(pipeline)["records_in"] if Path(pipeline.audit_path).exists() else 0


def test_start_backfill_kill_supervise_stall_stop(airflow, broker, spark, tmp_path, monkeypatch, request) -> None:
    # The frozen driver below must still hold its lease when supervision looks at it (stalled
    # past max_stall, 15 s): past its lease a paused driver is taken over, as the pause drills
    # test. The default 30 s left too little room for `airflow dags test` on a busy machine.
    monkeypatch.setenv("SLUICE_LEASE_TTL", "90")
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(
        airflow.pipelines,
        topic,
        name="lifecycle",
        source={"starting_offsets": "latest"},
        trigger={"processing_time": "1 second"},
        supervision={"schedule": None, "max_stall": "15 seconds"},
    )
    dag = "sluice_lifecycle"
    # A failure midway must not leave a stream running under the rest of the suite.
    request.addfinalizer(lambda: stream.driver_process(pipeline) and stream.stop(pipeline, by="test", timeout=60))
    missed = produce(pipeline, topic, broker, 120, seed=1)  # before the stream starts at 'latest'

    run = airflow.dags_test(dag, {"action": "start"})
    assert run.state == "success", run.log[-4000:]
    assert "launched lifecycle on local[2]" in run.log
    driver = Driver.read("lifecycle")
    assert driver is not None and driver.desired == "running"
    first_pid = driver.pid

    live = produce(pipeline, topic, broker, 200, seed=2)
    wait_for("200 live records", lambda: committed_in(pipeline) >= 200, pipeline)

    # Backfill from the beginning: the 120 records the stream skipped land, the 200 it wrote do not repeat.
    run = airflow.dags_test(dag, {"action": "backfill", "from_offset": 0})
    assert run.state == "success", run.log[-4000:]
    assert "backfill offsets-" in run.log
    backfills = sorted(Path(pipeline.checkpoint_path + "_backfills").iterdir())
    # A backfill without a range fails at once with the reason; one that holds no record skips
    # its Spark job and publishes nothing.
    run = airflow.dags_test(dag, {"action": "backfill"})
    assert run.state == "failed" and "none was given" in run.log, run.log[-4000:]
    run = airflow.dags_test(dag, {"action": "backfill", "from_offset": 10**9})
    assert run.state == "success" and "nothing to backfill" in run.log, run.log[-4000:]
    assert sorted(Path(pipeline.checkpoint_path + "_backfills").iterdir()) == backfills
    table = read_table(spark, "delta", pipeline.sink_path)
    assert table.count() == 320
    assert table.select("_kafka_partition", "_kafka_offset").distinct().count() == 320

    # The driver dies hard; scheduled supervision restarts it from the checkpoint.
    os.killpg(first_pid, signal.SIGKILL)
    later = produce(pipeline, topic, broker, 150, seed=3)
    run = airflow.dags_test(dag)  # default params: action=supervise
    assert run.state == "success", run.log[-4000:]
    assert "restarting it from its checkpoint" in run.log
    restarted = Driver.read("lifecycle")
    assert restarted is not None and restarted.pid != first_pid
    wait_for("the records sent while it was down", lambda: committed_in(pipeline) >= 350, pipeline)

    # Alive but frozen: supervision fails the run with the reason, and does not restart it.
    proc = stream.driver_process(pipeline)
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(17)
        run = airflow.dags_test(dag)
        assert run.state == "failed"
        assert "stalled: the driver is alive but has not reported for" in run.log
    finally:
        proc.send_signal(signal.SIGCONT)

    # Stop after the current batch; a later supervision leaves it stopped.
    run = airflow.dags_test(dag, {"action": "stop"})
    assert run.state == "success", run.log[-4000:]
    assert "stopped lifecycle gracefully" in run.log
    assert stream.driver_process(pipeline) is None
    assert Status.read("lifecycle").state == "stopped"
    run = airflow.dags_test(dag)  # a scheduled supervision leaves it stopped
    assert run.state == "success" and "stopped on request" in run.log, run.log[-4000:]
    assert stream.driver_process(pipeline) is None

    # Nothing lost, nothing repeated across start, backfill, kill, restart, stall and stop.
    sent = {(r.partition, r.offset) for r in missed + live + later}
    rows = read_table(spark, "delta", pipeline.sink_path).select("_kafka_partition", "_kafka_offset").collect()
    assert len(rows) == len(sent) == 470
    assert {(r[0], r[1]) for r in rows} == sent

    # The maintenance DAG compacts what many one-second batches left behind, rows unchanged.
    def files() -> int:
        return spark.sql(f"DESCRIBE DETAIL delta.`{pipeline.sink_path}`").first()["numFiles"]

    before = files()
    run = airflow.dags_test("sluice_lifecycle_maintenance")
    assert run.state == "success", run.log[-4000:]
    assert "OPTIMIZE date >=" in run.log and "VACUUM RETAIN 168 HOURS" in run.log
    assert files() < before
    assert read_table(spark, "delta", pipeline.sink_path).count() == 470
