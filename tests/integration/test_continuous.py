"""The continuous branch on the real broker and Spark: every event gets its verdict, every bad
record its reason, and what continuous mode cannot do is refused before or as it starts."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Consumer

from jobs.stream import continuous
from jobs.stream.parse import read_kafka
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.spec.continuous import ContinuousError, explain_spark_error
from tests.fixtures import make_pipeline, new_topic

pytestmark = pytest.mark.integration

RULES = {"large_amount": "amount > 2000", "cross_border": "card_country <> merchant_country"}


def fraud_branch(folder, broker, partitions=2, **continuous_fields):
    topic = new_topic(broker, partitions=partitions, prefix="pay")
    out = f"{topic}-verdicts"
    return make_pipeline(
        folder,
        topic,
        schema="payment/v1.json",
        mode="continuous",
        event_time={"field": "created_at", "format": "iso8601"},
        sink={"format": "kafka", "topic": out, "path": None},
        continuous={"checkpoint_interval": "1 second", "rules": RULES, "key": "payment_id"} | continuous_fields,
    ), topic


def holds(event: dict) -> dict[str, bool]:
    """The rules evaluated in Python; an absent field makes a comparison NULL, i.e. not flagged."""
    amount = event.get("amount")
    card, merchant = event.get("card", {}).get("country"), event.get("merchant", {}).get("country")
    return {
        "large_amount": amount is not None and Decimal(str(amount)) > 2000,
        "cross_border": card is not None and merchant is not None and card != merchant,
    }


def consume(bootstrap: str, topics: list[str], expected: int, timeout: float = 120) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe(topics)
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
    finally:
        consumer.close()
    return got


def consume_sources(bootstrap: str, topics: list[str], expected: int, timeout: float = 120) -> set[tuple[int, int]]:
    """The input records (partition, offset) that output records came from, until ``expected``
    distinct ones came: at least once, a record may come out twice."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe(topics)
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                source = json.loads(msg.value())["source"]
                seen.add((source["partition"], source["offset"]))
    finally:
        consumer.close()
    return seen


@pytest.mark.parametrize("engine", ["continuous", "real_time"])
def test_every_event_gets_its_verdict_and_every_bad_record_its_reason(spark, broker, tmp_path, engine) -> None:
    """Half the records before a checkpoint and half after it: Real-Time Mode ends a batch
    there (every 5 seconds here) and starts the next, and no record may fall between."""
    interval = "5 seconds" if engine == "real_time" else "1 second"
    pipeline, topic = fraud_branch(tmp_path, broker, emit="all", engine=engine, checkpoint_interval=interval)
    records = list(synthetic(EventGenerator(pipeline, seed=3), 400, 0.1))
    query = continuous.start(spark, pipeline)
    try:
        report = send(broker.bootstrap, topic, records[:200], keep=True)
        time.sleep(7)
        report.delivered += send(broker.bootstrap, topic, records[200:], keep=True).delivered
        got = consume(broker.bootstrap, [pipeline.spec.sink.topic, pipeline.quarantine_topic], 400)
        assert query.isActive
        if engine == "continuous":
            assert query.lastProgress is None  # continuous processing reports no progress
        else:
            deadline = time.monotonic() + 60
            while query.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert query.lastProgress is not None, "no Real-Time Mode batch ended"
    finally:
        query.stop()
    if engine == "real_time":  # and the other way round: its checkpoint is Real-Time Mode's
        c = pipeline.spec.continuous.model_copy(update={"engine": "continuous", "checkpoint_interval": "1 second"})
        back = dataclasses.replace(pipeline, spec=pipeline.spec.model_copy(update={"continuous": c}))
        with pytest.raises(ContinuousError, match="written by Real-Time Mode, which continuous processing cannot"):
            continuous.start(spark, back)

    sent = {(d.partition, d.offset): d.record for d in report.delivered}
    seen = {}
    for msg in got:
        body = json.loads(msg.value())
        seen[(body["source"]["partition"], body["source"]["offset"])] = (msg.topic(), msg.key(), body)
    assert set(seen) == set(sent)  # one output record per input record, none lost
    for coords, record in sent.items():
        out_topic, key, body = seen[coords]
        if record.kind == "good":
            event = record.event
            fired = holds(event)
            expected = [name for name in pipeline.spec.continuous.rules if fired[name]]  # in the spec's order
            assert out_topic == pipeline.spec.sink.topic
            assert key.decode() == event["payment_id"] == body["payment_id"]
            assert body["rules"] == expected and body["flagged"] == bool(expected)
        else:
            assert out_topic == pipeline.quarantine_topic
            assert body["reason"] == record.reason


def test_only_flagged_verdicts_and_the_filter(spark, broker, tmp_path) -> None:
    pipeline, topic = fraud_branch(tmp_path, broker, filter="channel = 'online'", columns=["payment_id", "amount"])
    query = continuous.start(spark, pipeline)
    try:
        report = send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=4), 300), keep=True)
        events = [d.record.event for d in report.delivered]
        flagged = [e for e in events if e.get("channel") == "online" and any(holds(e).values())]
        consume(broker.bootstrap, [pipeline.spec.sink.topic], len(flagged), timeout=90)
        time.sleep(3)  # then read everything again: nothing beyond the flagged ones may be there
        got = consume(broker.bootstrap, [pipeline.spec.sink.topic], len(flagged) + 1, timeout=8)
    finally:
        query.stop()
    bodies = [json.loads(m.value()) for m in got]
    assert sorted(b["payment_id"] for b in bodies) == sorted(e["payment_id"] for e in flagged)
    assert all(set(b) == {"payment_id", "amount", "event_time", "source", "flagged", "rules"} for b in bodies)
    assert all(set(b["source"]) == {"topic", "partition", "offset", "timestamp"} for b in bodies)


def test_too_few_task_slots_is_refused_before_it_hangs(spark, broker, tmp_path) -> None:
    pipeline, _ = fraud_branch(tmp_path, broker, partitions=3)
    with pytest.raises(ContinuousError, match=r"3 partitions but Spark offers 2 task slots.*local\[3\]"):
        continuous.start(spark, pipeline)
    assert not spark.streams.active


def test_sparks_own_refusal_is_explained(spark, broker, tmp_path) -> None:
    pipeline, _ = fraud_branch(tmp_path, broker)
    raw = read_kafka(spark, pipeline)
    with pytest.raises(Exception) as err:  # an aggregation slipped past the spec (built by hand here)
        raw.groupBy("partition").count().writeStream.format("memory").queryName("agg").outputMode("complete").trigger(
            continuous="1 second"
        ).start()
    message = explain_spark_error(pipeline.name, str(err.value))
    assert message is not None, str(err.value)
    assert "continuous processing does not support" in message and "mode: micro_batch" in message


def test_an_engine_switched_on_a_checkpoint_is_refused_and_the_branch_goes_on_under_its_own(
    spark, broker, tmp_path
) -> None:
    """Spark 4.1's Real-Time Mode fails on a continuous-processing checkpoint (a
    NullPointerException, records waiting): the switch is refused with what to do, and the
    branch, started again under its engine, goes on from its offsets losing nothing."""
    pipeline, topic = fraud_branch(tmp_path, broker, emit="all")
    records = list(synthetic(EventGenerator(pipeline, seed=8), 200, 0.0))
    outputs = [pipeline.spec.sink.topic, pipeline.quarantine_topic]

    def under(engine: str) -> Any:
        fields = {"engine": engine, "checkpoint_interval": "5 seconds" if engine == "real_time" else "1 second"}
        c = pipeline.spec.continuous.model_copy(update=fields)
        return dataclasses.replace(pipeline, spec=pipeline.spec.model_copy(update={"continuous": c}))

    for i in range(2):
        query = continuous.start(spark, under("continuous"))
        try:
            send(broker.bootstrap, topic, records[i * 100 : (i + 1) * 100])
            got = consume_sources(broker.bootstrap, outputs, 100 * (i + 1))
            time.sleep(2)  # past a checkpoint
        finally:
            query.stop()
        assert len(got) == 100 * (i + 1), f"{len(got)} of {100 * (i + 1)} records have a verdict"
        if i == 0:
            with pytest.raises(ContinuousError, match="was written by continuous processing, which Real-Time Mode"):
                continuous.start(spark, under("real_time"))
