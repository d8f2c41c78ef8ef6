"""A derived pipeline SIGKILLed between writing a batch and Spark committing it, then
restarted from its checkpoint: no window and no session is lost or written twice.

The killed driver runs through spark-submit as in production, on the RocksDB state store,
and resumes in the test's session from what it left on disk; the expected tables come from
:mod:`tests.eventtime_model`, computed from the same events.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sluice import faults
from sluice.dev.generate import Record
from sluice.dev.produce import send
from sluice.ops.submit import ingest_submission
from sluice.runtime import submit_env
from sluice.spec import Pipeline, load_pipeline
from tests import eventtime_model as model
from tests.derived_tables import audits, check_late, derived_spec, pushes_table, sessions_table
from tests.fixtures import make_pipeline, new_topic, run_available_now

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

#: Rounds 0-1 run in-process (batches 0-3); round 2 runs through spark-submit and dies, with
#: state from both before it, and resumes in-process; the last round (the model's sentinel)
#: closes every window after the restart. The patterns each round adds (ids reused long after) are in
#: tests/integration/test_derived.py; this test is about the kill.
KILLED_ROUND = 2
ROUNDS = 3


def submit(p: Pipeline, log: Path, env: dict[str, str] | None = None) -> int:
    sub = ingest_submission(p.spec_path, pipeline_name=p.name, available_now=True)
    with log.open("ab") as out:
        proc = subprocess.run(
            sub.command(),
            env=os.environ | submit_env(sub.master) | (env or {}),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the kill takes the JVM and the Python driver together
            timeout=600,
            check=False,
        )
    return proc.returncode


def test_kill_and_restart_neither_loses_nor_doubles(broker: Any, spark: Any, tmp_path: Path) -> None:
    topic = new_topic(broker)
    raw = make_pipeline(
        tmp_path,
        topic,
        schema="github_event/v1.json",
        name="raw",
        event_time={"field": "created_at", "format": "iso8601"},
    )
    pushes = load_pipeline(
        derived_spec(
            tmp_path,
            "pushes",
            "raw",
            filter="type = 'PushEvent'",
            deduplicate={"keys": ["id"]},
            watermark="10 minutes",
            window={"size": "10 minutes"},
            group_by=["repo_name"],
            aggregate={"pushes": "count(*)", "commits": "sum(payload_size)"},
        )
    )
    sessions = load_pipeline(
        derived_spec(
            tmp_path,
            "sessions",
            "raw",
            deduplicate={"keys": ["id"]},
            watermark="10 minutes",
            state={"kind": "session", "keys": ["actor_login"], "timeout": "10 minutes"},
        )
    )
    # The windows are written by the batch after the data (the watermark moves on), the
    # late rows by the data batch: kill one pipeline in each.
    kill_at = {pushes.name: 2 * KILLED_ROUND + 1, sessions.name: 2 * KILLED_ROUND}
    rounds = model.schedule(seed=77, rounds=ROUNDS)
    for r, events in enumerate(rounds):
        records = [Record(json.dumps(e.json()).encode(), "good", None) for e in events]
        assert send(broker.bootstrap, topic, records).sent == len(records)
        run_available_now(spark, raw)
        if r != KILLED_ROUND:
            for p in (pushes, sessions):
                run_available_now(spark, p)
            continue

        def kill(p: Pipeline) -> None:
            log = tmp_path / f"{p.name}.log"
            code = submit(p, log, env={faults.ENV: f"kill@batch.written#{kill_at[p.name]}"})
            assert code != 0, log.read_text()[-3000:]
            written = {b.batch_id for b in audits(p)}
            assert kill_at[p.name] in written, "the batch was written before the kill"

        # Both pipelines' drivers at once: each is mostly a JVM starting.
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(kill, p) for p in (pushes, sessions)]:
                done.result()
        # The restart reads only what the killed driver left on disk (checkpoint, RocksDB
        # state, table, audit), so this session resumes it as a new spark-submit would, without
        # a second JVM start per pipeline; tests/e2e/test_exactly_once.py restarts through
        # spark-submit.
        for p in (pushes, sessions):
            run_available_now(spark, p)

    want, outcome = model.expected_pushes(rounds)
    assert pushes_table(pushes) == want
    check_late(pushes, outcome, rounds)
    closed, outcome = model.expected_sessions(rounds)
    assert sessions_table(sessions) == closed
    check_late(sessions, outcome, rounds)
