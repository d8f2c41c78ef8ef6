"""The unit tests' shared fixture: a Sluice home of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never contacted: offsets are injected
    (tmp_path / "jars" / "spark").mkdir(parents=True)
    (tmp_path / "jars" / "spark" / "delta-spark.jar").touch()  # only named on the command line
    monkeypatch.setenv("SLUICE_JARS", str(tmp_path / "jars"))
    yield tmp_path
    for proc in psutil.process_iter(["cmdline"]):  # no fake driver outlives its test
        if any(str(tmp_path) in part for part in proc.info["cmdline"] or []):
            proc.kill()
