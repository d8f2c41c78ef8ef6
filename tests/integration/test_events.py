"""The event log's writes (jobs/stream/events.py) on real Spark and Delta, read back with delta-rs:
rows spooled before a crash are written once, also when the crash cut a write short, and a
date's many small files are compacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.stream import events
from jobs.stream.events import EventLog
from sluice import storage
from sluice.records.audit import BatchAudit
from tests.fixtures import read_without_spark

pytestmark = pytest.mark.integration


class Crash(BaseException):
    """The driver dies: nothing of the job's own error handling runs."""


def batch(n: int) -> BatchAudit:
    return BatchAudit("ev_crash", n, 10 + n, 10 + n, 0, 10 + n, seconds=0.5, written_at="2026-11-23T10:00:00Z")


def test_a_flush_a_crash_cut_short_is_done_again_without_writing_a_row_twice(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "events"
    monkeypatch.setenv("SLUICE_EVENTS_TABLE", str(table))
    first = EventLog("ev_crash", "ev_crash")
    for n in range(3):
        first.replayed(batch(n), "query-1", "run-1")
    written = EventLog._write

    def commit_then_die(self: EventLog, *args: Any) -> None:
        written(self, *args)  # Delta has committed the rows ...
        raise Crash  # ... and the driver dies before the spool is cut

    monkeypatch.setattr(EventLog, "_write", commit_then_die)
    with pytest.raises(Crash):
        first.flush(spark, force=True)
    monkeypatch.setattr(EventLog, "_write", written)
    with first.spool.open("a") as spool:  # and a row the kill cut short, mid-line
        spool.write('{"pipeline": "ev_crash", "query_id": "query-1", "batch_')

    after = EventLog("ev_crash", "ev_crash")  # the restarted driver's
    after.replayed(batch(3), "query-1", "run-2")
    # The cut flush's 3 rows again (Delta skips them: committed), then the new one.
    assert after.flush(spark, force=True) == 4
    rows = read_without_spark("delta", str(table), ["batch_id", "input_rows", "run_id"]).to_pylist()
    assert sorted((r["batch_id"], r["input_rows"], r["run_id"]) for r in rows) == [
        (0, 10, "run-1"),
        (1, 11, "run-1"),
        (2, 12, "run-1"),
        (3, 13, "run-2"),
    ]
    assert after.flush(spark, force=True) == 0 and not after.spool.exists() and not after.inflight.exists()


def test_the_spools_of_gone_drivers_are_written_and_a_live_ones_left_alone(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drivers of one pipeline can run on one host at once (one paused past its lease,
    one that took over), so each spools its own rows; a driver starting takes over the spools
    of the drivers that are gone, never those of one that lives."""
    import subprocess
    import sys

    table = tmp_path / "events"
    monkeypatch.setenv("SLUICE_EVENTS_TABLE", str(table))
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    mine = EventLog("ev_hosts", "ev_hosts")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    paused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid, run in ((int(gone.stdout), "run-gone"), (paused.pid, "run-paused")):
            other = EventLog("ev_hosts", "ev_hosts")
            other.spool, other.inflight = (
                mine.spool.with_name(f"events.{pid}.{kind}") for kind in ("jsonl", "inflight")
            )
            other.replayed(batch(0), f"query-{run}", run)
        assert mine.flush(spark, force=True) == 1  # the gone driver's row, taken over
        rows = read_without_spark("delta", str(table), ["run_id"]).to_pylist()
        assert rows == [{"run_id": "run-gone"}]
        assert mine.spool.with_name(f"events.{paused.pid}.jsonl").exists()  # the live one's, untouched
    finally:
        paused.kill()
        paused.wait()


def test_a_date_with_many_flushed_files_is_compacted_rows_unchanged(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each flush adds a small file to its date: at COMPACT_AT files the flush compacts them."""
    table = tmp_path / "events"
    monkeypatch.setenv("SLUICE_EVENTS_TABLE", str(table))
    monkeypatch.setattr(events, "COMPACT_AT", 3)
    log = EventLog("ev_small", "ev_small")
    files = []
    for n in range(4):
        log.replayed(batch(n), "query-1", "run-1")
        assert log.flush(spark, force=True) == 1
        files.append(len(storage.delta_table(str(table)).file_uris()))
    assert files == [1, 2, 1, 2]  # the third flush's file, and the two before it, made one
    rows = read_without_spark("delta", str(table), ["batch_id"]).to_pylist()
    assert sorted(r["batch_id"] for r in rows) == [0, 1, 2, 3]


def test_the_rows_delta_rs_writes_have_the_tables_spark_schema(spark: Any) -> None:
    """The table is created from SCHEMA (Spark's), the rows written with ARROW_SCHEMA: one
    column changed in one and not the other would fail every flush."""
    assert spark.createDataFrame([], events.SCHEMA).toArrow().schema == events.ARROW_SCHEMA
