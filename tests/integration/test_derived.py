"""Derived pipelines on a real broker, Spark and Delta, against plain-Python expectations.

One raw pipeline lands GitHub-like events from Kafka; four derived pipelines read its
table, round by round, each an available-now run: a seeded schedule with events out of
order, behind the watermark, retried, and ids reused long after. What each wrote is read
with delta-rs and compared with :mod:`tests.eventtime_model`, computed from the same events.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.stream.derive import UpstreamChanged, rebuild
from jobs.stream.modes import run
from sluice.dev.generate import Record
from sluice.dev.produce import send
from sluice.records.tables import upstream_lag
from sluice.spec import load_pipeline
from tests import eventtime_model as model
from tests.derived_tables import (
    MIN,
    audits,
    check_late,
    derived_spec,
    pushes_table,
    quarantined,
    sessions_table,
    table,
    utc_ms,
)
from tests.fixtures import make_pipeline, new_topic, read_without_spark, run_available_now

pytestmark = pytest.mark.integration

SEED = 1521
#: Sent with every round: records that cannot be parsed (the raw table quarantines them too).
BAD_RECORDS = [b"{not json", b"[1, 2]"]


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
        "session_windows": derived_spec(
            folder,
            "gh_session_windows",
            "gh_raw",
            watermark="10 minutes",
            window={"type": "session", "gap": "5 minutes"},
            group_by=["repo_name"],
            aggregate={"events": "count(*)"},
        ),
        "custom": derived_spec(
            folder,
            "gh_custom",
            "gh_raw",
            watermark="10 minutes",
            state={
                "kind": "custom",
                "keys": ["actor_login"],
                "timeout": "10 minutes",
                "processor": "tests.processors:IdleCount",
                "output": "actor_login string, events bigint",
            },
        ),
    }
    pipelines = {k: load_pipeline(p) for k, p in specs.items()}
    # The same windows, on the topic itself: parsing, its quarantine, then the event-time work.
    pipelines["kafka"] = make_pipeline(
        folder,
        topic,
        schema="github_event/v1.json",
        name="gh_kafka_pushes",
        event_time={"field": "created_at", "format": "iso8601"},
        filter="type = 'PushEvent'",
        deduplicate={"keys": ["id"]},
        watermark="10 minutes",
        window={"type": "tumbling", "size": "10 minutes"},
        group_by=["repo_name"],
        aggregate={"pushes": "count(*)", "commits": "sum(payload_size)"},
    )
    # Three rounds reach every pattern the model makes (ids reused 30 minutes on appear in the
    # third); each round costs eight available-now runs, the longest set-up of the suite.
    rounds = model.schedule(SEED, rounds=3)
    lags = []  # supervision's lag of the pushes pipeline: before it reads a round, and after
    for events in rounds:
        records = [Record(json.dumps(e.json()).encode(), "good", None) for e in events]
        records += [Record(value, "bad", None) for value in BAD_RECORDS]
        assert send(broker.bootstrap, topic, records).sent == len(records)
        run_available_now(spark, raw)
        windows = pipelines["pushes"]
        behind = upstream_lag(windows.checkpoint_path, "delta", raw.sink_path)
        # Two runs at a time in the one session: each is mostly its driver planning batches,
        # and their writes to the shared event log are concurrent appends, as in production.
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(run_available_now, spark, p) for p in pipelines.values()]:
                done.result()
        lags.append((behind, upstream_lag(windows.checkpoint_path, "delta", raw.sink_path)))
    return {"raw": raw, "rounds": rounds, "lags": lags, **pipelines}


def test_a_derived_pipeline_lags_by_the_upstream_versions_it_has_not_read(world: dict[str, Any]) -> None:
    # Each round the upstream commits one batch (one version with data) before the pushes
    # pipeline reads it: supervision sees it behind by exactly that, and caught up after.
    assert world["lags"] == [(1, 0)] * len(world["rounds"])


def test_windows_are_exact_and_late_rows_quarantined(world: dict[str, Any]) -> None:
    p, rounds = world["pushes"], world["rounds"]
    want, outcome = model.expected_pushes(rounds)
    assert pushes_table(p) == want
    check_late(p, outcome, rounds)


def test_sessions_are_exact(world: dict[str, Any]) -> None:
    p, rounds = world["sessions"], world["rounds"]
    want, outcome = model.expected_sessions(rounds)
    assert sessions_table(p) == want
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
    # The query reads its source once per branch; the log counts each row once.
    assert sum(r["input_rows"] for r in mine) == sum(b.records_in for b in audits(world["pushes"]))
    assert all("triggerExecution" in dict(r["duration_ms"]) for r in mine)


def test_a_changed_key_is_refused_against_the_checkpoint(world: dict[str, Any], spark: Any) -> None:
    from jobs.stream.derive import IncompatibleState, check_state

    p = world["pushes"]
    spec = yaml.safe_load(p.spec_path.read_text()) | {"group_by": ["actor_login"]}
    changed = p.spec_path.with_name("gh_pushes_changed.yaml")
    changed.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(IncompatibleState) as err:
        check_state(spark, load_pipeline(changed))
    assert "different group_by" in str(err.value) and "new checkpoint and a new sink.path" in str(err.value)
    changed.unlink()
    check_state(spark, p)  # the spec it was built with still starts


def test_a_custom_processor_sees_every_accepted_row_once(world: dict[str, Any]) -> None:
    p, rounds = world["custom"], world["rounds"]
    outcome = model.run(rounds, 10 * MIN)
    rows = table(p)
    # The last round's sentinel keeps its key open; every other key went idle and was written.
    want = Counter(e.actor for e in outcome.accepted if e.actor != "zed")
    got: Counter[str] = Counter()
    for r in rows:
        got[r["actor_login"]] += r["events"]
    assert got == want
    assert "zed" not in got and len(rows) >= len(want)
    check_late(p, outcome, rounds)


def test_session_windows_follow_spark_batch_by_batch(world: dict[str, Any]) -> None:
    p, rounds = world["session_windows"], world["rounds"]
    want, outcome = model.session_windows(rounds, 5 * MIN, 10 * MIN, key=lambda e: e.repo)
    got = sorted((r["repo_name"], utc_ms(r["window_start"]), utc_ms(r["window_end"]), r["events"]) for r in table(p))
    assert got == want and len(got) > 10
    check_late(p, outcome, rounds)


def test_reading_kafka_directly_quarantines_bad_records_and_late_rows(world: dict[str, Any]) -> None:
    p, rounds = world["kafka"], world["rounds"]
    want, outcome = model.expected_pushes(rounds)
    assert pushes_table(p) == want
    rows = quarantined(p)
    late = Counter(json.loads(r["raw_text"])["id"] for r in rows if r["reason"].startswith("late: "))
    assert late == Counter(e.id for e, _ in outcome.late)
    rejected = sorted(r["reason"].split(":")[0] for r in rows if not r["reason"].startswith("late: "))
    assert len(rejected) == len(BAD_RECORDS) * len(rounds) and set(rejected) == {"malformed JSON", "not a JSON object"}
    batches = audits(p)
    assert all(b.reconciles for b in batches)
    assert sum(b.records_in for b in batches) == sum(len(r) for r in rounds) + len(rejected)
    assert sum(b.records_quarantined for b in batches) == len(rejected)
    assert sum(b.records_late for b in batches) == len(outcome.late)


def test_rows_deleted_upstream_while_derived_streams_run(spark: Any, broker: Any, tmp_path: Path) -> None:
    # A privacy request deletes one user's rows from the upstream table while two derived
    # streams read it: the default one stops and says how to go on; the one whose spec
    # says skip goes on, keeping the deleted rows; the rebuild recomputes from what is left.
    topic = new_topic(broker)
    raw = make_pipeline(
        tmp_path,
        topic,
        schema="github_event/v1.json",
        name="ch_raw",
        event_time={"field": "created_at", "format": "iso8601"},
    )
    common: dict[str, Any] = {"filter": "type = 'PushEvent'", "trigger": {"processing_time": "500 milliseconds"}}
    strict = load_pipeline(derived_spec(tmp_path, "ch_strict", "ch_raw", **common))
    skipping = load_pipeline(
        derived_spec(tmp_path, "ch_skip", "ch_raw", **common, source={"table": "ch_raw", "on_upstream_change": "skip"})
    )
    first, second = model.schedule(SEED)[:2]

    def ids(table: str, pushes_only: bool = False) -> list[str]:
        rows = read_without_spark("delta", table, ["id", "type", "actor_login"]).to_pylist()
        return sorted(r["id"] for r in rows if r["type"] == "PushEvent" or not pushes_only)

    def wait_for(p: Any, expected: list[str], thread: threading.Thread) -> None:
        deadline = time.monotonic() + 180
        while ids(p.sink_path) != expected:
            assert thread.is_alive() and time.monotonic() < deadline, (p.name, ids(p.sink_path), expected)
            time.sleep(0.5)

    send(broker.bootstrap, topic, [Record(json.dumps(e.json()).encode(), "good", None) for e in first])
    run_available_now(spark, raw)
    stops = {p.name: threading.Event() for p in (strict, skipping)}
    errors: dict[str, Exception | None] = {}
    threads = {
        p.name: threading.Thread(target=lambda p=p: errors.update({p.name: run(spark, p, stop=stops[p.name])}))
        for p in (strict, skipping)
    }
    for thread in threads.values():
        thread.start()
    try:
        before = ids(raw.sink_path, pushes_only=True)
        for p in (strict, skipping):
            wait_for(p, before, threads[p.name])

        rows = read_without_spark("delta", raw.sink_path, ["type", "actor_login"]).to_pylist()
        gone = Counter(r["actor_login"] for r in rows if r["type"] == "PushEvent").most_common(1)[0][0]
        DeltaTable(raw.sink_path).delete(f"actor_login = '{gone}'")  # with delta-rs, as a user would
        kept = ids(raw.sink_path, pushes_only=True)
        assert len(kept) < len(before)
        send(broker.bootstrap, topic, [Record(json.dumps(e.json()).encode(), "good", None) for e in second])
        run_available_now(spark, raw)
        after = ids(raw.sink_path, pushes_only=True)
        added = Counter(after) - Counter(kept)

        threads["ch_strict"].join(timeout=180)
        assert not threads["ch_strict"].is_alive()
        error = errors["ch_strict"]
        assert isinstance(error, UpstreamChanged), error
        assert str(error).startswith("ch_strict: the table of ch_raw deleted or rewrote rows at version ")
        assert "`sluice rebuild ch_strict`" in str(error) and "on_upstream_change: skip" in str(error)

        # Skipping: the DELETE is ignored (the rows stay counted here) and new rows are read.
        wait_for(skipping, sorted((Counter(before) + added).elements()), threads["ch_skip"])
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads.values():
            thread.join(timeout=180)
    assert errors["ch_skip"] is None

    rebuild(spark, strict)
    run_available_now(spark, strict)
    assert ids(strict.sink_path) == after
