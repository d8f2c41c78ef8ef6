"""The CLI translates Sluice's errors: one line on stderr, exit 2 for invalid input, 1 for a
failure, 0 when there is nothing to do; no traceback. In-process, no JVM, no broker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import sluice
from sluice import cli
from tests.fixtures import make_pipeline


def run(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["sluice", *args])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    return int(ended.value.code or 0)


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "300")
    return str(make_pipeline(tmp_path, "events").spec_path)


def test_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(monkeypatch, "--version") == 0
    assert capsys.readouterr().out.strip() == f"sluice {sluice.__version__}"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["backfill", "{spec}", "--from-offset", "9", "--to-offset", "3"], 2, "the range is empty"),
        (["backfill", "{spec}", "--from-offset", "1", "--from-time", "2026-01-01T00:00:00Z"], 2, "not both"),
        (["validate", "{spec}", "--date", "someday"], 2, "is not 'latest'"),
        (["status", "no_such_pipeline"], 2, "no_such_pipeline"),
        (["cluster", "down"], 2, "found no cluster layout in"),
    ],
)
def test_errors_are_one_line_on_stderr_with_their_exit_code(
    spec: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    words: str,
) -> None:
    assert run(monkeypatch, *(a.format(spec=spec) for a in args)) == code
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and words in " ".join(err.split()) and "Traceback" not in out + err
    assert out == ""


def test_stopping_what_does_not_run_is_not_an_error(
    spec: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(monkeypatch, "stop", spec) == 0
    assert "is not running; it stays stopped" in capsys.readouterr().out


def test_markup_in_user_text_is_printed_as_it_is(
    spec: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(monkeypatch, "validate", spec, "--date", "[bold]x[/]") == 2
    assert "[bold]x[/]" in capsys.readouterr().err


def test_help_text_is_not_read_as_markup(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    assert run(monkeypatch, "validate", "--help") == 0
    assert "[default: expectations.validation.partitions]" in " ".join(capsys.readouterr().out.split())


def test_a_spec_value_that_looks_like_markup_is_shown_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "300")
    path = make_pipeline(tmp_path, "events").spec_path
    path.write_text(path.read_text().replace("format: epoch_seconds", "format: '[/]'"))
    assert run(monkeypatch, "check", str(path)) == 2
    err = capsys.readouterr().err
    assert "event_time.format: [/] needs" in err and "Traceback" not in err


def test_the_audit_table_fits_80_columns_with_whole_headers() -> None:
    from rich.console import Console

    from sluice.cli.stream import audit_table
    from sluice.records.audit import BatchAudit

    def batch(i: int, **extra: int) -> BatchAudit:
        a = BatchAudit("p", i, 1000, 990, 10, 990, seconds=2.345, written_at="2026-11-26T19:10:42Z")
        for k, v in extra.items():
            setattr(a, k, v)
        return a

    def render(batches: list[BatchAudit]) -> str:
        console = Console(width=80, record=True, color_system=None)
        console.print(audit_table(batches))
        return console.export_text()

    plain = render([batch(0), batch(1)])
    assert all(len(line) <= 80 for line in plain.splitlines())
    for header in ("batch", "in", "out", "quarantined", "seconds", "written at (UTC)"):
        assert header in plain
    assert "…" not in plain and "rescued" not in plain and "rows out" not in plain
    assert "2026-11-26 19:10:42" in plain and "2.3" in plain

    # A column some batches need appears, for every batch; headers wrap rather than being cut.
    backfill = render([batch(0), batch(1, records_already_present=3000, records_in=0, records_out=0, rows_out=0)])
    assert all(len(line) <= 80 for line in backfill.splitlines())
    assert "already" in backfill and "present" in backfill and "3000" in backfill and "…" not in backfill


def test_the_validation_table_fits_80_columns_and_cuts_no_value() -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from sluice.cli.quality import validation_tables
    from sluice.records.validation import Outcome, Partition, Report

    error = (
        "Error: The column 'device_firmware' in BatchData does not exist and the expectation could not be "
        "evaluated on this batch of the table"
    )
    examples = ["dev-0000", "dev-0001", "2026-11-20 23:59:59.999000"]

    def outcome(day: str, rule: str, expectation: str, severity: str, **result: object) -> Outcome:
        return Outcome.model_validate(
            {"partition": day, "rule": rule, "expectation": expectation, "severity": severity} | result
        )

    outcomes = [
        outcome(day, "known_columns", "expect_table_columns_to_match_set", "critical", success=True, observed="9")
        for day in ("2026-11-19", "2026-11-20")
    ] + [
        outcome(
            "2026-11-20",
            "one_row_per_device",
            "expect_column_values_to_be_unique",
            "critical",
            success=False,
            checked=42,
            failed=4,
            examples=examples,
        ),
        outcome(
            "2026-11-20",
            "known_firmware",
            "expect_column_values_to_be_in_set",
            "warning",
            success=False,
            checked=42,
            failed=3,
            examples=["9.9.9"],
        ),
        outcome("2026-11-19", "rows_per_day", "expect_table_row_count_to_be_between", "critical", success=True),
        outcome(
            "2026-11-19", "firmware_set", "expect_column_values_to_be_in_set", "warning", success=False, error=error
        ),
    ]
    report = Report(
        pipeline="dq",
        table="dq",
        suite="sluice.dq",
        selection="2026-11-19..2026-11-20",
        validated_at=datetime(2026, 11, 21, tzinfo=UTC),
        docs="file:///tmp/index.html",
        partitions=[
            Partition(date="2026-11-19", rows=1000, success=True),
            Partition(date="2026-11-20", rows=42, success=False),
        ],
        outcomes=outcomes,
    )
    console = Console(width=80, record=True, color_system=None)
    for table in validation_tables(report):
        console.print(table)
    plain = console.export_text()

    assert all(len(line) <= 80 for line in plain.splitlines()), plain
    assert "…" not in plain, plain
    for header in ("expectation", "result", "failed", "evidence"):
        assert any(header in line.split() for line in plain.splitlines()), header
    assert "sluice.dq: 2026-11-19 (1000 rows)" in plain and "sluice.dq: 2026-11-20 (42 rows)" in plain
    assert "FAIL" in plain and "warning" in plain and "4 of 42" in plain and "3 of 42" in plain
    assert "partition" not in plain  # the title names it
    for name in ("one_row_per_device", "known_firmware", "column_values_to_be_unique", "table_row_count_to_be_between"):
        assert name in plain
    # The evidence wraps: the last column's lines, put back together, hold every value whole.
    evidence = "".join(line.split("│")[-2] for line in plain.splitlines() if line.count("│") == 5)
    evidence = "".join(evidence.split())
    for text in [*examples, "9.9.9", error]:
        assert "".join(text.split()) in evidence, text
