"""A producer's schema moves on under a running pipeline: nothing it adds is lost, the spec
follows it to v2 on the same checkpoint, and a change the table cannot take is refused.

Real broker, Spark and tables; the tables are read back with delta-rs or pyarrow. The
records are drawn from a seeded schedule: fields added at every depth (top level, nested
structs, array elements), values that do not fit their type in a field marked ``rescue``
and in one that is not, and records without any of these.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from jobs.stream.micro_batch import start
from sluice.dev.generate import Record
from sluice.dev.produce import send
from sluice.ops.check import check
from sluice.records import audit
from sluice.spec import compatibility
from sluice.spec import quarantine as q
from tests.fixtures import make_pipeline, new_topic, read_without_spark, run_available_now

pytestmark = pytest.mark.integration

V1 = (
    "id STRING NOT NULL, ts BIGINT NOT NULL, "
    "customer STRUCT<id: STRING, address: STRUCT<city: STRING>>, "
    "items ARRAY<STRUCT<sku: STRING, qty: INT>>, total DOUBLE, attrs MAP<STRING, STRING>"
)
#: v2 declares the nested field the producer started sending in round 2.
V2 = V1.replace("address: STRUCT<city: STRING>>", "address: STRUCT<city: STRING>, tier: STRING>")
#: v3 narrows a type: refused. v3b makes a field required, which the table's columns cannot
#: show: the schema the checkpoint ran with refuses it.
V3 = V2.replace("total DOUBLE", "total INT")
V3B = V2.replace("customer STRUCT<id: STRING,", "customer STRUCT<id: STRING NOT NULL,")


def schemas(folder: Path) -> dict[str, Path]:
    root = folder / "schemas" / "order"
    root.mkdir(parents=True)
    out = {}
    for version, ddl in (("v1", V1), ("v2", V2), ("v3", V3), ("v3b", V3B)):
        out[version] = root / f"{version}.ddl"
        out[version].write_text(ddl)
    return out


class Producer:
    """Orders as a producer sends them, with what the pipeline must make of each."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def order(self, *, tier: bool, extras: bool) -> tuple[Record, dict[str, Any] | None]:
        """A record, and the ``_rescued`` it must get (None: quarantined)."""
        r, self.n = self.rng, self.n + 1
        event: dict[str, Any] = {
            "id": f"o-{self.n}",
            "ts": 1_760_000_000 + self.n,
            "customer": {"id": f"c-{r.randrange(50)}", "address": {"city": r.choice(["Oslo", "Lyon", "Porto"])}},
            "items": [{"sku": f"s-{r.randrange(9)}", "qty": r.randrange(1, 5)} for _ in range(r.randrange(0, 3))],
            "total": round(r.uniform(1, 500), 2),
            "attrs": {"src": r.choice(["web", "app"])},
        }
        rescued: dict[str, Any] = {}
        if tier:
            event["customer"]["tier"] = r.choice(["gold", "silver"])
            rescued["customer.tier"] = event["customer"]["tier"]
        if extras and r.random() < 0.3:
            event["channel"] = {"kind": "partner", "ids": [1, 2]}
            rescued["channel"] = event["channel"]
        if extras and r.random() < 0.1:  # a dotted name at the top is not a nested field
            event["promo.code"] = "AUTUMN"
            rescued["`promo.code`"] = "AUTUMN"
        if extras and r.random() < 0.2:
            event["customer"]["address"]["zip"] = r.randrange(1000, 9999)
            rescued["customer.address.zip"] = event["customer"]["address"]["zip"]
        if extras and event["items"] and r.random() < 0.3:
            i = r.randrange(len(event["items"]))
            event["items"][i]["discount"] = 0.5
            rescued[f"items[{i}].discount"] = 0.5
        if extras and r.random() < 0.1:  # a total as text: marked rescue, so the row stays
            event["total"] = f"{event['total']} EUR"
            rescued["total"] = event["total"]
        if extras and event["items"] and r.random() < 0.05:  # not marked: quarantined
            event["items"][0]["qty"] = "two"
            reason = q.UNFIT
            return Record(json.dumps(event).encode(), "type_mismatch", reason, event), None
        return Record(json.dumps(event).encode(), "good", None, event), rescued

    def round(self, count: int, *, tier: bool, extras: bool) -> tuple[list[Record], list[dict[str, Any] | None]]:
        pairs = [self.order(tier=tier, extras=extras) for _ in range(count)]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def produce(broker: Any, topic: str, records: list[Record], rescued: list[dict[str, Any] | None]) -> dict:
    """Send; return (partition, offset) -> expected _rescued (None: quarantined)."""
    report = send(broker.bootstrap, topic, records, keep=True)
    by_record = {id(rec): res for rec, res in zip(records, rescued, strict=True)}
    return {(d.partition, d.offset): by_record[id(d.record)] for d in report.delivered}


def rows(fmt: str, path: str) -> dict[tuple[int, int], dict[str, Any]]:
    table = read_without_spark(fmt, path).to_pylist()
    keyed = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in table}
    assert len(keyed) == len(table), "a record was written twice"
    return keyed


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_added_fields_are_rescued_then_the_spec_moves_to_v2_and_v3_is_refused(spark, broker, tmp_path, fmt) -> None:
    files = schemas(tmp_path)
    topic = new_topic(broker, partitions=2)
    spec = {
        "name": f"orders_{fmt}",
        "schema": str(files["v1"]),
        "event_time": {"field": "ts", "format": "epoch_seconds"},
        "sink": {"format": fmt},
        "on_type_mismatch": {"total": "rescue"},
    }
    v1 = make_pipeline(tmp_path, topic, **spec)
    producer = Producer(seed=16)
    expected: dict[tuple[int, int], dict[str, Any] | None] = {}

    # Round 1: the producer sends what v1 declares. Round 2: it adds customer.tier to every
    # record, mid-stream, and other fields to some.
    expected |= produce(broker, topic, *producer.round(150, tier=False, extras=False))
    run_available_now(spark, v1)
    added = produce(broker, topic, *producer.round(250, tier=True, extras=True))
    expected |= added
    run_available_now(spark, v1)

    out = rows(fmt, v1.sink_path)
    good = {k: v for k, v in expected.items() if v is not None}
    assert out.keys() == good.keys()
    for key, want in good.items():
        got = out[key]["_rescued"]
        assert (json.loads(got) if got is not None else {}) == want, key
    rescued_total = sum(1 for v in good.values() if v)
    assert rescued_total == sum(1 for v in added.values() if v is not None) > 200  # every record with a tier
    text_totals = [k for k, v in good.items() if v and "total" in v]
    assert text_totals and all(out[k]["total"] is None for k in text_totals)
    quarantined = read_without_spark(fmt, v1.quarantine_path).to_pylist()
    assert len(quarantined) == len(expected) - len(good) > 0
    # Spark reads the rest of such an array (partial results), so no field is named.
    assert {r["reason"] for r in quarantined} == {q.UNFIT}

    batches = [audit.read(f) for f in audit.audit_files([Path(v1.audit_path)])]
    assert all(b.reconciles for b in batches)
    assert sum(b.records_rescued for b in batches) == rescued_total
    assert sum(b.records_in for b in batches) == len(expected)
    paths: dict[str, int] = {}
    for b in batches:
        for p, n in b.rescued_paths.items():
            paths[p] = paths.get(p, 0) + n
    assert paths["customer.tier"] == rescued_total
    warned = audit.rescued(v1)
    assert warned is not None and next(iter(warned.paths)) == "customer.tier" and warned.records == rescued_total
    assert paths["items[].discount"] == sum(1 for v in good.values() if v and any(p.startswith("items[") for p in v))

    # v2 declares customer.tier: `sluice check` finds it compatible, and the same
    # checkpoint carries on; the table gains the column.
    v2 = make_pipeline(tmp_path, topic, **(spec | {"schema": str(files["v2"])}))
    [checked] = check([v2.spec_path])
    assert checked.tables == "match", checked.detail
    before = set(out)
    expected |= produce(broker, topic, *producer.round(200, tier=True, extras=False))
    run_available_now(spark, v2)
    out = rows(fmt, v2.sink_path)
    good = {k: v for k, v in expected.items() if v is not None}
    assert out.keys() == good.keys(), "a record was lost or repeated across the change"
    for key, row in out.items():
        if key in before:
            assert row["customer_tier"] is None  # written under v1: its tier is in _rescued
            continue
        assert row["customer_tier"] in ("gold", "silver")
        assert row["_rescued"] is None
    assert sum(b.records_in for b in map(audit.read, audit.audit_files([Path(v2.audit_path)]))) == len(expected)

    # v3 narrows total: refused by `sluice check` and by the job, naming the field and the rule.
    v3 = make_pipeline(tmp_path, topic, **(spec | {"schema": str(files["v3"])}))
    [checked] = check([v3.spec_path])
    assert checked.tables == "mismatch"
    assert "total: double -> int: narrowing or changing a type is not compatible" in checked.detail
    assert "set a new sink.path and checkpoint" in checked.detail
    with pytest.raises(compatibility.IncompatibleTable, match="column total"):
        start(spark, v3, available_now=True)
    v3b = make_pipeline(tmp_path, topic, **(spec | {"schema": str(files["v3b"])}))
    [checked] = check([v3b.spec_path])
    assert checked.tables == "mismatch"
    assert "customer.id: nullable -> required: making a field required is not compatible" in checked.detail
    with pytest.raises(compatibility.IncompatibleTable, match="customer.id: nullable -> required"):
        start(spark, v3b, available_now=True)


def test_a_registry_subject_evolves_and_an_outage_does_not_stop_a_restart(spark, broker, tmp_path, monkeypatch) -> None:
    """Against a local stand-in for the registry's REST API (tests/registry_standin.py)."""
    from tests.registry_standin import RegistryStandIn

    monkeypatch.setenv("SLUICE_REGISTRY_TTL", "0.0")  # ask the registry at every load
    standin = RegistryStandIn()
    order = {
        "type": "object",
        "required": ["id", "ts"],
        "properties": {
            "id": {"type": "string"},
            "ts": {"type": "integer"},
            "customer": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
    standin.register("orders-value", order)
    topic = new_topic(broker, partitions=2)
    spec = {
        "name": "orders_registry",
        "schema": {"registry": standin.url, "subject": "orders-value", "version": "latest"},
        "event_time": {"field": "ts", "format": "epoch_seconds"},
    }
    v1 = make_pipeline(tmp_path, topic, **spec)

    def send_orders(start: int, count: int, **extra: Any) -> None:
        events = [
            {"id": f"o-{i}", "ts": 1_760_000_000 + i, "customer": {"id": "c"}, **extra}
            for i in range(start, start + count)
        ]
        send(broker.bootstrap, topic, [Record(json.dumps(e).encode(), "good", None, e) for e in events])

    send_orders(0, 60, channel="web")
    run_available_now(spark, v1)
    first = rows("delta", v1.sink_path)
    assert len(first) == 60 and all(json.loads(r["_rescued"]) == {"channel": "web"} for r in first.values())

    # The producer's team registers v2 with the field; a restart picks it up.
    standin.register("orders-value", order | {"properties": order["properties"] | {"channel": {"type": "string"}}})
    v2 = make_pipeline(tmp_path, topic, **spec)
    assert v2.schema_file.name == "v2.json"
    send_orders(60, 40, channel="app")
    run_available_now(spark, v2)

    # The registry goes down; the next restart works from the cached v2.
    standin.stop()
    during = make_pipeline(tmp_path, topic, **spec)
    assert during.schema_file.name == "v2.json"
    send_orders(100, 30, channel="pos")
    run_available_now(spark, during)

    out = rows("delta", v1.sink_path)
    assert sorted(r["id"] for r in out.values()) == sorted(f"o-{i}" for i in range(130))
    later = [r for r in out.values() if int(r["id"][2:]) >= 60]
    assert all(r["channel"] in ("app", "pos") and r["_rescued"] is None for r in later)
    assert all(r["channel"] is None for r in out.values() if int(r["id"][2:]) < 60)
