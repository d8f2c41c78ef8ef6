"""The rules of schema evolution and of rescued data, without Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice import config
from sluice.records.audit import BatchAudit, file_name, rescued
from sluice.spec import SpecError, load_pipeline
from sluice.spec import evolution as ev
from sluice.spec.quarantine import fits_but_for_sql
from sluice.spec.rescue import normalize, rescued_sql
from sluice.spec.schema import parse_ddl

V1 = "id STRING NOT NULL, n INT, f FLOAT, d DECIMAL(10,2), s STRUCT<a: STRING, b: ARRAY<STRUCT<x: INT>>>"


def changes(new: str, old: str = V1) -> list[str]:
    return [c.describe() for c in ev.compare(parse_ddl(old), parse_ddl(new))]


def test_adding_nullable_fields_at_any_depth_is_compatible() -> None:
    new = V1.replace("x: INT", "x: INT, y: STRING").replace("a: STRING", "a: STRING, tier: STRING") + ", z BIGINT"
    assert changes(new) == [
        "s.tier: added (string): " + ev.ADDED,
        "s.b[].y: added (string): " + ev.ADDED,
        "z: added (bigint): " + ev.ADDED,
    ]
    assert ev.incompatible(ev.compare(parse_ddl(V1), parse_ddl(new))) == []


@pytest.mark.parametrize(
    ("old", "new", "compatible"),
    [
        ("n INT", "n BIGINT", True),
        ("n TINYINT", "n SMALLINT", True),
        ("f FLOAT", "f DOUBLE", True),
        ("d DECIMAL(10,2)", "d DECIMAL(12,2)", True),
        ("d DECIMAL(10,2)", "d DECIMAL(12,4)", True),
        ("d DECIMAL(10,2)", "d DECIMAL(11,4)", False),  # precision must grow at least as much as scale
        ("t DATE", "t TIMESTAMP_NTZ", True),
        ("n BIGINT", "n INT", False),
        ("n INT", "n DOUBLE", False),  # Delta needs a manual ALTER for integer -> double
        ("n INT", "n STRING", False),
        ("f DOUBLE", "f FLOAT", False),
        ("s STRUCT<a: INT>", "s STRING", False),
    ],
)
def test_types_may_widen_but_not_narrow_or_change(old: str, new: str, compatible: bool) -> None:
    [change] = ev.compare(parse_ddl(old), parse_ddl(new))
    assert change.compatible is compatible
    assert change.rule == (ev.WIDENED if compatible else ev.CHANGED)


def test_removing_requiring_and_relaxing_fields() -> None:
    assert changes("id STRING NOT NULL, n INT NOT NULL, f FLOAT, d DECIMAL(10,2), s STRUCT<a: STRING>") == [
        "n: nullable -> required: " + ev.REQUIRED,
        "s.b: removed (was array<struct<x:int>>): " + ev.REMOVED,
    ]
    assert changes(V1.replace("id STRING NOT NULL", "id STRING")) == ["id: required -> nullable: " + ev.RELAXED]
    assert changes(V1 + ", k STRING NOT NULL") == ["k: added (string): " + ev.ADDED_REQUIRED]
    # Names are compared exactly, as Spark's JSON reader does.
    assert [c.kind for c in ev.compare(parse_ddl("id STRING"), parse_ddl("ID STRING"))] == ["added", "removed"]


def test_rescued_paths_are_counted_without_their_indexes() -> None:
    assert normalize("items[3].discount") == "items[].discount"
    assert normalize("tags[red].x[0]") == "tags[].x[]"
    assert normalize("customer.tier") == "customer.tier"


def test_the_rescue_expressions_look_into_every_struct_and_read_rescued_fields_as_text() -> None:
    schema = parse_ddl(V1 + ", m MAP<STRING, STRUCT<q: INT>>")
    sql = rescued_sql(schema, ["n"])
    for step in ("'s'", "'b'", "'[', i", "e1.key", "map('n'"):
        assert step in sql, step
    relaxed = fits_but_for_sql(schema, ["n", "s.a"], "__json", "__corrupt")
    assert "`n`: string" in relaxed and "`a`: string" in relaxed and "`f`: float" in relaxed


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))

    def write(**fields: Any) -> Path:
        data = {
            "name": "signals",
            "source": {"topics": ["t"]},
            "schema": str(config.PROJECT_ROOT / "schemas" / "device_signal" / "v1.json"),
            "event_time": {"field": "timestamp", "format": "epoch_seconds"},
            "sink": {"path": "tables/signals"},
            "checkpoint": "checkpoints/signals",
        } | fields
        path = tmp_path / "signals.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def test_rescue_is_declared_per_field(spec) -> None:
    p = load_pipeline(
        spec(on_type_mismatch={"battery": "rescue", "device.location.lat": "rescue", "tags": "quarantine"})
    )
    assert p.rescue_fields == ["battery", "device.location.lat"]
    assert load_pipeline(spec()).rescue_fields == []


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"on_type_mismatch": {"nope": "rescue"}}, "on_type_mismatch.nope: no field 'nope'"),
        ({"on_type_mismatch": {"signal": "rescue"}}, "'signal' is required"),
        ({"on_type_mismatch": {"battery": "keep"}}, "on_type_mismatch.battery"),
        ({"on_type_mismatch": {"timestamp": "rescue"}}, "the event time cannot be rescued"),
        ({"on_type_mismatch": {"device.location": "rescue"}}, "only a field of a simple type can be rescued"),
        ({"on_type_mismatch": {"tags": "rescue"}}, "'tags' has type array<string>: only a field of a simple type"),
    ],
)
def test_rescue_refusals_name_the_field(spec, fields: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as err:
        load_pipeline(spec(**fields))
    assert words in str(err.value)


def test_recent_rescues_are_summed_for_status_and_the_quality_dag(spec, tmp_path: Path) -> None:
    p = load_pipeline(spec())
    assert rescued(p) is None
    folder = Path(p.audit_path)
    folder.mkdir(parents=True)
    for batch, (n, paths) in enumerate([(0, {}), (3, {"a.b": 3, "c[]": 1}), (2, {"a.b": 2})]):
        audit = BatchAudit("signals", batch, n, n, 0, n, records_rescued=n, rescued_paths=paths)
        (folder / file_name(batch)).write_text(audit.to_json())
    found = rescued(p)
    assert found is not None and (found.batches, found.records, found.paths) == (3, 5, {"a.b": 5, "c[]": 1})
    assert "5 records of the last 3 batches" in found.warning("signals") and "a.b (5), c[] (1)" in found.warning(
        "signals"
    )


def test_the_checkpoint_schema_refuses_what_the_table_cannot_show(spec) -> None:
    from sluice.spec.compatibility import schema_problems
    from sluice.spec.schema import load_schema

    p = load_pipeline(spec())
    assert schema_problems(p, p.schema.to_spark_json()) is None
    assert schema_problems(p, "not a schema") is None  # not ours to judge; the table check still runs
    required = load_schema(p.schema_file)
    relaxed = json.loads(required.to_spark_json())
    relaxed["fields"][0]["nullable"] = True  # the checkpoint ran with timestamp nullable
    problem = schema_problems(p, json.dumps(relaxed))
    assert problem is not None and "timestamp: nullable -> required: " + ev.REQUIRED in problem
    assert "Nothing was written." in problem and "sluice backfill" in problem
