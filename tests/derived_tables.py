"""Reading what a derived pipeline wrote (delta-rs, no Spark) and checking it against
:mod:`tests.eventtime_model`; shared by the integration and chaos tests."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC
from pathlib import Path
from typing import Any

import yaml

from sluice.records import audit
from sluice.spec import Pipeline
from tests import eventtime_model as model
from tests.fixtures import read_without_spark

MIN = model.MINUTE


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
    return int(naive.replace(tzinfo=UTC).timestamp() * 1000) if naive.tzinfo is None else ms(naive)


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


def pushes_table(p: Pipeline) -> dict[tuple[int, str], tuple[int, int]]:
    rows = table(p)
    got = {(utc_ms(r["window_start"]), r["repo_name"]): (r["pushes"], r["commits"]) for r in rows}
    assert len(rows) == len(got), "a window was written twice"
    assert all(utc_ms(r["window_end"]) - utc_ms(r["window_start"]) == 10 * MIN for r in rows)
    return got


def sessions_table(p: Pipeline) -> list[tuple[str, int, int, int]]:
    return sorted(
        (r["actor_login"], utc_ms(r["session_start"]), utc_ms(r["session_end"]), r["events"]) for r in table(p)
    )
