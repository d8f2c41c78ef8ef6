"""The two shipped derived examples, on the real GitHub events sample.

The raw table is the shipped github_events spec's (Parquet, a row per commit), replayed
from ../shared/data/real/; the derived specs are the shipped ones, pointed at it. The
expected pushes per window and sessions per user come from the sample file in plain Python.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.dev.produce import read_ndjson, send
from sluice.spec import Pipeline, load_pipeline
from tests import eventtime_model as model
from tests.conftest import ROOT, require_real_data
from tests.derived_tables import audits, pushes_table, sessions_table
from tests.fixtures import run_available_now
from tests.integration.test_real_samples import replay_spec

pytestmark = pytest.mark.integration


def shipped(name: str, folder: Path, upstream: str) -> Pipeline:
    spec = yaml.safe_load((ROOT / "pipelines" / f"{name}.yaml").read_text())
    spec |= {
        "source": {"table": upstream},
        "sink": {"format": "delta", "path": str(folder / "tables" / name)},
        "checkpoint": str(folder / "checkpoints" / name),
        "allow_external_paths": True,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_pipeline(path)


def sample_rows(path: Path) -> list[model.Event]:
    """The raw table's rows as the model sees them: a row per commit of a push."""
    rows = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        t = int(datetime.fromisoformat(e["created_at"].replace("Z", "+00:00")).timestamp() * 1000)
        size = int(e["payload"].get("size") or 0)
        event = model.Event(e["id"], e["type"], e["actor"]["login"], e["repo"]["name"], size, t)
        rows += [event] * max(1, len(e["payload"].get("commits") or []))
    return rows


def test_pushes_per_window_and_sessions_on_real_events(spark: Any, broker: Any, tmp_path: Path) -> None:
    path = require_real_data("github-events-2021-07-21.ndjson")
    topic, raw = replay_spec(tmp_path, broker, "github_events", "github_event/v1.json")
    assert send(broker.bootstrap, topic, read_ndjson(path)).sent == 800
    run_available_now(spark, raw)
    pushes = shipped("github_pushes", tmp_path, raw.name)
    sessions = shipped("github_sessions", tmp_path, raw.name)
    run_available_now(spark, pushes)
    run_available_now(spark, sessions)

    rounds = [sample_rows(path)]  # one upstream commit: one batch
    want, _ = model.expected_pushes(rounds)
    got = pushes_table(pushes)
    assert got == want and sum(n for n, _ in got.values()) > 50

    outcome = model.run(rounds, 30 * model.MINUTE, dedup=True)
    closed = [
        s
        for s in model.sessions(outcome.kept, 30 * model.MINUTE)
        if s[2] + 30 * model.MINUTE <= outcome.final_watermark
    ]
    assert sessions_table(sessions) == closed and len(closed) > 20
    for p in (pushes, sessions):
        batches = audits(p)
        assert sum(b.records_in for b in batches) == len(rounds[0]) and all(b.reconciles for b in batches)
