"""Derived pipelines on a real broker, Spark and Delta, against plain-Python expectations.

One raw pipeline lands GitHub-like events from Kafka; four derived pipelines read its
table, round by round, each an available-now run: a seeded schedule with events out of
order, behind the watermark, retried, and ids reused long after. What each wrote is read
with delta-rs and compared with :mod:`tests.eventtime_model`, computed from the same events.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.dev.generate import Record
from sluice.dev.produce import send
from sluice.records import audit
from sluice.spec import Pipeline, load_pipeline
from tests import eventtime_model as model
from tests.fixtures import make_pipeline, new_topic, read_without_spark, run_available_now

pytestmark = pytest.mark.integration

MIN = model.MINUTE
SEED = 1521


def derived_spec(folder: Path, name: str, upstream: str, **fields: Any) -> Path:
    spec = {
        "name": name,
        "source": {"table": upstream},
        "sink": {"format": "delta", "path": str(folder / "tables" / name)},
        "checkpoint": str(folder / "checkpoints" / name),
        "allow_external_paths": True,
        **fields,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def ms(value: Any) -> int:
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def utc_ms(naive: Any) -> int:
    """delta-rs gives timestamps as UTC datetimes (naive or aware)."""
    from datetime import UTC

    return int(naive.replace(tzinfo=UTC).timestamp() * 1000) if naive.tzinfo is None else ms(naive)


@pytest.fixture(scope="module")
def world(broker: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("derived")
    topic = new_topic(broker)
    raw = make_pipeline(
        folder,
        topic,
        schema="github_event/v1.json",
        name="gh_raw",
        event_time={"field": "created_at", "format": "iso8601"},
    )
    specs = {
        "pushes": derived_spec(
            folder,
            "gh_pushes",
            "gh_raw",
            filter="type = 'PushEvent'",
            deduplicate={"keys": ["id"]},
            watermark="10 minutes",
            window={"type": "tumbling", "size": "10 minutes"},
            group_by=["repo_name"],
            aggregate={"pushes": "count(*)", "commits": "sum(payload_size)"},
        ),
        "sessions": derived_spec(
            folder,
            "gh_sessions",
            "gh_raw",
            deduplicate={"keys": ["id"]},
            watermark="10 minutes",
            state={"kind": "session", "keys": ["actor_login"], "timeout": "10 minutes"},
        ),
        "activity": derived_spec(
            folder,
            "gh_activity",
            "gh_raw",
            watermark="10 minutes",
            window={"type": "sliding", "size": "10 minutes", "slide": "5 minutes"},
            group_by=["actor_login"],
            aggregate={"events": "count(*)"},
            output_mode="update",
        ),
        "unique": derived_spec(folder, "gh_unique", "gh_raw", deduplicate={"keys": ["id"], "within": "10 minutes"}),
    }
    pipelines = {k: load_pipeline(p) for k, p in specs.items()}
    rounds = model.schedule(SEED)
    for events in rounds:
        records = [Record(json.dumps(e.json()).encode(), "good", None) for e in events]
        assert send(broker.bootstrap, topic, records).sent == len(records)
        run_available_now(spark, raw)
        for p in pipelines.values():
            run_available_now(spark, p)
    return {"raw": raw, "rounds": rounds, **pipelines}


def table(p: Pipeline) -> Any:
    return read_without_spark("delta", p.sink_path).to_pylist()


def quarantined(p: Pipeline) -> list[dict[str, Any]]:
    return read_without_spark("delta", p.quarantine_path).to_pylist()


def audits(p: Pipeline) -> list[audit.BatchAudit]:
    return [audit.read(f) for f in audit.audit_files([Path(p.audit_path)])]


def check_late(p: Pipeline, outcome: model.Outcome, rounds: list[list[model.Event]]) -> None:
    """Every late row is in the quarantine once, with its reason, and the audit counts it."""
    rows = quarantined(p)
    got = Counter((json.loads(r["raw_text"])["id"], utc_ms(r["_kafka_timestamp"]) > 0) for r in rows)
    want = Counter((e.id, True) for e, _ in outcome.late)
    assert got == want
    for r in rows:
        assert r["reason"].startswith("late: event time "), r["reason"]
        assert " is behind the watermark " in r["reason"]
    batches = audits(p)
    assert all(b.reconciles for b in batches)
    assert sum(b.records_late for b in batches) == len(outcome.late) > 0
    assert sum(b.records_in for b in batches) == sum(len(r) for r in rounds)
    assert sum(b.records_filtered for b in batches) == len(outcome.filtered)


def test_windows_are_exact_and_late_rows_quarantined(world: dict[str, Any]) -> None:
    p, rounds = world["pushes"], world["rounds"]
    size = 10 * MIN
    # Deduplication runs first and drops rows by their own event time, windows or not.
    outcome = model.run(rounds, 10 * MIN, keep=lambda e: e.type == "PushEvent", dedup=True)
    windows = model.tumbling_counts(outcome.kept, size, key=lambda e: e.repo)
    want = {
        (start, repo): (len(es), sum(e.size for e in es))
        for (start, repo), es in windows.items()
        if start + size <= outcome.final_watermark
    }
    got = {(utc_ms(r["window_start"]), r["repo_name"]): (r["pushes"], r["commits"]) for r in table(p)}
    assert len(table(p)) == len(got), "a window was written twice"
    assert got == want
    assert all(utc_ms(r["window_end"]) - utc_ms(r["window_start"]) == size for r in table(p))
    check_late(p, outcome, rounds)


def test_sessions_are_exact(world: dict[str, Any]) -> None:
    p, rounds = world["sessions"], world["rounds"]
    outcome = model.run(rounds, 10 * MIN, dedup=True)
    want = [s for s in model.sessions(outcome.kept, 10 * MIN) if s[2] + 10 * MIN <= outcome.final_watermark]
    got = sorted(
        (r["actor_login"], utc_ms(r["session_start"]), utc_ms(r["session_end"]), r["events"]) for r in table(p)
    )
    assert got == want
    check_late(p, outcome, rounds)


def test_sliding_windows_in_update_mode_merge(world: dict[str, Any]) -> None:
    p, rounds = world["activity"], world["rounds"]
    size, slide = 10 * MIN, 5 * MIN
    outcome = model.run(rounds, 10 * MIN, late_end=model.sliding_end(size, slide))
    want = dict(model.sliding_counts(rounds, outcome, size, slide, key=lambda e: e.actor))
    got = {(utc_ms(r["window_start"]), r["actor_login"]): r["events"] for r in table(p)}
    assert len(table(p)) == len(got), "update mode must keep one row per window and key"
    assert got == want
    check_late(p, outcome, rounds)


def test_duplicates_dropped_within_the_watermark_kept_outside(world: dict[str, Any]) -> None:
    p, rounds = world["unique"], world["rounds"]
    outcome = model.run(rounds, 10 * MIN, dedup=True)
    got = Counter((r["id"], utc_ms(r["_event_time"])) for r in table(p))
    want = Counter((e.id, e.t) for e in outcome.kept)
    assert got == want
    reused = [k for k, n in Counter(e.id for e in outcome.kept).items() if n > 1]
    retried = len(outcome.accepted) - len(outcome.kept)
    assert reused and retried > 0, "the schedule must have both kinds of repeat"
    check_late(p, outcome, rounds)


def test_event_log_has_each_batch(world: dict[str, Any]) -> None:
    from sluice import config

    rows = read_without_spark("delta", config.events_table()).to_pylist()
    mine = [r for r in rows if r["pipeline"] == "gh_pushes"]
    assert {r["batch_id"] for r in mine} >= {b.batch_id for b in audits(world["pushes"])}
    with_data = [r for r in mine if r["input_rows"]]
    assert with_data and all(r["watermark"] is not None for r in with_data)
    assert max(r["state_rows"] for r in mine) > 0
    assert sum(r["late_rows"] for r in mine) == sum(b.records_late for b in audits(world["pushes"]))
    assert all("triggerExecution" in dict(r["duration_ms"]) for r in mine)
