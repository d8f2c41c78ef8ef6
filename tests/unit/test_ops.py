"""Every action of sluice.ops with a fake Spark target and a temporary SLUICE_HOME: no JVM,
no broker, no Airflow. The fake "stream" is a real process found, judged and stopped the
way a real driver is (see fake_target.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaError, KafkaException

from sluice.errors import AlreadyRunning, InvalidInput, JobFailed, NothingToDo, StartFailed, StreamUnhealthy
from sluice.ops import backfill, drivers, publish, stream, supervision, validate
from sluice.records.audit import BatchAudit, file_name
from sluice.records.backfill import BackfillPlan
from sluice.records.run import FORGET_AFTER, Driver, Failures, Status
from sluice.spec import Pipeline, load_pipeline
from sluice.state import hostname
from sluice.state import lease as locks
from sluice.state.lease import Holder, acquire
from tests.derived_tables import derived_spec
from tests.fixtures import make_pipeline
from tests.unit.fake_target import FakeTarget, no_lag


@pytest.fixture
def pipeline(home: Path) -> Pipeline:
    return make_pipeline(home, "events", supervision={"max_stall": "1 second"})


def test_start_status_stop_and_a_second_start(home: Path, pipeline: Pipeline) -> None:
    target = FakeTarget(home)
    with pytest.raises(InvalidInput, match="processing time"):
        stream.start(pipeline, target, by="test", processing_time="soon")
    started = stream.start(pipeline, target, by="test", processing_time="5s")
    assert started.status.state == "running" and started.driver.desired == "running"
    assert started.driver.launched_by == "test" and "fake driver run" in started.log_tail()
    assert target.launched[0].application_args == ["--spec", str(pipeline.spec_path), "--processing-time", "5 seconds"]

    with pytest.raises(AlreadyRunning, match="already running"):
        stream.start(pipeline, target, by="test")
    assert len(target.launched) == 1

    st = supervision.status(pipeline, no_lag)
    assert st.observation.alive and st.verdict.action == "none" and st.healthy and st.broker_error is None

    said = stream.stop(pipeline, by="test stop")
    assert said.startswith(f"stopped {pipeline.name} gracefully")
    driver = Driver.read(pipeline.name)
    assert driver is not None and driver.desired == "stopped" and driver.stopped_by == "test stop"
    assert (Status.read(pipeline.name) or Status("", "", 0, 0)).state == "stopped"
    assert stream.stop(pipeline, by="again") == f"{pipeline.name} is not running; it stays stopped"

    after = supervision.status(pipeline, no_lag)
    assert (
        not after.observation.alive and after.verdict.action == "none" and "stopped on request" in after.verdict.reason
    )


def test_run_once_is_recorded_as_once_and_not_restarted(home: Path, pipeline: Pipeline) -> None:
    target = FakeTarget(home, mode="once")
    started = stream.start(pipeline, target, by="test", available_now=True)
    assert started.status.state == "finished" and started.driver.desired == "once"
    assert "--available-now" in target.launched[0].application_args
    done = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert done.started is None and "ended (finished)" in done.status.verdict.reason


def test_a_driver_that_reported_its_end_is_not_running_while_it_lets_go(home: Path, pipeline: Pipeline) -> None:
    # The job saves its final state a moment before it releases its lease; in between it is ending, not healthy.
    lease = locks.take(pipeline.name, locks.claims_for(pipeline), None)
    Status(pipeline.name, "running", os.getpid(), time.time(), "local-1").save(fence=lease)
    assert supervision.status(pipeline, no_lag).observation.alive
    Status(pipeline.name, "finished", os.getpid(), time.time(), "local-1").save(fence=lease)
    st = supervision.status(pipeline, no_lag)
    assert not st.observation.alive and st.holder is None
    locks.release(lease)


@pytest.mark.parametrize(("mode", "words"), [("fail", "checkpoint is new"), ("exit", "exited")])
def test_a_start_that_fails_says_why_with_the_log(home: Path, pipeline: Pipeline, mode: str, words: str) -> None:
    with pytest.raises(StartFailed, match=words) as failed:
        stream.start(pipeline, FakeTarget(home, mode=mode), by="test")
    assert failed.value.transient and f"fake driver {mode}" in str(failed.value)


def test_supervise_starts_keeps_and_restarts(home: Path, pipeline: Pipeline) -> None:
    target = FakeTarget(home)
    first = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert first.started is not None and first.status.verdict.action == "start"

    again = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert again.started is None and again.status.verdict.reason.startswith("healthy")

    os.killpg(first.started.driver.pid, signal.SIGKILL)  # the driver dies
    psutil.wait_procs([psutil.Process(first.started.driver.pid)], timeout=5)
    revived = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert revived.status.verdict.action == "restart" and revived.started is not None
    assert revived.started.driver.pid != first.started.driver.pid
    assert len(target.launched) == 2


def test_a_scheduled_supervision_starts_nothing_but_keeps_up_what_was_started(home: Path, pipeline: Pipeline) -> None:
    # Unpausing a DAG queues a scheduled supervision: it must not start a stream nobody asked for.
    target = FakeTarget(home)
    idle = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag, start_new=False)
    assert idle.started is None and not target.launched
    assert idle.status.verdict.action == "none" and "sluice start" in idle.status.verdict.reason

    started = stream.start(pipeline, target, by="a person", available_now=False)
    os.killpg(started.driver.pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(started.driver.pid)], timeout=5)
    revived = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag, start_new=False)
    assert revived.status.verdict.action == "restart" and revived.started is not None
    assert len(target.launched) == 2


def test_supervise_fails_loudly_on_a_stalled_or_lagging_stream(home: Path, pipeline: Pipeline) -> None:
    stream.start(pipeline, FakeTarget(home, mode="hang"), by="test")
    time.sleep(1.3)  # no heartbeat for longer than max_stall
    with pytest.raises(StreamUnhealthy, match="has not reported") as unhealthy:
        supervision.supervise(pipeline, FakeTarget(home), by="scheduler", offsets=no_lag)
    assert not unhealthy.value.transient
    stream.stop(pipeline, by="test", timeout=5)

    lagging = make_pipeline(home, "lagging", supervision={"max_lag": 10})
    stream.start(lagging, FakeTarget(home), by="test")
    with pytest.raises(StreamUnhealthy, match="lagging: 500 records"):
        supervision.supervise(lagging, FakeTarget(home), by="scheduler", offsets=lambda p: {"lagging": {0: 500}})


def wait_dead(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=10)


def test_a_crash_loop_backs_off_then_stops_restarting_and_is_unhealthy_until_a_person_starts_it(
    home: Path,
) -> None:
    pipeline = make_pipeline(home, "looping", supervision={"max_failures": 3, "backoff": "1 second"})
    target = FakeTarget(home, mode="crash")
    first = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert first.started is not None
    wait_dead(first.started.driver.pid)

    st = supervision.status(pipeline, no_lag)  # failed once: it waits out its back-off, unhealthy meanwhile
    assert st.verdict.action == "wait" and not st.healthy
    assert "failed on batch 2 (1 of 3 tries): expectation 'card_id_format' failed" in st.verdict.reason
    assert supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag).started is None
    assert len(target.launched) == 1

    for tries in (2, 3):  # 1 s, then 2 s: the back-off doubles
        time.sleep(2 ** (tries - 2) + 0.1)
        again = supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
        assert again.status.verdict.action == "restart" and again.started is not None
        wait_dead(again.started.driver.pid)
        failures = Failures.read(pipeline.name)
        assert failures is not None and (failures.batch, failures.count) == (2, tries)

    with pytest.raises(StreamUnhealthy) as gave_up:  # the Airflow task fails: alerting fires
        supervision.supervise(pipeline, target, by="scheduler", offsets=no_lag)
    assert str(gave_up.value) == (
        "p_looping: failed 3 times in a row on batch 2, so it is not restarted again: expectation "
        "'card_id_format' failed for 1 of 1 records in batch 2. Once the cause is dealt with, start it "
        "again (`sluice start p_looping`, or action=start)"
    )
    assert not gave_up.value.transient and len(target.launched) == 3
    failed = supervision.status(pipeline, no_lag)
    assert failed.verdict.action == "failed" and not failed.healthy and not failed.as_dict()["healthy"]

    # A start a person asks for gets its own tries.
    stream.start(pipeline, FakeTarget(home), by="test")
    assert Failures.read(pipeline.name) is None and supervision.status(pipeline, no_lag).healthy
    stream.stop(pipeline, by="test", timeout=5)


def test_failures_in_a_row_are_on_one_batch_and_close_together(home: Path) -> None:
    assert Failures.record("p", 2, "boom", now=0).count == 1
    assert Failures.record("p", 2, "boom", now=100).count == 2
    assert Failures.record("p", 3, "other", now=200).count == 1  # another batch: it got past 2
    # An idle stream meeting a passing outage now and then is not in a loop.
    assert Failures.record("p", 3, "other", now=200 + FORGET_AFTER + 1).count == 1


def test_only_a_pipeline_derived_from_a_table_is_rebuilt(home: Path, pipeline: Pipeline) -> None:
    with pytest.raises(InvalidInput, match="reads Kafka, not a table"):
        stream.rebuild(pipeline, FakeTarget(home), by="test")
    derived = load_pipeline(derived_spec(home, "counts", pipeline.name, filter="device_type = 'x'"))
    target = FakeTarget(home)
    stream.start(derived, target, by="test")
    done = stream.rebuild(derived, target, by="test")  # stops it first: the job deletes under its claims
    assert done.stopped is not None and "gracefully" in done.stopped
    assert "--rebuild" in target.launched[1].application_args and "--rebuild" not in target.launched[0].application_args
    stream.stop(derived, by="test", timeout=5)


def test_restart_stops_then_starts_from_the_checkpoint(home: Path, pipeline: Pipeline) -> None:
    target = FakeTarget(home)
    cold = stream.restart(pipeline, target, by="test")
    assert cold.stopped is None and cold.started.status.state == "running"
    warm = stream.restart(pipeline, target, by="test")
    assert warm.stopped is not None and "gracefully" in warm.stopped
    assert warm.started.driver.pid != cold.started.driver.pid


def test_a_driver_that_ignores_sigterm_is_terminated_after_the_timeout(home: Path, pipeline: Pipeline) -> None:
    started = stream.start(pipeline, FakeTarget(home, mode="ignore-term"), by="test")
    said = stream.stop(pipeline, by="test", timeout=1, grace=0.5)
    assert "did not stop within 1s" in said and drivers.driver_process(pipeline) is None
    assert not psutil.pid_exists(started.driver.pid)


def test_status_without_a_broker_still_shows_the_local_state(home: Path, pipeline: Pipeline) -> None:
    def unreachable(_: Pipeline) -> dict[str, dict[int, int]]:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))

    st = supervision.status(pipeline, unreachable)
    assert st.broker_error is not None and "did not answer" in st.broker_error
    assert st.observation.lag is None and st.verdict.action == "start"


# --- backfill -----------------------------------------------------------------------------


@pytest.fixture
def kafka_holds(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[int, tuple[int, int]]]:
    """The broker's watermarks as the plan sees them: the one input that comes from Kafka."""
    marks = {"events": {0: (0, 100), 1: (20, 80)}}
    monkeypatch.setattr(backfill, "watermarks", lambda _bootstrap, topic: marks[topic])
    return marks


def commit_offsets(pipeline: Pipeline, offsets: dict[str, dict[str, int]]) -> None:
    """A checkpoint whose batch 0 committed these end offsets, as Spark writes it."""
    cp = Path(pipeline.checkpoint_path)
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n' + json.dumps(offsets))
    (cp / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "none was given"),
        ({"from_offset": 1, "from_time": "2026-11-01T00:00:00Z"}, "not both"),
        ({"from_offset": 50, "to_offset": 10}, "the range is empty"),
        ({"from_offset": 50, "to_offset": 50}, "the range is empty"),
        ({"from_offset": -5}, "0 or more"),
        ({"to_offset": 100}, "give from_offset"),
        ({"from_time": "yesterday"}, "not an ISO-8601 time"),
        ({"from_time": "2026-11-02T00:00:00Z", "to_time": "2026-11-01T00:00:00Z"}, "the range is empty"),
    ],
)
def test_a_backfill_range_that_is_not_a_range_is_invalid_input(
    pipeline: Pipeline, kafka_holds: dict[str, dict[int, tuple[int, int]]], kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidInput, match=words) as bad:
        backfill.plan(pipeline, **kwargs)  # type: ignore[arg-type]
    assert bad.value.exit_code == 2


def test_a_backfill_plan_covers_only_what_the_stream_committed(
    home: Path, pipeline: Pipeline, kafka_holds: dict[str, dict[int, tuple[int, int]]]
) -> None:
    with pytest.raises(NothingToDo, match="has not committed a batch yet"):
        backfill.plan(pipeline, from_offset=0)
    commit_offsets(pipeline, {"events": {"0": 60, "1": 50}})
    with pytest.raises(NothingToDo, match="Kafka holds no records"):
        backfill.plan(pipeline, from_offset=500)

    plan = backfill.plan(pipeline, from_offset=10, to_offset=70)
    assert plan.ranges == {"events": {0: (10, 60), 1: (20, 50)}}  # clipped to the log and to the stream
    assert plan.refused == {"events": {0: (60, 70), 1: (50, 70)}} and "refused 30 records" in (plan.refusal() or "")
    assert plan.records == 80 and backfill.plan(pipeline, from_offset=10, to_offset=70).id == plan.id

    target = FakeTarget(home)
    backfill.run(pipeline, target, plan)
    (sub,) = target.ran
    assert sub.name == f"sluice-{pipeline.name}-backfill"
    assert BackfillPlan.from_json(sub.application_args[sub.application_args.index("--backfill") + 1]) == plan

    target.fail_runs = True
    with pytest.raises(JobFailed):
        backfill.run(pipeline, target, plan)


# --- validate -----------------------------------------------------------------------------


def test_validation_selections_from_either_front_end(pipeline: Pipeline) -> None:
    default = pipeline.spec.expectations.validation.partitions
    assert str(validate.selection(pipeline)) == f"latest:{default}"
    assert str(validate.selection(pipeline, latest=3)) == "latest:3"
    assert str(validate.selection(pipeline, dates="2026-11-18..2026-11-20")) == "2026-11-18..2026-11-20"
    assert str(validate.selection(pipeline, from_date="2026-11-18")) == "2026-11-18"
    assert str(validate.selection(pipeline, to_date="2026-11-19")) == "2026-11-19"
    for bad in (
        {"dates": "2026-11-20", "latest": 2},
        {"dates": "2026-11-20", "from_date": "2026-11-20"},
        {"dates": "someday"},
        {"from_date": "2026-11-20", "to_date": "2026-11-01"},
    ):
        with pytest.raises(InvalidInput):
            validate.selection(pipeline, **bad)  # type: ignore[arg-type]


def test_validate_runs_the_job_and_reads_its_report(home: Path, pipeline: Pipeline) -> None:
    target = FakeTarget(home)
    report = validate.validate(pipeline, target, validate.selection(pipeline, dates="2026-11-20"))
    assert report.passed and report.partitions[0].rows == 10
    assert target.ran[0].application_args[target.ran[0].application_args.index("--dates") + 1] == "2026-11-20"

    silent = FakeTarget(home)
    silent.run = lambda sub: None  # type: ignore[method-assign]  # a job that ends without its report
    with pytest.raises(JobFailed, match="without writing"):
        validate.validate(pipeline, silent, validate.selection(pipeline))


# --- publish ------------------------------------------------------------------------------


def write_audit(folder: Path, batch_id: int, records_in: int, quarantined: int, present: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    a = BatchAudit("p", batch_id, records_in, records_in - quarantined, quarantined, records_in - quarantined)
    a.records_already_present = present
    (folder / file_name(batch_id)).write_text(a.to_json())


def test_publish_announces_each_batch_once_including_backfills(home: Path, pipeline: Pipeline) -> None:
    emitted: list[dict[str, int]] = []
    with pytest.raises(NothingToDo):
        publish.publish(pipeline, emitted.append)

    write_audit(Path(pipeline.audit_path), 0, 10, 1)
    write_audit(Path(pipeline.backfill_checkpoint_path("offsets-1")) / "sluice_audit", 0, 5, 0)
    first = publish.publish(pipeline, emitted.append)
    assert first == {"batches": 2, "records_in": 15, "records_out": 14, "rows_out": 14, "records_quarantined": 1}
    assert emitted == [first]
    with pytest.raises(NothingToDo, match="no batch"):
        publish.publish(pipeline, emitted.append)

    time.sleep(0.01)  # a later mtime than the marker's
    write_audit(Path(pipeline.audit_path), 1, 7, 7)

    def broken(_: dict[str, int]) -> None:
        raise RuntimeError("the metadata DB is down")

    with pytest.raises(RuntimeError):
        publish.publish(pipeline, broken)
    assert publish.publish(pipeline, emitted.append)["records_quarantined"] == 7  # not lost by the failed emit

    # A backfill of records the tables already hold changes no table: no asset event, and why.
    time.sleep(0.01)
    write_audit(Path(pipeline.backfill_checkpoint_path("offsets-2")) / "sluice_audit", 0, 0, 0, present=3000)
    with pytest.raises(NothingToDo, match="1 batch of .* wrote no row: their 3000 records were already in the tables"):
        publish.publish(pipeline, emitted.append)
    with pytest.raises(NothingToDo, match="no batch"):  # announced as nothing once, not again
        publish.publish(pipeline, emitted.append)
    assert len(emitted) == 2


def test_a_pid_in_a_record_is_no_driver_a_lease_is(home: Path, pipeline: Pipeline) -> None:
    """After a container restart a pid in a run record can name any process: a driver is
    whoever holds the pipeline's lease, and a holder's pid means something only on its host."""
    import subprocess
    import sys

    other = make_pipeline(home, "other")
    cmd = [sys.executable, "-c", "import time; time.sleep(30)", "ingest.py", "--spec", str(other.spec_path)]
    proc = subprocess.Popen(cmd)
    try:
        assert Driver(pipeline.name, proc.pid, cmd, "log", time.time(), "test").save_if_unchanged()
        assert drivers.running(pipeline) is None and drivers.driver_process(pipeline) is None
        assert stream.stop(pipeline, by="test") == f"{pipeline.name} is not running; it stays stopped"
        assert proc.poll() is None  # the other pipeline's driver runs on

        claims = locks.claims_for(pipeline)
        acquire(claims, Holder(pipeline.name, hostname(), proc.pid, "here"), ttl=60)
        assert (held := drivers.running(pipeline)) is not None and held.pid == proc.pid
        proc.kill()
        proc.wait()
        assert drivers.running(pipeline) is None  # gone from this host: free at once, not after 60 s
        acquire(claims, Holder(pipeline.name, "host-b", proc.pid, "there"), ttl=60)
        assert (held := drivers.running(pipeline)) is not None and held.host == "host-b"
        assert drivers.driver_process(pipeline) is None  # nothing to signal here
        with pytest.raises(AlreadyRunning, match=f"{pipeline.name} is already running on host-b"):
            stream.start(pipeline, FakeTarget(home), by="test")
    finally:
        proc.kill()
        proc.wait()


def continuous_branch(home: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A continuous branch on a two-partition topic, whose cores are waited for one second."""
    monkeypatch.setattr(stream, "total_partitions", lambda bootstrap, topics: 2)
    monkeypatch.setattr(stream, "CORES_TIMEOUT", 1.0)
    return make_pipeline(
        home,
        "payments",
        name="fraud",
        schema="payment/v1.json",
        mode="continuous",
        event_time={"field": "created_at", "format": "iso8601"},
        sink={"format": "kafka", "topic": "verdicts", "path": None},
        continuous={"rules": {"large_amount": "amount > 1500"}},
    )


def test_a_continuous_branch_short_of_cores_on_a_cluster_is_stopped_and_says_so(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short of a core per partition its query reports running and reads nothing: the start
    must not look like a success."""
    fraud = continuous_branch(home, monkeypatch)
    target = FakeTarget(home, master="spark://master:7077", cores=1)
    with pytest.raises(StartFailed, match=r"^fraud: the Spark cluster granted 1 of the 2 cores a continuous branch"):
        stream.start(fraud, target, by="test")
    assert target.launched[0].conf["spark.cores.max"] == "2"
    assert drivers.running(fraud) is None
    driver = Driver.read("fraud")
    assert driver is not None and driver.desired == "stopped" and driver.stopped_by == "start: too few cores"


def test_a_continuous_branch_granted_its_cores_on_a_cluster_runs(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fraud = continuous_branch(home, monkeypatch)
    assert (
        stream.start(fraud, FakeTarget(home, master="spark://master:7077", cores=2), by="test").status.state
        == "running"
    )
    stream.stop(fraud, by="test")


def test_status_says_who_supervises_the_stream(home: Path, pipeline: Pipeline) -> None:
    """A paused DAG runs no supervision pass: status says so, against the DAG's schedule."""
    from sluice.records.run import SupervisionPass

    now = time.time()
    every5 = make_pipeline(home, "events", name="every5", supervision={"schedule": "*/5 * * * *"})
    assert supervision.supervised_by(every5, None, now) == (
        "not supervised: no supervision pass recorded (is DAG sluice_every5 paused, or not deployed?)"
    )
    recent = SupervisionPass("every5", "airflow sluice_every5 (scheduled)", now - 70, "worker-2")
    assert supervision.supervised_by(every5, recent, now) == (
        "supervised: last pass 70s ago on worker-2 (airflow sluice_every5 (scheduled)); DAG sluice_every5 runs */5 * * * *"
    )
    stale = SupervisionPass("every5", "airflow", now - 25 * 60, "worker-1")
    said = supervision.supervised_by(every5, stale, now)
    assert said.startswith("not supervised: the last supervision pass was 25 min ago on worker-1"), said
    assert said.endswith("DAG sluice_every5 runs */5 * * * *: is it paused?"), said
    manual = make_pipeline(home, "events", name="manual", supervision={"schedule": None})
    assert supervision.supervised_by(manual, None, now) == "not supervised: supervision.schedule is null"
    # A pass is recorded by each supervision, from either front end.
    supervision.supervise(pipeline, FakeTarget(home), by="sluice supervise", offsets=no_lag, start_new=False)
    last = SupervisionPass.read(pipeline.name)
    assert last is not None and last.by == "sluice supervise" and last.host == hostname()
    assert supervision.status(pipeline, no_lag).supervision.startswith("supervised: last pass 0s ago")
