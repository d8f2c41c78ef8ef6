"""Check specs: does each one validate, and does it still fit the tables it already wrote?"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sluice import registry, storage
from sluice.records.tables import read_shape
from sluice.spec import Pipeline, SpecError, compatibility, load_all
from sluice.spec.derived import (
    SESSION_END,
    SESSION_EVENTS,
    SESSION_START,
    STATE_FILE,
    WINDOW_END,
    WINDOW_START,
    incompatible_message,
    signature_changes,
)

Tables = Literal["match", "mismatch", "not readable", "unreadable", "none yet", "kafka"]


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
            "columns": [{"name": n, "from": f, "type": t} for n, f, t in columns(p)] if p else [],
            "tables": self.tables,
            "detail": self.detail,
        }


def columns(p: Pipeline) -> list[tuple[str, str, str]]:
    """(name, where it comes from, type) of each column the pipeline writes."""
    if not p.derived:
        return [(c.name, c.source, c.type.sql()) for c in p.plan.columns]
    d = p.derivation
    date = p.spec.date_partition.column
    origin = {name: sql for name, sql in d.aggregate.items()}
    if d.window is not None:
        origin |= {
            WINDOW_START: f"{d.window.type} window over {d.time}",
            WINDOW_END: f"{d.window.type} window over {d.time}",
        }
    if d.state is not None:
        origin |= {SESSION_START: "first event", SESSION_END: "last event", SESSION_EVENTS: "events in the session"}
    origin[date] = f"date of {d.date_source() or 'the write'}"
    out = compatibility.expected(p)[0].columns
    source = {c.name: c.source for c in p.plan.columns} if p.upstream is None else {}
    upstream = f"{p.upstream.name}." if p.upstream is not None else ""
    return [(n, origin.get(n, source.get(n, f"{upstream}{n}")), t or "(Spark's)") for n, t in out.items()]


def _record(p: Pipeline, name: str, *, needs_progress: bool = False) -> str | None:
    """A file Sluice keeps in a checkpoint, or None (not readable here, not there, or, with
    ``needs_progress``, no batch planned yet)."""
    if not storage.reachable(p.checkpoint_path):
        return None
    root = storage.Location(p.checkpoint_path)
    if not (root / name).is_file():
        return None
    if needs_progress and not (root / "offsets").children():
        return None
    return (root / name).read_text()


def _state(p: Pipeline) -> str | None:
    """Why the checkpoint's state cannot carry on under this spec (a local checkpoint), or None."""
    recorded = _record(p, STATE_FILE, needs_progress=True)
    if recorded is None:
        return None
    changed = signature_changes(json.loads(recorded), p.derivation.signature())
    return incompatible_message(p.name, changed, p.checkpoint_path, p.sink_path) if changed else None


def _schema(p: Pipeline) -> str | None:
    """Why the spec's schema cannot follow the one its (local) checkpoint ran with, or None."""
    recorded = _record(p, compatibility.SCHEMA_FILE)
    return None if recorded is None else compatibility.schema_problems(p, recorded)


def _tables(p: Pipeline) -> tuple[Tables, str]:
    if p.table_format is None:
        return "kafka", f"writes {p.sink_path}"
    if p.derived and (problem := _state(p)):
        return "mismatch", problem
    schema = None if p.derived else _schema(p)
    if not (storage.reachable(p.sink_path) and storage.reachable(p.quarantine_path)):
        if schema:
            return "mismatch", schema
        return "not readable", "Sluice cannot read these tables without Spark; the job compares them when it starts"
    try:
        compatibility.check(p, read_shape)
    except compatibility.IncompatibleTable as exc:
        return "mismatch", "\n".join(filter(None, (str(exc), schema)))
    except Exception as exc:  # a reader's own errors (delta-rs, a damaged log): report and go on
        return "unreadable", f"could not read its tables to compare them: {exc}"
    if schema:
        return "mismatch", schema
    exists = any(storage.Location(t).is_dir() for t in (p.sink_path, p.quarantine_path))
    return ("match", "matches its tables") if exists else ("none yet", "no table written yet")


def check(paths: list[Path] | None = None) -> list[SpecCheck]:
    """Every spec (or those given), each with all its problems or the state of its tables."""
    results = []
    for path, loaded in load_all(paths, schemas=registry.schema_file):
        if isinstance(loaded, SpecError):
            results.append(SpecCheck(str(path), None, loaded.problems))
        else:
            tables, detail = _tables(loaded)
            results.append(SpecCheck(str(loaded.spec_path), loaded, [], tables, detail))
    return results
