"""The sluice command as a user types it, against the test session's broker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.fixtures import new_topic

pytestmark = pytest.mark.e2e

SLUICE = [sys.executable, "-m", "sluice.cli"]


def sluice(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"COLUMNS": "80"} | (env or {}),  # a terminal as it comes
    )


def test_help_on_every_command() -> None:
    for cmd in (
        ["--help"],
        ["kafka", "--help"],
        ["topics", "create", "--help"],
        ["produce", "--help"],
        ["replay", "--help"],
        ["run", "--help"],
        ["sql", "--help"],
        ["demo", "--help"],
        ["audit", "--help"],
        ["validate", "--help"],
        ["preview", "--help"],
    ):
        result = sluice(*cmd)
        assert result.returncode == 0 and "Usage" in result.stdout, (cmd, result.stderr)


def test_check_validates_shipped_specs_and_reports_a_bad_one(tmp_path) -> None:
    ok = sluice("check")
    shipped = len(list((ROOT / "pipelines").glob("*.yaml")))
    assert ok.returncode == 0 and f"{shipped} spec(s) valid" in ok.stdout
    assert "device_location_lat" in ok.stdout
    bad = tmp_path / "bad.yaml"
    spec = yaml.safe_load((ROOT / "pipelines/device_signals.yaml").read_text())
    spec["schema"] = str(ROOT / "schemas/device_signal/v1.json")
    spec["sink"]["format"] = "csv"
    bad.write_text(yaml.safe_dump(spec))
    result = sluice("check", str(bad))
    assert result.returncode == 2
    assert f"{bad}: sink.format:" in " ".join(result.stderr.split())

    # One bad spec among good ones: every spec is reported, and every problem of the bad one.
    folder = tmp_path / "pipelines"
    folder.mkdir()
    for shipped_spec in ("device_signals", "payments"):
        text = (ROOT / "pipelines" / f"{shipped_spec}.yaml").read_text()
        (folder / f"{shipped_spec}.yaml").write_text(text)
    spec["name"], spec["checkpoint"] = "Bad Name", ""
    (folder / "bad.yaml").write_text(yaml.safe_dump(spec))
    every = sluice("check", "--json", env={"SLUICE_PIPELINES": str(folder), "SLUICE_SCHEMAS": str(ROOT / "schemas")})
    assert every.returncode == 2, every.stderr
    report = json.loads(every.stdout)
    assert [s["valid"] for s in report["specs"]] == [False, True, True] and report["invalid"] == 1
    assert [p["field"] for p in report["specs"][0]["problems"]] == ["name", "sink.format", "checkpoint"]


def test_status_without_a_broker_is_one_line_and_shows_the_local_state(tmp_path) -> None:
    result = sluice(
        "status", "device_signals", env={"SLUICE_KAFKA_BOOTSTRAP": "127.0.0.1:9", "SLUICE_HOME": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    assert "never started here" in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "did not answer" in result.stderr and "sluice kafka up" in result.stderr


def test_produce_run_audit_and_sql_from_the_command_line(broker, tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=2)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    spec = yaml.safe_load((ROOT / "pipelines/device_signals.yaml").read_text())
    spec.update(
        name="cli_signals",
        schema=str(ROOT / "schemas/device_signal/v1.json"),
        sink={"format": "delta", "path": str(tmp_path / "t")},
        checkpoint=str(tmp_path / "c"),
        allow_external_paths=True,
    )
    spec["source"]["topics"] = [topic]
    (pipelines / "cli_signals.yaml").write_text(yaml.safe_dump(spec))
    # Beside it, every shipped spec (continuous branches write Kafka topics, not tables), one
    # that does not validate, and one whose table cannot be read: queries must still run.
    for shipped in (ROOT / "pipelines").glob("*.yaml"):
        shutil.copy(shipped, pipelines / shipped.name)
    (pipelines / "broken.yaml").write_text("name: broken\nsink: {format: csv}\n")
    broken_log = tmp_path / "garbled" / "_delta_log"
    broken_log.mkdir(parents=True)
    (broken_log / "00000000000000000000.json").write_text("not a delta log\n")
    garbled = spec | {"name": "garbled", "sink": {"format": "delta", "path": str(tmp_path / "garbled")}}
    (pipelines / "garbled.yaml").write_text(yaml.safe_dump(garbled | {"checkpoint": str(tmp_path / "g")}))
    env = {"SLUICE_PIPELINES": str(pipelines)}

    status = sluice("kafka", "status")
    assert status.returncode == 0 and "running" in status.stdout

    produced = sluice("produce", "cli_signals", "--count", "300", "--bad-fraction", "0.1", "--seed", "5", env=env)
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert "sent 300 records" in produced.stdout

    # A preview of the newest records before the stream runs: counts that reconcile, nothing written.
    shown = sluice("preview", "cli_signals", "-n", "40", "--json", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr[-3000:]
    preview = json.loads(shown.stdout)
    assert preview["records_in"] == 40 == preview["records_out"] + len(preview["quarantined"])
    assert all(q["reason"] for q in preview["quarantined"]) and preview["rows"][0]["date"]
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()
    refused = sluice("preview", "broken", env=env)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    ran = sluice("run", "cli_signals", "--available-now", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert "cli_signals: stopped cleanly" in ran.stdout + ran.stderr

    audit = sluice("audit", "cli_signals", env=env)
    assert audit.returncode == 0 and "300" in audit.stdout

    counted = sluice(
        "sql",
        "SELECT count(*) AS n, count(DISTINCT _kafka_offset, _kafka_partition) AS d,"
        " (SELECT count(*) FROM cli_signals_quarantine) AS q FROM cli_signals",
        env=env,
    )
    assert counted.returncode == 0, counted.stdout + counted.stderr[-2000:]
    warnings = [line for line in counted.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, counted.stderr
    assert "skipping a spec: " in warnings[0] and "broken.yaml" in warnings[0]
    assert warnings[1].startswith("warning: garbled: cannot register the delta table at")
    assert "Traceback" not in counted.stdout + counted.stderr
    rows_out, distinct, quarantined = (int(cell.strip()) for cell in counted.stdout.split("│")[-4:-1])
    assert rows_out == distinct and rows_out + quarantined == 300
    assert quarantined > 0

    wrong = sluice("sql", "SELECT nope FROM cli_signals", env=env)
    assert wrong.returncode == 2 and "tables in sluice: cli_signals, cli_signals_quarantine" in wrong.stderr
