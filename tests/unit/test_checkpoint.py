from __future__ import annotations

from sluice.records.checkpoint import pending_batch, split_changes
from sluice.spec import load_pipeline
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
