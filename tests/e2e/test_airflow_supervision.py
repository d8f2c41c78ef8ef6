"""Airflow runs a pipeline's life with `airflow dags test` on the real broker, Spark and Delta:
start, backfill what the stream skipped, survive a killed driver, fail loudly on a stall,
stop gracefully and stay stopped; and the lineage of it all reaches an OpenLineage receiver."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import drivers, processes, stream
from sluice.records.run import Driver, Status
from sluice.spec import Pipeline
from tests.fixtures import audit_totals, make_pipeline, new_topic
from tests.lineage_receiver import Receiver

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
            tail = processes.log_tail(driver.log, 60) if driver else "(no driver)"
            pytest.fail(f"timed out waiting for {what}; totals {audit_totals(pipeline)}\n{tail}")
        time.sleep(1)


def committed_in(pipeline: Pipeline) -> int:
    return audit_totals(pipeline)["records_in"] if Path(pipeline.audit_path).exists() else 0


def test_start_backfill_kill_supervise_stall_stop(airflow, broker, spark, tmp_path, monkeypatch, request) -> None:
    # The frozen driver below must still hold its lease when supervision looks at it (stalled
    # past max_stall, 15 s): past its lease a paused driver is taken over, as the pause drills
    # test. The default 30 s left too little room for `airflow dags test` on a busy machine.
    monkeypatch.setenv("SLUICE_LEASE_TTL", "90")
    # One setting on the host turns on both: Airflow's OpenLineage provider for the tasks, and
    # the stream drivers the tasks start (they inherit it), here with a RUNNING every second.
    receiver = Receiver()
    request.addfinalizer(receiver.close)
    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    monkeypatch.setenv("SLUICE_LINEAGE_INTERVAL", "1")
    resident = airflow.resident(request)  # its nine commands in one interpreter, with the settings above
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
    request.addfinalizer(lambda: drivers.driver_process(pipeline) and stream.stop(pipeline, by="test", timeout=60))
    missed = produce(pipeline, topic, broker, 120, seed=1)  # before the stream starts at 'latest'

    run = resident.dags_test(dag, {"action": "start"})
    assert run.state == "success", run.log[-4000:]
    assert "launched lifecycle on local[2]" in run.log
    driver = Driver.read("lifecycle")
    assert driver is not None and driver.desired == "running"
    first_pid = driver.pid
    # One driver, two processes: the log names each with its role.
    assert f"spark-submit pid {first_pid}, Python driver pid {Status.read('lifecycle').pid}," in run.log

    live = produce(pipeline, topic, broker, 200, seed=2)
    wait_for("200 live records", lambda: committed_in(pipeline) >= 200, pipeline)

    # Backfill from the beginning: the 120 records the stream skipped land, the 200 it wrote do not repeat.
    run = resident.dags_test(dag, {"action": "backfill", "from_offset": 0})
    assert run.state == "success", run.log[-4000:]
    assert "backfill offsets-" in run.log
    backfills = sorted(Path(pipeline.checkpoint_path + "_backfills").iterdir())
    # A backfill without a range fails at once with the reason; one that holds no record skips
    # its Spark job and publishes nothing.
    run = resident.dags_test(dag, {"action": "backfill"})
    assert run.state == "failed" and "none was given" in run.log, run.log[-4000:]
    # A refusal ends the task with its reason alone: no traceback, no retry.
    assert "Traceback" not in run.log and "Task failed with exception" not in run.log, run.log[-4000:]
    assert "Retry policy decision" in run.log and "action=fail" in run.log, run.log[-4000:]
    run = resident.dags_test(dag, {"action": "backfill", "from_offset": 10**9})
    assert run.state == "success" and "nothing to backfill" in run.log, run.log[-4000:]
    assert sorted(Path(pipeline.checkpoint_path + "_backfills").iterdir()) == backfills
    table = read_table(spark, "delta", pipeline.sink_path)
    assert table.count() == 320
    assert table.select("_kafka_partition", "_kafka_offset").distinct().count() == 320

    # The driver dies hard; scheduled supervision restarts it from the checkpoint.
    os.killpg(first_pid, signal.SIGKILL)
    later = produce(pipeline, topic, broker, 150, seed=3)
    run = resident.dags_test(dag)  # default params: action=supervise
    assert run.state == "success", run.log[-4000:]
    assert "restarting it from its checkpoint" in run.log
    restarted = Driver.read("lifecycle")
    assert restarted is not None and restarted.pid != first_pid
    wait_for("the records sent while it was down", lambda: committed_in(pipeline) >= 350, pipeline)

    # Alive but frozen: supervision fails the run with the reason, and does not restart it.
    proc = drivers.driver_process(pipeline)
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(17)
        run = resident.dags_test(dag)
        assert run.state == "failed"
        assert "stalled: the driver is alive but has not reported for" in run.log
    finally:
        proc.send_signal(signal.SIGCONT)

    # Stop after the current batch; a later supervision leaves it stopped.
    python_pid = Status.read("lifecycle").pid
    run = resident.dags_test(dag, {"action": "stop"})
    assert run.state == "success", run.log[-4000:]
    assert "stopped lifecycle gracefully" in run.log and f"(Python driver pid {python_pid})" in run.log
    assert drivers.driver_process(pipeline) is None
    assert Status.read("lifecycle").state == "stopped"
    run = resident.dags_test(dag)  # a scheduled supervision leaves it stopped
    assert run.state == "success" and "stopped on request" in run.log, run.log[-4000:]
    assert drivers.driver_process(pipeline) is None

    # Nothing lost, nothing repeated across start, backfill, kill, restart, stall and stop.
    sent = {(r.partition, r.offset) for r in missed + live + later}
    rows = read_table(spark, "delta", pipeline.sink_path).select("_kafka_partition", "_kafka_offset").collect()
    assert len(rows) == len(sent) == 470
    assert {(r[0], r[1]) for r in rows} == sent

    # The maintenance DAG compacts what many one-second batches left behind, rows unchanged.
    def files() -> int:
        return spark.sql(f"DESCRIBE DETAIL delta.`{pipeline.sink_path}`").first()["numFiles"]

    before = files()
    run = resident.dags_test("sluice_lifecycle_maintenance")
    assert run.state == "success", run.log[-4000:]
    assert "OPTIMIZE date >=" in run.log and "VACUUM RETAIN 168 HOURS" in run.log
    assert files() < before
    assert read_table(spark, "delta", pipeline.sink_path).count() == 470

    check_lineage(receiver, pipeline)


def stat(dataset: dict) -> int:
    """The records the run had read (no count before its first batch)."""
    return (dataset.get("inputFacets") or {}).get("inputStatistics", {}).get("rowCount", 0)


def check_lineage(receiver: Receiver, pipeline: Pipeline) -> None:
    """What the receiver got from the life above: every event valid, the tasks' datasets, and
    the stream's two runs (the killed driver's and its successor's)."""
    table, quarantine = ("file", pipeline.sink_path), ("file", pipeline.quarantine_path)
    topic = (f"kafka://{pipeline.kafka.bootstrap_servers.split(',')[0]}", pipeline.kafka.topics[0])

    def names(datasets: list[dict]) -> list[tuple[str, str]]:
        return [(d["namespace"], d["name"]) for d in datasets]

    def task_events() -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for e in receiver.events:
            out.setdefault(e["job"]["name"], []).append(e)
        return out

    wanted = ["sluice_lifecycle.start", "sluice_lifecycle.backfill", "sluice_lifecycle_maintenance.optimize_and_vacuum"]
    deadline = time.monotonic() + 60
    while not all(any(e["eventType"] == "COMPLETE" for e in task_events().get(j, [])) for j in wanted):
        assert time.monotonic() < deadline, f"task events missing: {sorted(task_events())}; {receiver.invalid[:3]}"
        time.sleep(1)
    assert receiver.invalid == [], receiver.invalid[:3]

    jobs = task_events()
    for job in ("sluice_lifecycle.start", "sluice_lifecycle.backfill"):
        for e in jobs[job]:
            assert names(e["inputs"]) == [topic] and names(e["outputs"]) == [table, quarantine], e
    start = next(e for e in jobs["sluice_lifecycle.start"] if e["eventType"] == "COMPLETE")
    lineage = start["outputs"][0]["facets"]["columnLineage"]["fields"]
    assert set(lineage) == {*pipeline.plan.names, "_event_time", "date"}
    column = pipeline.plan.columns[0]
    assert lineage[column.name]["inputFields"][0]["field"] == column.path
    maintain = jobs["sluice_lifecycle_maintenance.optimize_and_vacuum"][-1]
    assert names(maintain["inputs"]) == names(maintain["outputs"]) == [table, quarantine]
    assert all(not e["inputs"] and not e["outputs"] for e in jobs["sluice_lifecycle.stop"])

    # The stream's runs: the killed driver's ends without a word; its successor's completes.
    runs: dict[str, list[dict]] = {}
    for e in receiver.of_job("sluice.lifecycle"):
        runs.setdefault(e["run"]["runId"], []).append(e)
    assert len(runs) == 2, {r: [e["eventType"] for e in es] for r, es in runs.items()}
    killed, stopped = sorted(runs.values(), key=lambda es: es[0]["eventTime"])
    for events in (killed, stopped):
        assert events[0]["eventType"] == "START"
        assert names(events[0]["outputs"]) == [table, quarantine] and names(events[0]["inputs"]) == [topic]
        read = [stat(e["inputs"][0]) for e in events if e["eventType"] == "RUNNING"]
        assert read and read == sorted(read), read
    assert {e["eventType"] for e in killed} == {"START", "RUNNING"}
    assert max(stat(e["inputs"][0]) for e in killed if e["eventType"] == "RUNNING") >= 200
    assert stopped[-1]["eventType"] == "COMPLETE" and stat(stopped[-1]["inputs"][0]) >= 150
    assert stopped[-1]["run"]["facets"]["processing_engine"]["name"] == "spark"
