"""Derived specs: what loads, and every early refusal naming its field (no JVM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice import config
from sluice.records.checkpoint import batch_watermark_ms, parse_offsets
from sluice.spec import SpecError, load_pipeline
from sluice.spec.compatibility import expected
from sluice.spec.derived import ddl_names, incompatible_message, late_end_sql, signature_changes


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    raw = {
        "name": "raw",
        "source": {"topics": ["gh"]},
        "schema": str(config.PROJECT_ROOT / "schemas" / "github_event" / "v1.json"),
        "event_time": {"field": "created_at"},
        "sink": {"path": "tables/raw"},
        "checkpoint": "checkpoints/raw",
    }
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(raw))
    parquet = raw | {"name": "rawp", "sink": {"path": "tables/rawp", "format": "parquet"}, "checkpoint": "cp/rawp"}
    (tmp_path / "rawp.yaml").write_text(yaml.safe_dump(parquet))
    return tmp_path


def derived(folder: Path, **fields: Any) -> Path:
    spec = {
        "name": "d",
        "source": {"table": "raw"},
        "sink": {"path": "tables/d"},
        "checkpoint": "checkpoints/d",
        "watermark": "10 minutes",
    } | fields
    spec = {k: v for k, v in spec.items() if v is not None}
    path = folder / "d.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def refused(path: Path) -> str:
    with pytest.raises(SpecError) as err:
        load_pipeline(path)
    return str(err.value)


WINDOW = {"size": "10 minutes"}
COUNT = {"n": "count(*)"}


def test_window_pipeline_loads_with_its_output_columns(folder: Path) -> None:
    p = load_pipeline(
        derived(folder, window=WINDOW, group_by=["repo_name"], aggregate=COUNT | {"c": "sum(payload_size)"})
    )
    assert p.derived and p.upstream is not None and p.upstream.name == "raw"
    out, quarantine = expected(p)
    assert list(out.columns) == ["window_start", "window_end", "repo_name", "n", "c", "date"]
    assert out.columns["repo_name"] == "string" and out.partition_by == ["date"]
    assert "reason" in quarantine.columns
    assert p.derivation.time == "_event_time" and p.derivation.stateful


def test_session_state_and_dedup_outputs(folder: Path) -> None:
    p = load_pipeline(derived(folder, state={"kind": "session", "keys": ["actor_login"], "timeout": "10 minutes"}))
    assert list(expected(p)[0].columns) == ["actor_login", "session_start", "session_end", "events", "date"]
    q = load_pipeline(derived(folder, deduplicate={"keys": ["id"], "within": "10 minutes"}, watermark=None))
    assert q.derivation.watermark == "10 minutes"
    assert "_kafka_offset" in expected(q)[0].columns  # deduplicated rows keep the upstream's columns


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"window": WINDOW, "aggregate": COUNT, "watermark": None}, "window", "needs a watermark"),
        ({"deduplicate": {"keys": ["id"]}, "watermark": None}, "deduplicate.within", "needs a watermark"),
        ({"window": WINDOW, "aggregate": {"r": "sum(rand())"}}, "aggregate.r", "not deterministic"),
        ({"window": WINDOW, "aggregate": {"f": "first(repo_name)"}}, "aggregate.f", "not deterministic"),
        ({"window": WINDOW, "aggregate": {"u": "count(DISTINCT repo_name)"}}, "aggregate.u", "approx_count_distinct"),
        ({"window": WINDOW, "aggregate": {"x": "repo_name"}}, "aggregate.x", "aggregates nothing"),
        ({"window": WINDOW, "aggregate": {"x": "max(nope)"}}, "aggregate.x", "no column 'nope'"),
        ({"window": WINDOW}, "aggregate", "at least one aggregate"),
        ({"aggregate": COUNT}, "aggregate", "declare 'window'"),
        ({"window": WINDOW, "aggregate": COUNT, "group_by": ["nope"]}, "group_by[0]", "no column 'nope'"),
        (
            {"window": {"type": "session", "gap": "30 minutes"}, "aggregate": COUNT},
            "window.gap",
            "larger than the watermark",
        ),
        (
            {"state": {"kind": "session", "keys": ["actor_login"], "timeout": "1 hour"}},
            "state.timeout",
            "larger than the watermark",
        ),
        ({"state": {"kind": "session", "keys": ["actor_login"]}}, "state.timeout", "without a timeout"),
        ({"state": {"kind": "custom", "keys": ["actor_login"], "timeout": "5 minutes"}}, "state", "processor"),
        ({"deduplicate": {"keys": ["id"], "within": "5 minutes"}}, "deduplicate.within", "must equal watermark"),
        (
            {"window": WINDOW, "aggregate": COUNT, "output_mode": "update", "sink": {"path": "t", "format": "parquet"}},
            "output_mode",
            "can only append",
        ),
        ({"deduplicate": {"keys": ["id"]}, "output_mode": "update"}, "output_mode", "windowed aggregates"),
        (
            {"window": {"type": "sliding", "size": "5 minutes", "slide": "10 minutes"}, "aggregate": COUNT},
            "window",
            "slide",
        ),
        ({"filter": "nope = 1"}, "filter", "no column 'nope'"),
        ({"window": {"size": "5 minutes", "time": "created_at"}, "aggregate": COUNT}, "window.time", "not a timestamp"),
        ({"source": {"table": "missing"}}, "source.table", "no pipeline 'missing'"),
        ({"source": {"table": "d"}}, "source.table", "derive from themselves"),
        ({"schema": "github_event/v1.json"}, "schema", "reads its upstream table's columns"),
    ],
)
def test_refusals_name_the_field(folder: Path, fields: dict[str, Any], field: str, words: str) -> None:
    message = refused(derived(folder, **fields))
    assert f"d.yaml: {field}: " in message or f": {field}" in message, message
    assert words in message, message


def test_event_time_work_straight_from_kafka(folder: Path) -> None:
    spec = yaml.safe_load((folder / "raw.yaml").read_text())
    (folder / "raw.yaml").write_text(
        yaml.safe_dump(spec | {"window": WINDOW, "aggregate": COUNT, "watermark": "5 minutes"})
    )
    p = load_pipeline(folder / "raw.yaml")
    assert p.derived and p.upstream is None
    assert list(expected(p)[0].columns) == ["window_start", "window_end", "n", "date"]
    exploding = spec | {
        "deduplicate": {"keys": ["id"]},
        "watermark": "5 minutes",
        "flatten": {"explode": ["payload.commits"]},
    }
    (folder / "raw.yaml").write_text(yaml.safe_dump(exploding))
    assert "raw.yaml: flatten.explode: " in refused(folder / "raw.yaml")


def test_continuous_mode_refuses_windows_and_state(folder: Path) -> None:
    spec = yaml.safe_load((folder / "raw.yaml").read_text()) | {"mode": "continuous", "window": WINDOW}
    (folder / "raw.yaml").write_text(yaml.safe_dump(spec))
    assert "continuous processing does not support event-time windows" in refused(folder / "raw.yaml")


def test_late_rule_per_operator() -> None:
    from sluice.spec.derived import Window

    assert late_end_sql("t", None) == "`t`"
    tumbling = late_end_sql("t", Window(size="10 minutes"))
    assert "600000" in tumbling and "floor" in tumbling
    sliding = late_end_sql("t", Window(type="sliding", size="10 minutes", slide="5 minutes"))
    assert "/ 300000) * 300000 + 600000" in sliding
    assert "INTERVAL 1800000 MILLISECONDS" in late_end_sql("t", Window(type="session", gap="30 minutes"))


def test_late_rule_follows_deduplication_first(folder: Path) -> None:
    p = load_pipeline(derived(folder, deduplicate={"keys": ["id"]}, window=WINDOW, aggregate=COUNT))
    assert p.derivation.late_window is None
    q = load_pipeline(derived(folder, window=WINDOW, aggregate=COUNT))
    assert q.derivation.late_window is not None


def test_state_signature_changes_are_named(folder: Path) -> None:
    before = load_pipeline(
        derived(folder, window=WINDOW, group_by=["repo_name"], aggregate=COUNT)
    ).derivation.signature()
    same = load_pipeline(
        derived(folder, window=WINDOW, group_by=["repo_name"], aggregate=COUNT, watermark="20 minutes")
    )
    assert signature_changes(before, same.derivation.signature()) == []  # a watermark may change
    keys = load_pipeline(derived(folder, window=WINDOW, group_by=["actor_login"], aggregate=COUNT))
    assert signature_changes(before, keys.derivation.signature()) == ["group_by"]
    wider = load_pipeline(derived(folder, window={"size": "1 hour"}, group_by=["repo_name"], aggregate=COUNT))
    assert signature_changes(before, wider.derivation.signature()) == ["window"]
    message = incompatible_message("d", ["group_by"], "/cp", "/t")
    assert "new checkpoint and a new sink.path" in message and "rebuild" in message


def test_parquet_upstream_and_chain(folder: Path) -> None:
    p = load_pipeline(derived(folder, source={"table": "rawp"}, deduplicate={"keys": ["id"]}))
    assert p.upstream is not None and p.upstream.spec.sink.format == "parquet"
    chain = {"name": "e", "source": {"table": "d"}, "sink": {"path": "tables/e"}, "checkpoint": "cp/e"}
    (folder / "e.yaml").write_text(yaml.safe_dump(chain))
    e = load_pipeline(folder / "e.yaml")
    assert e.upstream is not None and e.upstream.upstream is not None


def test_deriving_from_an_update_mode_table_needs_skip(folder: Path) -> None:
    derived(folder, window=WINDOW, group_by=["repo_name"], aggregate=COUNT, output_mode="update")
    chain: dict[str, Any] = {
        "name": "e",
        "source": {"table": "d"},
        "watermark": "1 hour",
        "window": {"size": "1 hour", "time": "window_end"},
        "aggregate": {"windows": "count(*)"},
        "sink": {"path": "tables/e"},
        "checkpoint": "cp/e",
    }
    (folder / "e.yaml").write_text(yaml.safe_dump(chain))
    said = refused(folder / "e.yaml")
    assert "source.on_upstream_change" in said and "d writes in output_mode update" in said
    chain["source"] = {"table": "d", "on_upstream_change": "skip"}
    (folder / "e.yaml").write_text(yaml.safe_dump(chain))
    e = load_pipeline(folder / "e.yaml")
    assert e.spec.source.on_upstream_change == "skip"  # type: ignore[union-attr]


def test_offset_log_watermark() -> None:
    text = 'v1\n{"batchWatermarkMs":1626862500000,"batchTimestampMs":1,"conf":{}}\n{"sourceVersion":1,"reservoirVersion":3}'
    assert batch_watermark_ms(text) == 1626862500000
    assert parse_offsets(text) == {}  # a table source's offsets are not Kafka's
    with pytest.raises(ValueError, match="not a Spark offset log"):
        batch_watermark_ms("garbage")


def test_ddl_names() -> None:
    assert ddl_names("user string, totals struct<a: int, b: map<string, int>>, `n` bigint") == ["user", "totals", "n"]


def test_sessions_merge_joins_out_of_order_events() -> None:
    from jobs.stream.keyed_sessions import merge

    gap = 10
    assert merge([(0, 0, 1), (25, 25, 1), (12, 12, 1)], gap) == [(0, 0, 1), (12, 12, 1), (25, 25, 1)]
    assert merge([(0, 0, 1), (25, 25, 1), (12, 12, 1), (6, 6, 1), (18, 18, 1)], gap) == [(0, 25, 5)]


def test_status_shows_the_last_batch_of_a_stateful_stream() -> None:
    from sluice.cli.stream import last_batch_rows

    progress = {
        "batch_id": 7,
        "input_rows": 50,
        "rows_per_second": 1234.5,
        "watermark": "2021-07-21T10:50:00.000Z",
        "state_rows": 42,
        "state_memory_bytes": 3 * 1_048_576,
        "late_rows": 5,
    }
    rows = dict(last_batch_rows(progress))
    assert rows["last batch"] == "7: 50 rows in, 1,234 rows/s"
    assert rows["watermark"] == "2021-07-21T10:50:00.000Z"
    assert rows["state"] == "42 rows, 3.0 MiB" and rows["late rows (last batch)"] == "5"
    assert dict(last_batch_rows({"batch_id": 1, "input_rows": 3})).keys() == {"last batch"}  # a stateless stream
    assert last_batch_rows({}) == []


def test_sluice_check_compares_a_local_checkpoints_state_once_it_has_progress(folder: Path) -> None:
    import json

    from sluice.ops.check import check
    from sluice.spec.derived import STATE_FILE

    path = derived(folder, window=WINDOW, group_by=["repo_name"], aggregate=COUNT)
    p = load_pipeline(path)
    root = Path(p.checkpoint_path)
    (root / "offsets").mkdir(parents=True)
    built = p.derivation.signature() | {"group_by": ["actor_login"]}
    (root / STATE_FILE).write_text(json.dumps(built))
    [before] = check([path])
    assert before.tables != "mismatch"  # no batch planned yet: nothing built on that state
    (root / "offsets" / "0").write_text("v1\n")
    [after] = check([path])
    assert after.tables == "mismatch" and "holds state built for a different group_by" in after.detail
