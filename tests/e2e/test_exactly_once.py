"""Exactly once at two seams, deterministically: a driver killed between a batch's table
writes and Spark's commit, restarted under a new pipeline name; and a second driver on the
same checkpoint or table, refused. (Random kills, stops, restarts and backfills on both
formats are in test_chaos.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice import config, faults
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops.submit import ingest_submission
from sluice.records.checkpoint import SPEC_FILE
from sluice.runtime import submit_env
from sluice.spec import Pipeline
from tests.fixtures import KAFKA_KEYS, audit_totals, kafka_keys, make_pipeline, new_topic, read_without_spark

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

SHIFTED_BOUNDS = {"accept": {"not_before": "2000-01-01"}}


def launch(
    pipeline: Pipeline, log: Path, available_now: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    sub = ingest_submission(pipeline.spec_path, pipeline_name=pipeline.name, available_now=available_now)
    with log.open("ab") as out:
        # Its own process group: the kill takes the JVM and the Python driver together.
        return subprocess.Popen(
            sub.command(),
            env=os.environ | submit_env(sub.master) | (env or {}),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def batches_done(pipeline: Pipeline) -> int:
    folder = Path(pipeline.audit_path)
    return len(list(folder.glob("*.json"))) if folder.exists() else 0


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job exited early with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no progress within {timeout}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def crash_settings(fmt: str) -> dict[str, Any]:
    """Small batches, so that 180 records make batches 0-2 and the kill meets batch 1."""
    return {
        "sink": {"format": fmt},
        "source": {"max_offsets_per_trigger": 60},
        "trigger": {"processing_time": "200 milliseconds"},
    }


def crash_in_batch_1(pipeline: Pipeline, log: Path, env: dict[str, str] | None = None) -> None:
    """Run the stream until batch 1's tables are written, and SIGKILL it before Spark logs
    that batch committed: the crash that tests exactly-once hardest."""
    crashed = launch(pipeline, log, env=(env or {}) | {faults.ENV: "kill@batch.written#1"})
    assert crashed.wait(timeout=300) == -signal.SIGKILL, log.read_text()[-3000:]
    checkpoint = Path(pipeline.checkpoint_path)
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()


# Each crash test on one format in CI, the other with `make drills`: both formats' commit
# paths crash between write and commit at every change, in one test or the other.
@pytest.mark.parametrize("fmt", ["delta", pytest.param("parquet", marks=pytest.mark.drill)])
def test_renamed_after_a_crash_between_write_and_commit_repeats_nothing(spark, broker, tmp_path, fmt) -> None:
    # Killed right after batch 1's tables are written, before Spark logs it committed, then
    # restarted with only `name:` changed: the replayed batch 1 must be found written.
    topic = new_topic(broker, partitions=2)
    settings = crash_settings(fmt)
    before = make_pipeline(tmp_path, topic, name="before", **settings)
    # 180 records, 60 a batch: batches 0-1 before the kill, 1 (replayed) and 2 after it.
    report = send(broker.bootstrap, topic, synthetic(EventGenerator(before, seed=23), 180, 0.05), keep=True)
    log = tmp_path / "driver.log"
    crash_in_batch_1(before, log)
    checkpoint = Path(before.checkpoint_path)

    renamed = {"checkpoint": before.checkpoint_path, **settings, "sink": {"format": fmt, "path": before.sink_path}}
    if fmt == "delta":  # the same for both formats: it refuses before writing anything
        # Replaying batch 1 under other event-time bounds could put a record in both tables; a
        # checkpoint that does not record the spec batch 1 was planned under (one from before
        # specs were recorded) cannot replay it under that spec, so the start is refused.
        (checkpoint / SPEC_FILE).unlink()
        changed = make_pipeline(tmp_path, topic, name="changed", event_time=SHIFTED_BOUNDS, **renamed)
        refused = launch(changed, tmp_path / "changed.log", available_now=True)
        assert refused.wait(timeout=300) == 3, (tmp_path / "changed.log").read_text()[-3000:]
        assert "batch 1 was planned, but not committed, under a different event_time, and this checkpoint" in " ".join(
            (tmp_path / "changed.log").read_text().split()
        )
    after = make_pipeline(tmp_path, topic, name="after", **renamed)
    final = launch(after, log, available_now=True)
    assert final.wait(timeout=300) == 0, log.read_text()[-3000:]

    good = {(topic, d.partition, d.offset) for d in report.delivered if d.record.kind == "good"}
    bad = {(topic, d.partition, d.offset) for d in report.delivered if d.record.kind != "good"}
    out = kafka_keys(read_without_spark(fmt, before.sink_path, KAFKA_KEYS))
    quarantined = kafka_keys(read_without_spark(fmt, before.quarantine_path, KAFKA_KEYS))
    assert len(out) == len(set(out)) and len(quarantined) == len(set(quarantined)), "a batch was written twice"
    assert set(out) == good and set(quarantined) == bad


@pytest.mark.parametrize("fmt", [pytest.param("delta", marks=pytest.mark.drill), "parquet"])
def test_a_new_schema_version_after_a_crash_replays_the_interrupted_batch_under_the_old_one(
    spark, broker, tmp_path, fmt
) -> None:
    # The path docs/schemas.md gives for a producer's new field, after a crash mid-batch: killed between
    # writing batch 1 and committing it, restarted with a v2 that adds a nullable `color`.
    # Batch 1 is replayed under v1 (its part already written is found, the rest written as
    # planned), then the new records are read under v2.
    topic = new_topic(broker, partitions=2)
    settings = crash_settings(fmt)
    v1 = make_pipeline(tmp_path, topic, name="colors", **settings)
    first = send(broker.bootstrap, topic, synthetic(EventGenerator(v1, seed=29), 180, 0.05), keep=True)
    log = tmp_path / "driver.log"
    # The event log holds its rows in the driver's spool until the run ends: the kill finds them there.
    events = {"SLUICE_EVENTS_TABLE": str(tmp_path / "events")}
    crash_in_batch_1(v1, log, env=events | {"SLUICE_EVENTS_FLUSH_SECONDS": "3600"})

    schema = json.loads((config.PROJECT_ROOT / "schemas" / "device_signal" / "v1.json").read_text())
    schema["fields"].append({"name": "color", "type": "string", "nullable": True, "metadata": {}})
    (tmp_path / "v2.json").write_text(json.dumps(schema))
    v2 = make_pipeline(tmp_path, topic, schema=str(tmp_path / "v2.json"), name="colors", **settings)
    second = send(broker.bootstrap, topic, synthetic(EventGenerator(v2, seed=31), 40, 0.05), keep=True)
    assert launch(v2, log, available_now=True, env=events).wait(timeout=300) == 0, log.read_text()[-3000:]
    assert "batch 1 was planned under the previous spec and partly written" in log.read_text()

    delivered = first.delivered + second.delivered
    good = {(topic, d.partition, d.offset) for d in delivered if d.record.kind == "good"}
    bad = {(topic, d.partition, d.offset) for d in delivered if d.record.kind != "good"}
    rows = read_without_spark(fmt, v2.sink_path, [*KAFKA_KEYS, "color"])
    out, quarantined = kafka_keys(rows), kafka_keys(read_without_spark(fmt, v2.quarantine_path, KAFKA_KEYS))
    assert len(out) == len(set(out)) and len(quarantined) == len(set(quarantined)), "a batch was written twice"
    assert set(out) == good and set(quarantined) == bad
    # Every value as sent: the new records' colors, and none where v1's records had none.
    sent = {(topic, d.partition, d.offset): d.record.event.get("color") for d in delivered if d.record.kind == "good"}
    assert dict(zip(out, rows.column("color").to_pylist(), strict=True)) == sent
    assert any(sent.values()) and audit_totals(v2) == {
        "records_in": len(delivered),
        "records_out": len(good),
        "records_quarantined": len(bad),
    }
    # The event log (delta-rs): a row for every batch with records, once each, the spooled
    # rows the kill left and the replayed batch's included; rows in add up to records sent.
    logged = read_without_spark("delta", str(tmp_path / "events"), ["batch_id", "input_rows"]).to_pylist()
    batches = [r["batch_id"] for r in logged if r["input_rows"]]
    assert len(batches) == len(set(batches)) and {0, 1} <= set(batches), logged
    assert sum(r["input_rows"] for r in logged) == len(delivered), logged


def test_a_second_spec_on_the_same_checkpoint_or_table_is_refused(spark, broker, tmp_path) -> None:
    topic = new_topic(broker, partitions=2)
    settings = {"source": {"max_offsets_per_trigger": 50}, "trigger": {"processing_time": "500 milliseconds"}}
    first = make_pipeline(tmp_path, topic, name="first", **settings)
    report = send(broker.bootstrap, topic, synthetic(EventGenerator(first, seed=5), 150), keep=True)
    same_checkpoint = make_pipeline(
        tmp_path, topic, name="same_checkpoint", checkpoint=first.checkpoint_path, sink={"path": str(tmp_path / "x")}
    )
    same_table = make_pipeline(tmp_path, topic, name="same_table", sink={"path": first.sink_path})
    log = tmp_path / "driver.log"
    running = launch(first, log)
    try:
        wait_until(lambda: batches_done(first) >= 1, running, log, timeout=240)  # it holds its claims now
        for other, refusal in (
            (same_checkpoint, f"the checkpoint {first.checkpoint_path} is in use by 'first'"),
            (same_table, f"the table {first.sink_path} is written by the stream of 'first'"),
        ):
            own_log = tmp_path / f"{other.name}.log"
            assert launch(other, own_log).wait(timeout=120) == 4
            assert refusal in own_log.read_text()
            cli = subprocess.run(
                [sys.executable, "-m", "sluice.cli", "start", other.name],
                env=os.environ | {"SLUICE_PIPELINES": str(tmp_path), "COLUMNS": "300"},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cli.returncode == 1 and refusal in " ".join(cli.stderr.split()), cli.stdout + cli.stderr
        # The first stream went on undisturbed: it reads all 150. Spark splits the 50 a trigger
        # over the partitions with rounding, so wait for the records, not for three batches.
        wait_until(lambda: audit_totals(first)["records_in"] >= 150, running, log, timeout=240)
    finally:
        running.send_signal(signal.SIGTERM)  # spark-submit passes it to the Python driver
        running.wait(timeout=180)
    out = kafka_keys(read_without_spark("delta", first.sink_path, KAFKA_KEYS))
    assert sorted(out) == sorted((topic, d.partition, d.offset) for d in report.delivered)
