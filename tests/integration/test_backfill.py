"""Backfill beside the live stream on real Kafka, Spark and tables: it re-reads only what the
stream has committed, so every record ends up in exactly one table whatever the order."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

import pytest

from jobs.stream.modes import run
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.errors import NothingToDo
from sluice.ops.backfill import plan
from sluice.records.backfill import BackfillPlan
from tests.fixtures import (
    KAFKA_KEYS,
    all_audit_totals,
    kafka_keys,
    make_pipeline,
    new_topic,
    read_without_spark,
    run_available_now,
    written_keys,
)

pytestmark = pytest.mark.integration


def backfill(spark, pipeline, bf: BackfillPlan) -> None:
    error = run(spark, pipeline, available_now=True, backfill=bf)
    assert error is None, error


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_backfill_takes_only_what_the_stream_committed(spark, broker, tmp_path, fmt, caplog) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": fmt}, source={"starting_offsets": "latest"})
    gen = EventGenerator(pipeline, seed=31)
    sent = send(broker.bootstrap, topic, synthetic(gen, 100, 0.1), keep=True).delivered  # history

    # Before the stream has committed anything, there is nothing a backfill may take.
    with pytest.raises(NothingToDo, match="stream has not committed a batch yet"):
        plan(pipeline, from_offset=0)

    run_available_now(spark, pipeline)  # starts at 'latest': the history stays behind it
    sent += send(broker.bootstrap, topic, synthetic(gen, 200, 0.1), keep=True).delivered
    run_available_now(spark, pipeline)

    # The order: the stream stops, 50 records arrive, a backfill of that time range,
    # then the stream starts. The backfill refuses them all: the stream reads them.
    time.sleep(0.01)
    stopped_at = datetime.now(UTC).isoformat()
    later = send(broker.bootstrap, topic, synthetic(gen, 50, 0.1), keep=True).delivered
    with pytest.raises(NothingToDo, match="every record in it is at or after the .* stream's last committed batch"):
        plan(pipeline, from_time=stopped_at)

    # From offset 0: the history and what the stream wrote are kept, the 50 refused.
    whole = plan(pipeline, from_offset=0)
    assert whole.records == 300 and whole.refusal() is not None and "refused 50 records" in whole.refusal()
    backfill(spark, pipeline, whole)
    # A backfill handed the unclipped range (a plan made where the checkpoint is remote) is
    # clipped by the job itself.
    unclipped = {t: {p: (0, 10**6) for p in parts} for t, parts in whole.ranges.items()}
    with caplog.at_level(logging.INFO, logger="sluice.ingest"):
        backfill(spark, pipeline, BackfillPlan("offsets-unclipped", unclipped))
    # Its run summary counts the range's 300 records, all in the tables already (Spark's own
    # count adds each of the batch's reads).
    summary = next(r.getMessage() for r in caplog.records if "run summary" in r.getMessage())
    assert json.loads(summary.split("run summary ", 1)[1])["input_rows"] == 300, summary
    present = set(written_keys(pipeline))
    assert present == {(topic, d.partition, d.offset) for d in sent}  # the 50 are the stream's

    run_available_now(spark, pipeline)
    out = kafka_keys(read_without_spark(fmt, pipeline.sink_path, KAFKA_KEYS))
    quarantined = kafka_keys(read_without_spark(fmt, pipeline.quarantine_path, KAFKA_KEYS))
    everything = {(topic, d.partition, d.offset) for d in sent + later}
    assert len(out) + len(quarantined) == len(everything) == 350  # nothing twice
    assert set(out) | set(quarantined) == everything and not set(out) & set(quarantined)
    good = {(topic, d.partition, d.offset) for d in sent + later if d.record.kind == "good"}
    assert set(out) == good
    assert all_audit_totals(pipeline) == {
        "records_in": 350,
        "records_out": len(good),
        "records_quarantined": 350 - len(good),
    }
