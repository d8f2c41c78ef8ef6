"""``sluice preview`` against a real broker and Spark: what it shows is what the stream writes.

The sample's rows are compared with the rows the stream then writes for the same records,
its quarantine reasons with the generator's, and a real sample file with a plain-Python
model of its rescued fields; the preview itself must leave no table, checkpoint or
committed offset behind.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from jobs.preview import TOP_RESCUED, rows_as_json
from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops.preview import preview
from sluice.spec import load_pipeline, rescue
from sluice.spec.expectations import DROPPED
from sluice.topics import sample_plan, watermarks
from tests.conftest import ROOT, require_real_data
from tests.fixtures import make_pipeline, new_topic, run_available_now
from tests.rescue_model import undeclared

pytestmark = pytest.mark.integration

RULES = {
    "battery_percent": {"column": "battery", "in_range": {"min": 5, "max": 95}, "action": "drop"},
    "typed": {"column": "device_type", "not_null": True},
}
COORDINATES = ("_kafka_topic", "_kafka_partition", "_kafka_offset")


def test_the_preview_shows_what_the_stream_then_writes_and_writes_nothing(spark, broker, tmp_path: Path) -> None:
    rng = random.Random(27)
    topic = new_topic(broker, partitions=3)
    pipeline = make_pipeline(tmp_path, topic, expectations={"rows": RULES})
    sent = send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=27), 300, 0.2), keep=True)
    n = rng.randint(30, 120)

    shown = preview(pipeline, n)

    # The newest records, spread over the partitions, and nothing left behind.
    plan = sample_plan({(topic, p): w for p, w in watermarks(broker.bootstrap, topic).items()}, n)
    wanted = {(topic, p, o) for (_, p), (start, end) in plan.items() for o in range(start, end)}
    seen = {tuple(r[c] for c in COORDINATES) for r in shown.rows} | {
        tuple(r[c] for c in COORDINATES) for r in shown.quarantined
    }
    assert shown.records_in == n == len(wanted) and seen == wanted
    assert shown.records_out + len(shown.quarantined) == n
    assert not Path(pipeline.sink_path).exists() and not Path(pipeline.checkpoint_path).exists()
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "sluice-preview"})
    try:
        committed = group.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        group.close()
    assert all(tp.offset < 0 for tp in committed), "the preview committed an offset"

    # Each quarantined record with the reason the generator planted, or the drop rule's.
    records = {(topic, d.partition, d.offset): d.record for d in sent.delivered}
    expected = {}
    for key in wanted:
        record = records[key]
        if record.reason is not None:
            expected[key] = record.reason
        else:
            battery = (record.event or {}).get("battery")
            if battery is not None and not 5 <= battery <= 95:
                expected[key] = DROPPED + "battery_percent"
    assert {tuple(r[c] for c in COORDINATES): r["reason"] for r in shown.quarantined} == expected
    rules = {r.name: (r.action, r.checked, r.failed) for r in shown.rules}
    parsed = sum(1 for key in wanted if records[key].reason is None)
    dropped = sum(1 for reason in expected.values() if reason.startswith(DROPPED))
    assert rules["battery_percent"] == ("drop", parsed, dropped)
    assert rules["typed"][:2] == ("warn", parsed)

    # The stream writes those records as the preview showed them, value for value.
    run_available_now(spark, pipeline)
    table = read_table(spark, "delta", pipeline.sink_path)
    written = {
        tuple(r[c] for c in COORDINATES): r for r in rows_as_json(table) if tuple(r[c] for c in COORDINATES) in seen
    }
    assert len(written) == len(shown.rows) > 0
    for row in shown.rows:
        stored = written[tuple(row[c] for c in COORDINATES)]
        assert {k: v for k, v in row.items() if k != "_ingested_at"} == {
            k: stored[k] for k in row if k != "_ingested_at"
        }


def test_a_real_sample_file_with_its_exploded_rows_and_rescued_fields() -> None:
    path = require_real_data("github-events-2021-07-21.ndjson")
    pipeline = load_pipeline(ROOT / "pipelines" / "github_events.yaml")
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    shown = preview(pipeline, 1000, path)

    assert shown.records_in == len(events) == 800 and not shown.quarantined
    assert len(shown.rows) == sum(max(1, len(e["payload"].get("commits") or [])) for e in events)
    assert {r["_kafka_offset"] for r in shown.rows} == set(range(1, 801))  # line numbers
    paths: Counter[str] = Counter()
    for event in events:
        paths.update(re.sub(rescue.INDEX, "[]", p) for p in undeclared(pipeline.schema, event))
    # The most common first, ties by path, as many as a preview lists.
    assert shown.rescued == dict(sorted(paths.items(), key=lambda pc: (-pc[1], pc[0]))[:TOP_RESCUED])
    assert shown.rescued["actor.gravatar_id"] == 800
