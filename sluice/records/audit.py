"""The batch audit: one JSON file per committed batch, the count that must reconcile.

The job writes one per batch next to its checkpoint (``<checkpoint>/sluice_audit/``, a
backfill's beside its own checkpoint); ``sluice audit``, publishing and the tests read them.
Every batch reconciles on its own: records in = records out + records quarantined (+ for a
derived pipeline, rows late + rows filtered; its records out are the rows accepted).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from sluice.records.run import known_fields
from sluice.spec import Pipeline
from sluice.storage import Location


@dataclass
class BatchAudit:
    pipeline: str
    batch_id: int
    records_in: int
    records_out: int
    records_quarantined: int
    rows_out: int  # differs from records_out only when arrays are exploded
    records_already_present: int = 0  # backfills only: in the range, but already in a table (not counted in)
    offsets: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # topic -> partition -> [first, last]
    expectations: dict[str, dict[str, Any]] = field(default_factory=dict)  # rule -> action, checked, failed
    # Derived pipelines: rows behind the watermark (quarantined), rows the spec's filter left
    # out, and the watermark (epoch ms) late rows were judged by.
    records_late: int = 0
    records_filtered: int = 0
    watermark_ms: int = 0
    # Records written with fields the schema does not declare (or rescued mismatches), and
    # the most common of those fields' paths (indexes removed) with their counts.
    records_rescued: int = 0
    rescued_paths: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    written_at: str = ""

    @property
    def reconciles(self) -> bool:
        return (
            self.records_in == self.records_out + self.records_quarantined + self.records_late + self.records_filtered
        )

    def failed_expectations(self) -> dict[str, dict[str, Any]]:
        return {name: c for name, c in self.expectations.items() if c.get("failed")}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls(**known_fields(cls, json.loads(text)))


def file_name(batch_id: int) -> str:
    return f"{batch_id:012d}.json"


def folders(pipeline: Pipeline) -> list[Location]:
    """The stream's audit folder and each backfill's (local or on S3)."""
    backfills = Location(pipeline.checkpoint_path.rstrip("/") + "_backfills").children()
    return [Location(pipeline.audit_path), *(b / "sluice_audit" for b in backfills)]


def audit_files(folder_list: Iterable[Location | Path | str], newer_than: float = 0.0) -> Iterator[Location]:
    """Each batch's audit file in these folders, oldest batch first (only those changed after ``newer_than``)."""
    for folder in folder_list:
        files = [f for f in Location(str(folder)).children() if f.name.endswith(".json")]
        yield from (f for f in files if not newer_than or f.mtime() > newer_than)


def read(path: Location | Path) -> BatchAudit:
    return BatchAudit.from_json(path.read_text())


@dataclass(frozen=True)
class Rescued:
    """Records written with fields the schema does not declare, over recent batches."""

    batches: int
    records: int
    paths: dict[str, int]  # the most common first

    def warning(self, pipeline: str) -> str:
        top = ", ".join(f"{p} ({n})" for p, n in list(self.paths.items())[:5])
        return (
            f"{pipeline}: {self.records} records of the last {self.batches} batches have fields the schema does "
            f"not declare, kept in _rescued: {top}. `sluice schema suggest {pipeline}` drafts the next version."
        )


def rescued(pipeline: Pipeline, last: int = 50) -> Rescued | None:
    """What the stream's last ``last`` batches rescued; None when they rescued nothing."""
    batches = [read(f) for f in list(audit_files([pipeline.audit_path]))[-last:]]
    paths: dict[str, int] = {}
    for b in batches:
        for path, n in b.rescued_paths.items():
            paths[path] = paths.get(path, 0) + n
    records = sum(b.records_rescued for b in batches)
    if not records:
        return None
    ordered = dict(sorted(paths.items(), key=lambda kv: (-kv[1], kv[0])))
    return Rescued(len(batches), records, ordered)


@dataclass
class Totals:
    batches: int = 0
    records_in: int = 0
    records_out: int = 0
    rows_out: int = 0
    records_quarantined: int = 0
    records_late: int = 0
    records_filtered: int = 0
    records_rescued: int = 0

    def add(self, a: BatchAudit) -> None:
        self.batches += 1
        self.records_in += a.records_in
        self.records_out += a.records_out
        self.rows_out += a.rows_out
        self.records_quarantined += a.records_quarantined
        self.records_late += a.records_late
        self.records_filtered += a.records_filtered
        self.records_rescued += a.records_rescued

    def as_dict(self) -> dict[str, int]:
        """The counts; late, filtered and rescued records only where there are some."""
        counts = asdict(self)
        return {
            k: v for k, v in counts.items() if v or k not in ("records_late", "records_filtered", "records_rescued")
        }
