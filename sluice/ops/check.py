"""Check specs: does each one validate, and does it still fit the tables it already wrote?"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sluice.spec import Pipeline, SpecError, compatibility, load_all

Tables = Literal["match", "mismatch", "not local", "unreadable", "none yet", "kafka"]


@dataclass(frozen=True)
class SpecCheck:
    file: str
    pipeline: Pipeline | None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (field, message); empty when valid
    tables: Tables | None = None  # None when the spec is invalid
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.pipeline is not None

    def as_dict(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "file": self.file,
            "pipeline": p.name if p else None,
            "valid": self.valid,
            "problems": [{"field": f, "message": m} for f, m in self.problems],
            "columns": [{"name": c.name, "from": c.source, "type": c.type.sql()} for c in p.plan.columns] if p else [],
            "tables": self.tables,
            "detail": self.detail,
        }


def _tables(p: Pipeline) -> tuple[Tables, str]:
    if p.spec.sink.format == "kafka":
        return "kafka", f"writes {p.sink_path}"
    if not (compatibility.is_local(p.sink_path) and compatibility.is_local(p.quarantine_path)):
        return "not local", "the tables are not on this machine; the job compares them when it starts"
    try:
        compatibility.check(p, compatibility.read_local)
    except compatibility.IncompatibleTable as exc:
        return "mismatch", str(exc)
    except Exception as exc:  # a reader's own errors (delta-rs, a damaged log): report and go on
        return "unreadable", f"could not read its tables to compare them: {exc}"
    exists = Path(p.sink_path).exists() or Path(p.quarantine_path).exists()
    return ("match", "matches its tables") if exists else ("none yet", "no table written yet")


def check(paths: list[Path] | None = None) -> list[SpecCheck]:
    """Every spec (or those given), each with all its problems or the state of its tables."""
    results = []
    for path, loaded in load_all(paths):
        if isinstance(loaded, SpecError):
            results.append(SpecCheck(str(path), None, loaded.problems))
        else:
            tables, detail = _tables(loaded)
            results.append(SpecCheck(str(loaded.spec_path), loaded, [], tables, detail))
    return results
