"""A graceful stop with a backlog: it takes effect after the batch in progress commits, not
when the backlog happens to run dry (before, 40 more batches committed and the CLI killed
the process group after 120 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import drivers, processes, stream
from sluice.ops.submit import ingest_submission
from sluice.records.run import Status
from sluice.runtime import submit_env
from tests.fixtures import KAFKA_KEYS, kafka_keys, make_pipeline, new_topic, read_without_spark

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def batches_done(pipeline) -> int:
    folder = Path(pipeline.audit_path)
    return len(list(folder.glob("*.json"))) if folder.exists() else 0


def test_stop_with_a_backlog_ends_after_the_batch_in_progress(broker, tmp_path) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(
        tmp_path,
        topic,
        sink={"format": "parquet"},
        source={"max_offsets_per_trigger": 20},
        trigger={"processing_time": "100 milliseconds"},
    )
    report = send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=7), 600, 0.05), keep=True)
    sub = ingest_submission(pipeline.spec_path, pipeline_name=pipeline.name)
    driver = drivers.launch(pipeline, sub.command(), submit_env(sub.master), launched_by="test")
    drivers.wait_running(pipeline, driver)
    deadline = time.monotonic() + 240
    while batches_done(pipeline) < 3:
        assert time.monotonic() < deadline, processes.log_tail(driver.log)
        time.sleep(0.2)

    before = batches_done(pipeline)
    said = stream.stop(pipeline, by="test", timeout=120)
    after = batches_done(pipeline)
    log = Path(driver.log).read_text()
    assert "gracefully" in said, said + log[-3000:]
    assert after - before <= 2, f"{after - before} batches committed after the stop request"  # ~25 were waiting
    assert Status.read(pipeline.name).state == "stopped"
    after_stop = log[log.index("received SIGTERM") :]
    assert "stopped cleanly" in after_stop
    assert " ERROR " not in after_stop and "Traceback" not in after_stop, after_stop[:3000]

    # The batch that declined to start is read again: nothing lost, nothing twice. (Larger
    # batches to drain the backlog: a source option may change between runs of a checkpoint.)
    pipeline = make_pipeline(
        tmp_path, topic, name=pipeline.name, sink={"format": "parquet"}, source={"max_offsets_per_trigger": 1000}
    )
    sub = ingest_submission(pipeline.spec_path, pipeline_name=pipeline.name, available_now=True)
    finished = drivers.launch(pipeline, sub.command(), submit_env(sub.master), launched_by="test", desired="once")
    deadline = time.monotonic() + 600
    while drivers.driver_process(pipeline) is not None or (Status.read(pipeline.name).state != "finished"):
        assert time.monotonic() < deadline, processes.log_tail(finished.log)
        time.sleep(1)
    out = kafka_keys(read_without_spark("parquet", pipeline.sink_path, KAFKA_KEYS))
    quarantined = kafka_keys(read_without_spark("parquet", pipeline.quarantine_path, KAFKA_KEYS))
    assert len(out) + len(quarantined) == len(set(out) | set(quarantined)) == 600
    assert set(out) | set(quarantined) == {(topic, d.partition, d.offset) for d in report.delivered}
