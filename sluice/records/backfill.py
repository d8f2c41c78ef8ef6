"""A backfill plan: exact offset ranges, with a JSON round trip.

The plan is made where the request is made (``sluice backfill``, the Airflow form) and
handed to the job as JSON (``jobs/ingest.py --backfill PLAN``); the job reads the same
model back. The id is derived from the ranges, so the same backfill gets the same
checkpoint when it is retried.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from sluice.spec import Pipeline

#: topic -> partition -> [first offset, end offset)
Ranges = dict[str, dict[int, tuple[int, int]]]


def size(ranges: Ranges) -> int:
    return sum(end - first for parts in ranges.values() for first, end in parts.values())


def describe(ranges: Ranges) -> str:
    """``payments[0] 120..500, payments[1] 80..510`` (non-empty ranges only)."""
    return ", ".join(
        f"{t}[{p}] {first}..{end}"
        for t, parts in ranges.items()
        for p, (first, end) in sorted(parts.items())
        if end > first
    )


def clip(ranges: Ranges, committed: dict[str, dict[int, int]]) -> tuple[Ranges, Ranges]:
    """Split ``ranges`` into what the stream has committed (a backfill may re-read it) and
    what it has not (refused: the stream reads it). A partition the stream has not read at
    all is wholly refused; partitions with nothing left are left out."""
    kept: Ranges = {}
    refused: Ranges = {}
    for topic, parts in ranges.items():
        for p, (first, end) in parts.items():
            done = committed.get(topic, {}).get(p, 0)
            stop = max(first, min(end, done))
            if stop > first:  # a partition with nothing left is not read at all
                kept.setdefault(topic, {})[p] = (first, stop)
            if end > stop:
                refused.setdefault(topic, {})[p] = (stop, end)
    return kept, refused


def plan_id(kind: str, ranges: Ranges) -> str:
    digest = hashlib.sha256(json.dumps(sorted((t, sorted(r.items())) for t, r in ranges.items())).encode())
    return f"{kind}-{digest.hexdigest()[:10]}"


def _ranges_json(ranges: Ranges) -> dict[str, dict[str, list[int]]]:
    return {t: {str(p): list(r) for p, r in sorted(parts.items())} for t, parts in ranges.items()}


def _ranges(raw: Any, what: str) -> Ranges:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected {{topic: {{partition: [first, end]}}}}")
    ranges: Ranges = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict):
            raise ValueError(f"{what}: {topic}: expected {{partition: [first, end]}}")
        for p, r in parts.items():
            first, end = int(r[0]), int(r[1])
            if first < 0 or end < first:
                raise ValueError(f"{what} {topic}/{p}: [{first}, {end}) is not a valid offset range")
            ranges.setdefault(str(topic), {})[int(p)] = (first, end)
    return ranges


@dataclass(frozen=True)
class BackfillPlan:
    id: str
    ranges: Ranges
    description: str = ""
    #: What was asked for but refused: offsets the stream has not committed yet.
    refused: Ranges = field(default_factory=dict)

    @property
    def records(self) -> int:
        return size(self.ranges)

    def clip(self, committed: dict[str, dict[int, int]]) -> BackfillPlan:
        """This plan without what the live stream has not committed (added to ``refused``)."""
        kept, refused = clip(self.ranges, committed)
        more = {t: dict(parts) for t, parts in self.refused.items()}
        for t, parts in refused.items():
            for p, (first, end) in parts.items():
                was = more.setdefault(t, {}).get(p, (first, end))
                more[t][p] = (min(first, was[0]), max(end, was[1]))  # adjacent: the stream's part grows
        return BackfillPlan(self.id, kept, self.description, more)

    def refusal(self) -> str | None:
        """What was refused and why, or None."""
        if not size(self.refused):
            return None
        return (
            f"refused {size(self.refused)} records the stream has not committed yet ({describe(self.refused)}): "
            "the stream reads them itself, and a backfill of them would write them twice"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "description": self.description,
                "ranges": _ranges_json(self.ranges),
                "refused": _ranges_json(self.refused),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Self:
        """Raises ValueError on anything but a plan :meth:`to_json` could have written."""
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
                raise ValueError("a backfill plan needs an id")
            return cls(
                raw["id"],
                _ranges(raw.get("ranges"), "ranges"),
                str(raw.get("description", "")),
                _ranges(raw.get("refused") or {}, "refused"),
            )
        except (TypeError, IndexError, KeyError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a backfill plan: {exc}") from None


def refused_all(pipeline: Pipeline, desc: str, committed: dict[str, dict[int, int]]) -> str:
    """Why a backfill has nothing left once the stream's part is refused."""
    if not committed:
        return (
            f"nothing to backfill in {desc}: the {pipeline.name} stream has not committed a batch yet, and it "
            "reads these records itself when it runs. Start the stream; a backfill re-reads only what it has "
            "committed (for example history from before a start at 'latest')"
        )
    return (
        f"nothing to backfill in {desc}: every record in it is at or after the {pipeline.name} stream's last "
        "committed batch, so the stream reads it itself (a backfill would write it twice). A backfill re-reads "
        "only what the stream has committed"
    )
