"""Which package may import which: the contract stays pure Python that opens no connection."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

#: What the spec package may not import: the adapters that reach hosts, and the engines.
NOT_IN_SPEC = ("sluice.registry", "sluice.ops", "sluice.airflow", "sluice.cli", "jobs", "pyspark", "airflow")
NETWORK = ("socket", "urllib.request", "http.client", "httpx", "requests", "confluent_kafka")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def forbidden(folder: Path, banned: tuple[str, ...]) -> set[str]:
    """Each import of a module of ``folder`` that is, or is inside, one of ``banned``."""
    return {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in imports(path)
        if any(name == b or name.startswith(b + ".") for b in banned)
    }


def test_the_spec_package_imports_no_adapter_engine_or_network_library() -> None:
    assert forbidden(ROOT / "sluice" / "spec", NOT_IN_SPEC + NETWORK) == set()


def test_the_jobs_import_neither_the_launcher_nor_the_front_ends() -> None:
    # What a job needs of Spark's settings is in sluice.runtime, below both sides.
    assert forbidden(ROOT / "jobs", ("sluice.ops", "sluice.airflow", "sluice.cli")) == set()


def test_the_rooms_of_jobs_never_import_an_entry_script() -> None:
    # Entry scripts (what spark-submit runs) sit on top of jobs/ and use the rooms below them.
    entries = sorted(p.stem for p in (ROOT / "jobs").glob("*.py") if p.stem not in ("__init__", "session", "lifecycle"))
    assert "ingest" in entries and "validate" in entries
    for room in ("stream", "tables", "quality", "sql"):
        assert forbidden(ROOT / "jobs" / room, tuple(f"jobs.{e}" for e in entries)) == set()


def test_the_check_sees_an_import_it_forbids(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from sluice import registry\nimport urllib.request\n")
    assert {"sluice.registry", "urllib.request"} <= imports(probe)
