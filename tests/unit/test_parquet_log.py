"""The Parquet commit log's format and rules, without Spark (Spark's own reader and writer
are checked against it in tests/integration/test_sinks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.records import parquet_log as log


def entry(name: str, action: str = "add") -> log.Entry:
    return log.Entry(f"file:///t/date=2026-11-21/{name}", 10, 1_700_000_000_000, action)


def test_file_names_and_what_a_reader_needs() -> None:
    assert [log.file_name(n) for n in (0, 8, 9, 10, 19)] == ["0", "8", "9.compact", "10", "19.compact"]
    assert [log.commit_number(n) for n in ("12", "9.compact", ".12.crc", "12.tmp", "x")] == [12, 9, None, None, None]
    assert log.latest(["0", "1", "9.compact", "10", ".10.crc"]) == 10
    assert log.latest([".0.crc"]) is None
    assert list(log.needed(5)) == [0, 1, 2, 3, 4, 5]
    assert list(log.needed(9)) == [9]
    assert list(log.needed(23)) == [19, 20, 21, 22, 23]


def test_render_and_parse_round_trip_in_spark_format() -> None:
    entries = [entry("a.parquet"), entry("b.parquet")]
    text = log.render(entries)
    assert text.splitlines()[0] == "v1"
    assert '"isDir":false' in text and '"action":"add"' in text
    assert log.parse(text) == entries
    assert log.parse("v1") == []


def test_parse_refuses_other_versions_and_garbage() -> None:
    with pytest.raises(log.LogError, match="expected the log format v1, found 'v2'"):
        log.parse("v2\n{}")
    with pytest.raises(log.LogError, match="not a file-sink log entry"):
        log.parse('v1\n{"path": "x"}')


def test_deletes_remove_earlier_adds() -> None:
    a, b = entry("a.parquet"), entry("b.parquet")
    assert log.live([a, b, entry("a.parquet", "delete")]) == [b]


def test_last_batch_of_a_writer_is_read_from_file_names() -> None:
    entries = [
        entry(log.tag("q-1", 3) + "part-0.parquet"),
        entry(log.tag("q-1", 12) + "part-0.parquet"),
        entry(log.tag("q-10", 40) + "part-0.parquet"),  # another writer, whose id starts alike
        entry("part-00000-from-spark.parquet"),
    ]
    assert log.last_batch(entries, "q-1") == 12
    assert log.last_batch(entries, "q-10") == 40
    assert log.last_batch(entries, "q-2") is None


def test_partition_columns_come_from_the_folders_between_the_table_and_a_file() -> None:
    assert log.partition_columns("/t", [entry("a.parquet")]) == ["date"]
    nested = log.Entry("s3a://b/t/year=2026/day=3/x.parquet", 1, 1)
    assert log.partition_columns("s3a://b/t", [nested]) == ["year", "day"]
    # The table's own folder may look like a partition; it is not one.
    own = log.Entry("file:/lake/kind=orders/date=2026-11-21/x.parquet", 1, 1)
    assert log.partition_columns("/lake/kind=orders", [own]) == ["date"]
    assert log.partition_columns("/elsewhere", [own]) == ["kind", "date"]  # spelled otherwise: as Spark infers
    spaced = log.Entry("file:/my%20lake/t/date=2026-11-21/x.parquet", 1, 1)
    assert log.partition_columns("/my lake/t", [spaced]) == ["date"]
    assert log.partition_columns("/t", []) == []


def test_compaction_interval_must_be_ten() -> None:
    log.check_interval(["9.compact", "19.compact", "20"])
    with pytest.raises(log.LogError, match="compacted every 5 commits"):
        log.check_interval(["4.compact", "9.compact"])


def test_committed_files_of_a_local_table(tmp_path: Path) -> None:
    folder = tmp_path / log.LOG_DIR
    folder.mkdir()
    (folder / "9.compact").write_text(log.render([entry("a.parquet"), entry("b.parquet")]))
    (folder / "10").write_text(log.render([entry("c.parquet"), entry("a.parquet", "delete")]))
    (folder / "3").write_text("v1")  # older than the compaction: not read
    assert [Path(e.path).name for e in log.committed_files(tmp_path)] == ["b.parquet", "c.parquet"]
    (folder / "12").write_text("v1")
    with pytest.raises(log.LogError, match="11 is missing"):
        log.committed_files(tmp_path)
    assert log.committed_files(tmp_path / "nothing-here") == []


def test_locations_from_the_uris_the_log_records() -> None:
    assert log.location("file:///data/t/x.parquet").uri == "/data/t/x.parquet"
    assert log.location("file:/data/t/x.parquet").uri == "/data/t/x.parquet"
    assert log.location("file:/my%20data/t/x.parquet").uri == "/my data/t/x.parquet"  # Hadoop escapes paths
    assert log.location("s3a://bucket/my%20t/x.parquet").uri == "s3a://bucket/my t/x.parquet"
    assert log.place("s3a://bucket/my%20t/x.parquet") == "my t/x.parquet"
