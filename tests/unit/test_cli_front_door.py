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
