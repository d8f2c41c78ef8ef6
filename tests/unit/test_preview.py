"""``sluice preview``'s pure parts: which records a sample reads, a file's records, the words
for each rule's effect, and the terminal output. No JVM, no broker: the command's Spark side
is tested in tests/integration/test_preview.py."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from sluice import cli
from sluice.errors import InvalidInput
from sluice.ops import preview as previews
from sluice.records.preview import Preview, RuleOutcome
from sluice.spec import load_pipeline
from sluice.topics import sample_plan
from tests.conftest import ROOT
from tests.fixtures import make_pipeline


def test_a_sample_takes_the_newest_records_a_partition_at_a_time() -> None:
    available = {("t", 0): (0, 100), ("t", 1): (40, 43), ("t", 2): (7, 7)}
    assert sample_plan(available, 10) == {("t", 0): (93, 100), ("t", 1): (40, 43)}
    assert sample_plan(available, 1000) == {("t", 0): (0, 100), ("t", 1): (40, 43)}
    assert sample_plan(available, 0) == {}
    assert sample_plan({}, 5) == {}


def test_a_sample_is_fair_and_exact_for_any_sizes() -> None:
    rng = random.Random(7)
    for _ in range(200):
        available = {}
        for p in range(rng.randint(1, 6)):
            low = rng.randint(0, 50)
            available[("t", p)] = (low, low + rng.choice([0, 1, 2, rng.randint(0, 80)]))
        n = rng.randint(1, 120)
        plan = sample_plan(available, n)
        sizes = {tp: end - start for tp, (start, end) in plan.items()}
        assert sum(sizes.values()) == min(n, sum(high - low for low, high in available.values()))
        for tp, (start, end) in plan.items():
            assert available[tp][0] <= start < end == available[tp][1]  # the newest, never past the log
        # A partition gets fewer than another only when it has no more to give.
        for tp, (low, high) in available.items():
            if max(sizes.values(), default=0) > sizes.get(tp, 0) + 1:
                assert sizes.get(tp, 0) == high - low


def test_a_file_gives_its_non_blank_lines_as_they_are_with_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "events.ndjson"
    f.write_bytes(b'{"a": 1}\r\n\n   \n{"a": \xff}\nnot json\n{"a": 4}')
    records = previews.from_file(f, "events", 3)
    assert [(r.offset, r.value, r.topic, r.partition) for r in records] == [
        (1, b'{"a": 1}', "events", 0),
        (4, b'{"a": \xff}', "events", 0),
        (5, b"not json", "events", 0),
    ]
    assert [r.offset for r in previews.from_file(f, "events", 100)] == [1, 4, 5, 6]
    with pytest.raises(InvalidInput, match="no such file"):
        previews.from_file(tmp_path / "missing.ndjson", "events", 3)


def test_a_pipeline_that_reads_a_table_is_refused_in_one_line() -> None:
    derived = load_pipeline(ROOT / "pipelines" / "github_pushes.yaml")
    with pytest.raises(InvalidInput, match="reads a table, not Kafka: preview the pipeline that writes it"):
        previews.records(derived, 20)


def test_a_continuous_branch_is_refused_in_one_line() -> None:
    branch = load_pipeline(ROOT / "pipelines" / "payments_fraud.yaml")
    with pytest.raises(InvalidInput, match="is a continuous branch: its verdicts go to a topic, not a table"):
        previews.records(branch, 20)


def test_each_rule_says_what_the_stream_would_do() -> None:
    assert RuleOutcome("r", "warn", 10, 0).effect() == "passes"
    assert RuleOutcome("r", "warn", 10, 2).effect() == "2 record(s) written and counted as warned"
    assert RuleOutcome("r", "drop", 10, 3).effect() == "3 record(s) go to the quarantine"
    assert RuleOutcome("r", "fail", 10, 1).effect().startswith("the stream would stop at this batch, writing nothing")


SHOWN = Preview(
    "p_events",
    "events (the newest 3 records)",
    3,
    rows=[
        {"_kafka_topic": "events", "_kafka_partition": 0, "_kafka_offset": 7, "_ingested_at": "x", "amount": "12.50"},
        {"_kafka_topic": "events", "_kafka_partition": 1, "_kafka_offset": 2, "_ingested_at": "x", "amount": None},
    ],
    quarantined=[
        {
            "_kafka_topic": "events",
            "_kafka_partition": 0,
            "_kafka_offset": 8,
            "reason": "malformed JSON",
            "raw_text": "{",
        }
    ],
    rescued={"device.extra": 1},
    rules=[RuleOutcome("amount_positive", "drop", 2, 0)],
    columns=["amount", "_kafka_topic", "_kafka_partition", "_kafka_offset", "_ingested_at"],
)


def test_the_terminal_shows_rows_reasons_rescued_paths_and_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "120")
    spec = str(make_pipeline(tmp_path, "events").spec_path)
    # The Spark side stands in with a fixed report: this checks the words, not the pipeline.
    # The command imports sluice.ops.preview when it runs, so patching the module is enough.
    monkeypatch.setattr(previews, "preview", lambda *_: SHOWN)
    monkeypatch.setattr(sys, "argv", ["sluice", "preview", spec, "-n", "3"])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    out = capsys.readouterr().out
    assert ended.value.code in (0, None), out
    assert "p_events: 3 records from events (the newest 3 records); nothing committed, nothing written" in out
    assert "3 in = 2 out (2 rows) + 1 quarantined" in out
    assert "0:7" in out and "1:2" in out and "12.50" in out and "null" in out
    assert "_ingested_at" not in out and "_kafka_topic" not in out  # coordinates head the columns instead
    assert "malformed JSON" in out and "0:8" in out
    assert "kept in _rescued: device.extra (1)" in out
    assert "amount_positive" in out and "0 of 2" in out and "passes" in out
