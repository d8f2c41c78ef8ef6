"""Continuous mode is at least once: Airflow starts the branch, the driver is SIGKILLed while
events stream in, scheduled supervision restarts it, and every payment that should be flagged
is flagged at least once. Duplicates (records after the last checkpoint epoch, read again)
are counted and reported, not hidden."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import stream
from sluice.records.run import Driver
from tests.fixtures import make_pipeline, new_topic, read_verdicts

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def test_killed_continuous_branch_flags_everything_at_least_once(airflow, broker, tmp_path, request) -> None:
    topic = new_topic(broker, partitions=2, prefix="pay")
    pipeline = make_pipeline(
        airflow.pipelines,
        topic,
        name="fraud_chaos",
        schema="payment/v1.json",
        mode="continuous",
        event_time={"field": "created_at", "format": "iso8601"},
        sink={"format": "kafka", "topic": f"{topic}-verdicts", "path": None},
        continuous={"checkpoint_interval": "1 second", "rules": {"large_amount": "amount > 1500"}},
        supervision={"schedule": None, "max_stall": "2 minutes"},
    )
    resident = airflow.resident(request)  # both commands in one Airflow interpreter
    run = resident.dags_test("sluice_fraud_chaos", {"action": "start"})
    assert run.state == "success", run.log[-4000:]
    first = Driver.read("fraud_chaos")

    gen = EventGenerator(pipeline, seed=21)
    delivered = []
    sender = threading.Thread(
        target=lambda: delivered.extend(
            send(broker.bootstrap, topic, synthetic(gen, 600), rate=150, keep=True).delivered
        )
    )
    sender.start()
    time.sleep(2.5)  # mid-stream: records in flight, some after the last epoch
    os.killpg(first.pid, signal.SIGKILL)
    sender.join()

    run = resident.dags_test("sluice_fraud_chaos")  # scheduled supervision: the driver is gone
    assert run.state == "success", run.log[-4000:]
    assert "restarting it from its checkpoint" in run.log

    should = {
        (d.partition, d.offset)
        for d in delivered
        if d.record.event is not None
        and d.record.event.get("amount") is not None
        and float(d.record.event["amount"]) > 1500
    }
    assert should, "the generator produced no large payments"
    verdicts = read_verdicts(broker.bootstrap, pipeline.spec.sink.topic, len(should), timeout=120)
    print(stream.stop(pipeline, by="test"))

    flagged = [(v["source"]["partition"], v["source"]["offset"]) for v in verdicts]
    assert should <= set(flagged), f"missing verdicts: {sorted(should - set(flagged))[:10]}"
    assert set(flagged) <= should  # nothing flagged that should not be
    duplicates = len(flagged) - len(set(flagged))
    print(
        f"\ncontinuous at-least-once: {len(should)} payments to flag, {len(flagged)} verdicts, {duplicates} duplicates"
    )
