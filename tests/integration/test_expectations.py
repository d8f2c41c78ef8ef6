"""Row expectations in the stream, on a real broker, real Spark and real Delta tables.

Violations are planted in otherwise good device signals; every rule kind and every action
is exercised, and the counts must reconcile record for record.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from jobs.stream.modes import run
from jobs.stream.status import StatusReporter
from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator, Record
from sluice.dev.produce import send, synthetic
from sluice.records.run import Failures, Status
from tests.fixtures import audit_totals, make_pipeline, new_topic, read_without_spark

pytestmark = pytest.mark.integration

RULES: dict[str, dict[str, Any]] = {
    "battery_percent": {"column": "battery", "in_range": {"min": 0, "max": 100}, "action": "drop"},
    "device_id_format": {"column": "device_id", "matches": r"^dev-\d{4}$", "action": "drop"},
    "known_firmware": {"column": "device_firmware", "in_set": ["1.4.2", "1.5.0", "2.0.1"]},
    "typed": {"column": "device_type", "not_null": True, "action": "warn"},
    "weak_signal": {"sql": "signal < -35 OR battery IS NULL", "action": "warn"},
}

# How each planted violation changes a good event, and which rules it breaks.
PLANTS: dict[str, tuple[Any, set[str]]] = {
    "battery": (lambda e: e.update(battery=140), {"battery_percent"}),
    "device_id": (lambda e: e["device"].update(id="DEV_7"), {"device_id_format"}),
    "both_drops": (
        lambda e: (e.update(battery=-3), e["device"].update(id="x")),
        {"battery_percent", "device_id_format"},
    ),
    "firmware": (lambda e: e["device"].update(firmware="9.9.9"), {"known_firmware"}),
    "untyped": (lambda e: e["device"].update(type=None), {"typed"}),
}


def planted(gen: EventGenerator, n: int, rng: random.Random) -> list[tuple[Record, set[str]]]:
    """``n`` records: good ones, planted violations and unparseable ones (one in ten)."""
    out: list[tuple[Record, set[str]]] = []
    for i in range(n):
        if i % 10 == 9:
            out.append((gen.record(bad_fraction=1.0), set()))
            continue
        event = gen.good()
        # Clean values first, so only what is planted breaks a rule.
        event["battery"], event["signal"] = rng.randint(0, 100), rng.uniform(-95, -40)
        event["device"]["type"] = event["device"].get("type") or "camera"
        broken: set[str] = set()
        if i % 6 == 0:
            change, broken = PLANTS[rng.choice(sorted(PLANTS))]
            change(event)
        elif i % 25 == 1:
            event["signal"], broken = -31.0, {"weak_signal"}  # breaks only the sql rule
        out.append((Record(json.dumps(event).encode(), "good", None, event), broken))
    return out


def test_each_rule_kind_and_action_on_planted_violations(spark, broker, tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(tmp_path, topic, expectations={"rows": RULES})
    records = planted(EventGenerator(pipeline, seed=5), 600, random.Random(5))
    report = send(broker.bootstrap, topic, (r for r, _ in records), keep=True)
    where = {id(d.record): (d.partition, d.offset) for d in report.delivered}

    assert run(spark, pipeline, available_now=True) is None

    parsed = [(where[id(r)], broken) for r, broken in records if r.kind == "good"]
    drops = {"battery_percent", "device_id_format"}
    dropped = {at: sorted(b & drops) for at, b in parsed if b & drops}
    kept = {at for at, b in parsed if not b & drops}
    unparseable = {where[id(r)]: r.reason for r, _ in records if r.kind != "good"}
    assert len(dropped) > 20 and len(unparseable) == 60

    table = read_table(spark, "delta", pipeline.sink_path)
    assert {(r["_kafka_partition"], r["_kafka_offset"]) for r in table.collect()} == kept
    # Warned rows stay, as they were sent.
    assert table.filter("device_firmware = '9.9.9'").count() == sum(1 for at, b in parsed if b == {"known_firmware"})
    assert table.filter("device_type IS NULL").count() == sum(1 for at, b in parsed if b == {"typed"})

    quarantine = {
        (r["_kafka_partition"], r["_kafka_offset"]): r["reason"]
        for r in read_table(spark, "delta", pipeline.quarantine_path).collect()
    }
    assert quarantine == unparseable | {at: "expectation failed: " + ", ".join(names) for at, names in dropped.items()}

    totals = audit_totals(pipeline)  # also checks in = out + quarantined, batch by batch
    assert totals == {"records_in": 600, "records_out": len(kept), "records_quarantined": len(quarantine)}
    counted: dict[str, dict[str, int]] = {}
    for f in Path(pipeline.audit_path).glob("*.json"):
        for name, c in json.loads(f.read_text())["expectations"].items():
            slot = counted.setdefault(name, {"checked": 0, "failed": 0})
            slot["checked"] += c["checked"]
            slot["failed"] += c["failed"]
            assert c["action"] == RULES[name].get("action", "warn")
    for name in RULES:
        assert counted[name] == {"checked": len(parsed), "failed": sum(1 for _, b in parsed if name in b)}, name


def test_a_fail_rule_stops_the_query_until_the_rule_changes_then_the_batch_runs_under_it(
    spark, broker, tmp_path: Path
) -> None:
    topic = new_topic(broker, partitions=1)
    rule = {"column": "battery", "in_range": {"max": 100}}
    pipeline = make_pipeline(tmp_path, topic, expectations={"rows": {"battery_max": rule | {"action": "fail"}}})
    gen = EventGenerator(pipeline, seed=9)
    bad = gen.good() | {"battery": 180}
    records = [*synthetic(gen, 40), Record(json.dumps(bad).encode(), "good", None, bad), *synthetic(gen, 9)]
    send(broker.bootstrap, topic, records)

    reporter = StatusReporter(spark, pipeline.name)
    for attempt in (1, 2):  # a restart meets the same batch and stops again
        error = run(spark, pipeline, available_now=True, reporter=reporter)
        assert error is not None, attempt
        # What status, the CLI and the task log show: the cause's one line, not py4j's traceback.
        status, failures = Status.read(pipeline.name), Failures.read(pipeline.name)
        assert status is not None and status.state == "failed" and status.error is not None
        assert status.error.startswith(f"{pipeline.name}: expectation 'battery_max' (battery <= 100.0) failed ")
        assert "\n" not in status.error and "Traceback" not in status.error and "Python Proxy" not in status.error
        assert "for 1 of 50 records in batch 0" in status.error and f"{topic}[0] offset 40" in status.error
        assert '"battery": 180' in status.error and "set the rule's action to drop" in status.error
        assert failures is not None and (failures.batch, failures.count, failures.cause) == (0, attempt, status.error)
    assert not Path(pipeline.audit_path).exists() or not any(Path(pipeline.audit_path).iterdir())
    assert not (Path(pipeline.sink_path) / "_delta_log").exists()

    # The way out the message names: the rule drops instead. Batch 0 was planned under the
    # failing rule but wrote nothing, so it runs under the new one.
    dropping = make_pipeline(
        tmp_path,
        topic,
        name=pipeline.name,
        checkpoint=pipeline.checkpoint_path,
        expectations={"rows": {"battery_max": rule | {"action": "drop"}}},
    )
    assert run(spark, dropping, available_now=True) is None
    out = read_without_spark("delta", dropping.sink_path, ["_kafka_offset"]).to_pylist()
    quarantined = read_without_spark("delta", dropping.quarantine_path, ["_kafka_offset", "reason"]).to_pylist()
    assert sorted(r["_kafka_offset"] for r in out) == [o for o in range(50) if o != 40]
    assert quarantined == [{"_kafka_offset": 40, "reason": "expectation failed: battery_max"}]
    assert audit_totals(dropping) == {"records_in": 50, "records_out": 49, "records_quarantined": 1}
