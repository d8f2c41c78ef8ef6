"""Plan a backfill: turn a user's range (offsets or times) into exact offset ranges.

The range is resolved against the broker before the job starts, so the job reads a
fixed set of offsets: ``[from, to)`` on every partition of the pipeline's topics, clipped
to what the broker still holds. Times are matched to offsets with Kafka's own index
(record CreateTime / LogAppendTime). The id is derived from the resolved ranges, so the
same backfill gets the same checkpoint when it is retried.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass

from sluice.spec import Pipeline
from sluice.topics import offsets_for_time, watermarks

Ranges = dict[str, dict[int, tuple[int, int]]]


class BackfillError(ValueError):
    pass


@dataclass(frozen=True)
class BackfillPlan:
    id: str
    ranges: Ranges
    description: str

    @property
    def size(self) -> int:
        return sum(end - first for parts in self.ranges.values() for first, end in parts.values())

    def range_json(self) -> str:
        return json.dumps({t: {str(p): list(r) for p, r in parts.items()} for t, parts in self.ranges.items()})


def _epoch_ms(value: str | dt.datetime) -> int:
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def plan(
    pipeline: Pipeline,
    *,
    from_offset: int | None = None,
    to_offset: int | None = None,
    from_time: str | None = None,
    to_time: str | None = None,
) -> BackfillPlan:
    """Resolve ``[from, to)`` (offsets on every partition, or ISO-8601 times) to offset ranges."""
    by_offsets = from_offset is not None or to_offset is not None
    by_time = bool(from_time or to_time)
    if by_offsets == by_time:
        raise BackfillError("give a range of offsets (from_offset/to_offset) or of times (from_time/to_time), not both")
    topics = list(pipeline.spec.source.topics or [])
    if not topics:
        raise BackfillError("backfill needs the spec to list its topics (source.topics), not a topic_pattern")
    bootstrap = pipeline.spec.source.bootstrap_servers
    try:
        t0 = _epoch_ms(from_time) if from_time else None
        t1 = _epoch_ms(to_time) if to_time else None
    except ValueError as exc:
        raise BackfillError(f"not an ISO-8601 time: {exc}") from None
    if (t0 is not None and t1 is not None and t1 <= t0) or (
        from_offset is not None and to_offset is not None and to_offset <= from_offset
    ):
        raise BackfillError("the range is empty: 'to' must be after 'from' (from is included, to is not)")

    ranges: Ranges = {}
    for topic in topics:
        marks = watermarks(bootstrap, topic)
        starts = offsets_for_time(bootstrap, topic, t0) if t0 is not None else {}
        ends = offsets_for_time(bootstrap, topic, t1) if t1 is not None else {}
        parts = {}
        for p, (low, high) in sorted(marks.items()):
            if by_offsets:
                first, end = from_offset or 0, high if to_offset is None else to_offset
            else:
                # No record at or after a time: the range starts (or ends) at the log's end.
                first = low if t0 is None else _or(starts.get(p), high)
                end = high if t1 is None else _or(ends.get(p), high)
            first, end = max(first, low), min(end, high)
            parts[p] = (first, max(first, end))
        ranges[topic] = parts
    if by_offsets:
        desc = f"offsets [{from_offset or 0}, {'end' if to_offset is None else to_offset})"
    else:
        desc = f"times [{from_time or 'start'}, {to_time or 'now'})"
    digest = hashlib.sha256(json.dumps(sorted((t, sorted(r.items())) for t, r in ranges.items())).encode()).hexdigest()
    return BackfillPlan(f"{'offsets' if by_offsets else 'times'}-{digest[:10]}", ranges, desc)
