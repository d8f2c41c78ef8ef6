"""Backfill: turn a user's range (offsets or times) into an exact plan, and run it.

The range is resolved against the broker before the job starts, so the job reads a
fixed set of offsets: ``[from, to)`` on every partition of the pipeline's topics, clipped
to what the broker still holds. Times are matched to offsets with Kafka's own index
(record CreateTime / LogAppendTime). The id is derived from the resolved ranges, so the
same backfill gets the same checkpoint when it is retried.

**The rule that keeps every record in exactly one table:** a backfill re-reads only
offsets the live stream has already committed (the end offsets of the last batch in its
checkpoint's commit log). Anything later is the stream's to read, now or when it next
starts, so a backfill refuses it (:func:`clip`) instead of writing records the stream would
write again. What it may re-read, it checks against both tables record by record (the job
drops what they hold), so re-reading what the stream wrote, or retrying a backfill, adds
nothing twice. A backfill is for what the stream passed but the tables lack: history from
before a stream that started at ``latest``, or records removed from a table.
"""

from __future__ import annotations

import datetime as dt

from sluice import storage
from sluice.errors import InvalidInput, NothingToDo
from sluice.ops.submit import ingest_submission
from sluice.ops.target import SparkTarget
from sluice.records.backfill import BackfillPlan, Ranges, clip, plan_id, refused_all, size
from sluice.records.checkpoint import read_committed
from sluice.spec import Pipeline
from sluice.topics import offsets_for_time, watermarks


class BackfillError(InvalidInput):
    """The range asked for is not a range."""


class NothingToBackfill(NothingToDo):
    """The range is valid but covers no record a backfill may write."""


def _epoch_ms(value: str | dt.datetime) -> int:
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def committed_offsets(pipeline: Pipeline) -> dict[str, dict[int, int]] | None:
    """The live stream's committed end offsets; None when Sluice cannot read its checkpoint
    without Spark (the job then clips the range itself, reading the checkpoint through Spark)."""
    if not storage.reachable(pipeline.checkpoint_path):
        return None
    return read_committed(pipeline.checkpoint_path).offsets


def plan(
    pipeline: Pipeline,
    *,
    from_offset: int | None = None,
    to_offset: int | None = None,
    from_time: str | None = None,
    to_time: str | None = None,
) -> BackfillPlan:
    """Resolve ``[from, to)`` (offsets on every partition, or ISO-8601 times) to offset ranges
    the live stream has committed. Raises :class:`BackfillError` for a range that is not one,
    :class:`NothingToBackfill` for one that holds nothing a backfill may write."""
    by_offsets = from_offset is not None or to_offset is not None
    by_time = bool(from_time or to_time)
    if by_offsets == by_time:
        raise BackfillError(
            "give one range: offsets (from_offset/to_offset) or times (from_time/to_time), "
            + (
                "not both"
                if by_offsets
                else "none was given (a form sends a number it cannot read, such as -5, as empty)"
            )
        )
    if by_offsets and from_offset is None:  # never read as 0: a form sends -5 as empty
        raise BackfillError(
            "give from_offset, the first offset of the range (a form sends a number it cannot read as empty)"
        )
    if any(o is not None and o < 0 for o in (from_offset, to_offset)):
        raise BackfillError("offsets are 0 or more")
    topics = list(pipeline.kafka.topics or [])
    if not topics:
        raise BackfillError("backfill needs the spec to list its topics (source.topics), not a topic_pattern")
    bootstrap = pipeline.kafka.bootstrap_servers
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
    if not size(ranges):
        raise NothingToBackfill(f"nothing to backfill: Kafka holds no records in {desc}")

    refused: Ranges = {}
    committed = committed_offsets(pipeline)
    if committed is not None:
        ranges, refused = clip(ranges, committed)
        if not size(ranges):
            raise NothingToBackfill(refused_all(pipeline, desc, committed))
    return BackfillPlan(plan_id("offsets" if by_offsets else "times", ranges), ranges, desc, refused)


def run(pipeline: Pipeline, target: SparkTarget, backfill: BackfillPlan) -> None:
    """Run the plan's available-now job on the target and wait; raises JobFailed."""
    target.run(ingest_submission(pipeline.spec_path, pipeline_name=pipeline.name, backfill=backfill))
