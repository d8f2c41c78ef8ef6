from __future__ import annotations

import json
from pathlib import Path

from sluice.records.checkpoint import pending_batch, split_changes
from sluice.records.tables import upstream_lag
from sluice.spec import load_pipeline
from sluice.spec.loader import recorded, restore
from tests.unit.test_spec import GOOD, write


def test_the_batch_a_restart_replays() -> None:
    assert pending_batch([], []) is None
    assert pending_batch(["0"], []) == 0
    assert pending_batch(["0", "1", ".1.crc"], ["0"]) == 1
    assert pending_batch(["0", "1"], ["0", "1"]) is None


def test_the_split_names_what_sends_a_record_to_the_quarantine(tmp_path) -> None:
    base = load_pipeline(write(tmp_path, GOOD)).split
    # Neither how often it runs nor where it writes decides a record's table.
    other_trigger = GOOD + "trigger: {processing_time: 5 seconds}\n"
    assert split_changes(base, load_pipeline(write(tmp_path, other_trigger)).split) == []
    bounds = GOOD.replace("format: epoch_seconds}", "format: epoch_seconds, accept: {not_after: 2 days}}")
    assert split_changes(base, load_pipeline(write(tmp_path, bounds)).split) == ["event_time"]
    warn = GOOD + "expectations: {rows: {known: {column: device_id, not_null: true}}}\n"
    assert split_changes(base, load_pipeline(write(tmp_path, warn)).split) == []
    drop = warn.replace("not_null: true}", "not_null: true, action: drop}")
    assert split_changes(base, load_pipeline(write(tmp_path, drop)).split) == ["dropping_rules", "flatten"]
    schema = write(tmp_path, GOOD, str(tmp_path / "other.json"))
    (tmp_path / "other.json").write_text('{"type": "struct", "fields": [{"name": "timestamp", "type": "long"}]}')
    assert split_changes(base, load_pipeline(schema).split) == ["schema"]


def test_rescue_and_coerce_decide_a_records_table_too(tmp_path) -> None:
    """Adding rescue between a crash and the restart could put a record of the replayed batch
    in neither table: the quarantine part was written, the table part is written without it."""
    base = load_pipeline(write(tmp_path, GOOD)).split
    rescue = GOOD + "on_type_mismatch: {battery: rescue}\n"
    assert split_changes(base, load_pipeline(write(tmp_path, rescue)).split) == ["rescue"]
    quarantine = GOOD + "on_type_mismatch: {battery: quarantine}\n"  # the default, said aloud
    assert split_changes(base, load_pipeline(write(tmp_path, quarantine)).split) == []
    coerce = GOOD + "coerce: {signal: {allow_non_finite: true}}\n"
    assert split_changes(base, load_pipeline(write(tmp_path, coerce)).split) == ["coerce"]


def delta_commit(log: Path, version: int, *actions: dict[str, object]) -> None:
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))


def committed_offset(checkpoint: Path, batch: int, offset: dict[str, object]) -> None:
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offset)}\n')
    (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_a_derived_pipeline_lags_by_the_upstream_versions_that_change_data(tmp_path: Path) -> None:
    table, cp = tmp_path / "up", tmp_path / "cp"
    log = table / "_delta_log"
    delta_commit(log, 0, {"metaData": {}}, {"add": {"path": "a", "dataChange": True}})
    assert upstream_lag(str(cp), "delta", str(table)) == 1  # nothing read yet
    committed_offset(cp, 0, {"sourceVersion": 1, "reservoirVersion": 1, "index": -1, "isStartingVersion": False})
    assert upstream_lag(str(cp), "delta", str(table)) == 0
    # OPTIMIZE rewrites files without changing data: the Delta source makes no batch of it.
    delta_commit(log, 1, {"remove": {"path": "a", "dataChange": False}}, {"add": {"path": "b", "dataChange": False}})
    assert upstream_lag(str(cp), "delta", str(table)) == 0
    delta_commit(log, 2, {"add": {"path": "c", "dataChange": True}})
    delta_commit(log, 3, {"remove": {"path": "c", "dataChange": True}})  # a DELETE
    assert upstream_lag(str(cp), "delta", str(table)) == 2
    # Part of version 2 read (a file index): the rest of it is not counted as waiting.
    committed_offset(cp, 1, {"sourceVersion": 1, "reservoirVersion": 2, "index": 0, "isStartingVersion": False})
    assert upstream_lag(str(cp), "delta", str(table)) == 1
    assert upstream_lag("abfss://c@account.dfs.core.windows.net/cp", "delta", str(table)) is None


def test_a_recorded_spec_restores_the_split_it_was_planned_under(tmp_path: Path) -> None:
    before = load_pipeline(write(tmp_path, GOOD + "on_type_mismatch: {battery: rescue}\n"))
    record = json.loads(json.dumps(recorded(before)))  # as the checkpoint keeps it
    now = load_pipeline(write(tmp_path, GOOD + "trigger: {processing_time: 5 seconds}\n"))
    assert split_changes(before.split, now.split) == ["rescue"]
    previous = restore(record, now)
    assert split_changes(before.split, previous.split) == []
    # It writes where the spec of now writes: the replayed batch's part may be there already.
    assert (previous.sink_path, previous.checkpoint_path) == (now.sink_path, now.checkpoint_path)
