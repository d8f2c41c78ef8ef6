"""``sluice schema``: diff, check-compat and suggest, on files and a real local table (no JVM)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from sluice.cli import app
from sluice.ops import schema as schemas
from sluice.spec import load_pipeline
from sluice.spec.schema import Array, Atomic, Field, Struct, parse_ddl

V1 = "id STRING NOT NULL, ts BIGINT NOT NULL, customer STRUCT<id: STRING>, items ARRAY<STRUCT<sku: STRING>>, total DOUBLE"


def test_types_are_inferred_and_merged_from_the_values_seen() -> None:
    assert schemas.infer(3) == Atomic("long") and schemas.infer(True) == Atomic("boolean")
    assert schemas.merge(schemas.infer(3), schemas.infer(2.5)) == Atomic("double")
    assert schemas.merge(schemas.infer(3), schemas.infer("x")) == Atomic("string")
    assert schemas.infer([1, 2.0]) == Array(Atomic("double"))
    assert schemas.merge(schemas.infer({"a": 1}), schemas.infer({"b": "x"})) == Struct(
        (Field("a", Atomic("long")), Field("b", Atomic("string")))
    )
    assert schemas.merge(None, schemas.infer(None)) is None


def test_the_draft_adds_rescued_paths_where_they_belong() -> None:
    current = parse_ddl(V1)
    rows = [
        {"customer.tier": "gold", "items[0].discount": 1, "channel": {"kind": "partner"}},
        {"customer.tier": None, "items[2].discount": 0.5, "total": "12 EUR"},
        {"nowhere[1].x": 1},
    ]
    draft, records, mismatched, unplaced = schemas.draft(current, rows)
    assert records == 3
    assert draft.find("customer.tier") == Field("tier", Atomic("string"))
    items = draft.find("items")
    assert items is not None and isinstance(items.type, Array) and isinstance(items.type.element, Struct)
    assert items.type.element.field("discount").type == Atomic("double")
    assert draft.find("channel.kind") == Field("kind", Atomic("string"))
    assert mismatched == {"total": ["string"]}  # declared: a decision for a person, not added
    assert unplaced == {"nowhere[].x": 1}
    assert draft.field("id").required  # the rest is as it was


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schemas" / "order").mkdir(parents=True)
    (tmp_path / "schemas" / "order" / "v1.ddl").write_text(V1)
    return tmp_path


def spec(home: Path, fmt: str) -> Path:
    data = {
        "name": "orders",
        "source": {"topics": ["orders"]},
        "schema": str(home / "schemas" / "order" / "v1.ddl"),
        "event_time": {"field": "ts", "format": "epoch_seconds"},
        "sink": {"path": "tables/orders", "format": fmt},
        "checkpoint": "checkpoints/orders",
    }
    path = home / "orders.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_suggest_reads_the_rescued_column_of_a_delta_table_and_writes_v2(home: Path) -> None:
    from deltalake import write_deltalake

    p = load_pipeline(spec(home, "delta"))
    rescued = [json.dumps({"customer.tier": "gold"}), None, json.dumps({"customer.tier": "silver", "n": 2})]
    write_deltalake(p.sink_path, pa.table({"id": ["a", "b", "c"], "_rescued": rescued}))

    s = schemas.suggest(p)
    assert s.records == 2 and s.target == home / "schemas" / "order" / "v2.json"
    assert [c.describe() for c in s.changes] == [
        "customer.tier: added (string): adding a nullable field is compatible",
        "n: added (bigint): adding a nullable field is compatible",
    ]
    runner = CliRunner()
    done = runner.invoke(app, ["schema", "suggest", str(p.spec_path), "--write"])
    assert done.exit_code == 0, done.output
    v2 = schemas.read("order/v2")[1]
    assert v2.find("customer.tier") is not None and v2.find("n") is not None
    same = runner.invoke(app, ["schema", "check-compat", "order/v1", "order/v2", "--json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["compatible"] is True

    (home / "schemas" / "order" / "v3.ddl").write_text(V1.replace("total DOUBLE", "total INT"))
    refused = runner.invoke(app, ["schema", "check-compat", "order/v2", "order/v3"])
    assert refused.exit_code == 1
    assert "total: double -> int: narrowing or changing a type is not compatible" in refused.output
    assert "customer.tier" in runner.invoke(app, ["schema", "diff", "order/v3", "order/v2"]).output


def test_suggest_on_a_parquet_table_reads_only_the_files_its_log_lists(home: Path) -> None:
    import pyarrow.parquet as pq

    from sluice.records import parquet_log

    p = load_pipeline(spec(home, "parquet"))
    table = Path(p.sink_path)
    (table / "date=2026-11-22").mkdir(parents=True)
    listed = table / "date=2026-11-22" / "a.parquet"
    pq.write_table(pa.table({"id": ["a"], "_rescued": [json.dumps({"customer.tier": "gold"})]}), listed)
    pq.write_table(
        pa.table({"id": ["b"], "_rescued": [json.dumps({"ghost": 1})]}), table / "date=2026-11-22" / "b.parquet"
    )
    (table / parquet_log.LOG_DIR).mkdir()
    entry = parquet_log.Entry(listed.as_uri(), listed.stat().st_size, 0, "add", 1, 1)
    (table / parquet_log.LOG_DIR / parquet_log.file_name(0)).write_text(parquet_log.render([entry]))

    s = schemas.suggest(p)
    assert s.records == 1 and [c.path for c in s.changes] == ["customer.tier"]


def test_a_schema_is_named_by_path_or_by_name_and_version(home: Path) -> None:
    assert schemas.resolve("order/v1").resolve() == home / "schemas" / "order" / "v1.ddl"
    assert schemas.resolve("device_signal/v1").name == "v1.json"  # the project's own
    with pytest.raises(Exception, match="no schema 'order/v9'"):
        schemas.resolve("order/v9")


def test_a_draft_from_the_real_github_sample_declares_everything_it_rescued() -> None:
    """The shipped schema leaves fields of every real GH Archive event undeclared; the draft
    declares them all, compatibly, and then nothing is left to rescue."""
    from sluice.ops.schema import draft
    from sluice.spec import evolution, load_pipeline
    from tests.conftest import require_real_data
    from tests.rescue_model import undeclared

    path = require_real_data("github-events-2021-07-21.ndjson")
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    current = load_pipeline("github_events").schema
    rescued = [undeclared(current, e) for e in events]
    assert sum(1 for r in rescued if r) == len(events) == 800  # actor.gravatar_id, at least

    schema, records, mismatched, unplaced = draft(current, rescued)
    assert records == 800 and mismatched == {} and unplaced == {}
    assert schema.find("actor.gravatar_id") == Field("gravatar_id", Atomic("string"))
    assert evolution.incompatible(evolution.compare(current, schema)) == []
    assert all(undeclared(schema, e) == {} for e in events)
