"""What ``sluice preview`` shows: a sample of records, and what the pipeline would make of them.

The sample is read from the topic (committing nothing) or from a file; the Spark side
(``jobs/preview.py``) runs the pipeline's own parse, rules and flattening over it and writes
nothing. Per batch, ``records in = records out + quarantined``, as in the audit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sampled:
    """One Kafka record as the stream would read it (``timestamp_ms``: the record's timestamp)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@dataclass
class RuleOutcome:
    """A row rule over the sample: how many parsed records it checked, how many failed it."""

    name: str
    action: str
    checked: int
    failed: int

    def effect(self) -> str:
        """What the stream would do about the failures, in the user's words."""
        if not self.failed:
            return "passes"
        if self.action == "drop":
            return f"{self.failed} record(s) go to the quarantine"
        if self.action == "fail":
            return f"the stream would stop at this batch, writing nothing: {self.failed} record(s) fail it"
        return f"{self.failed} record(s) written and counted as warned"


@dataclass
class Preview:
    pipeline: str
    source: str  # where the sample came from, e.g. "payments (the newest 20 records)"
    records_in: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # the table's rows, values as JSON text
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # coordinates, reason, raw_text
    rescued: dict[str, int] = field(default_factory=dict)  # path -> records
    rules: list[RuleOutcome] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)  # the rows' columns, in the table's order
    notes: list[str] = field(default_factory=list)

    @property
    def records_out(self) -> int:
        """Records written to the table (a record with an exploded array makes several rows)."""
        return self.records_in - len(self.quarantined)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"records_out": self.records_out}
