"""Read a streaming checkpoint without Spark: what the query has committed, and when.

Spark's Kafka source never commits offsets to Kafka, so the checkpoint is the only record
of how far a pipeline got. Supervision compares it with the broker's end offsets to
measure lag, and uses the commit log's times to see whether the query still makes progress.
Works wherever :mod:`sluice.storage` reaches: the local disk (the embedded default) and S3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sluice.records import parquet_log
from sluice.storage import Location


@dataclass(frozen=True)
class Committed:
    """The newest batch in the commit log and the source offsets it ended at."""

    batch_id: int | None = None
    #: topic -> partition -> next offset to read (exclusive end of what is committed)
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    committed_at: float | None = None  # the commit file's modification time (epoch seconds)

    def lag(self, end_offsets: dict[str, dict[int, int]]) -> int:
        """Records in Kafka that no committed batch has read yet."""
        total = 0
        for topic, ends in end_offsets.items():
            done = self.offsets.get(topic, {})
            total += sum(max(0, end - done.get(p, 0)) for p, end in ends.items())
        return total


def parse_offsets(text: str) -> dict[str, dict[int, int]]:
    """The Kafka end offsets in an ``offsets/<n>`` file: a version line, the batch's metadata,
    then one JSON line per source (topic -> partition -> next offset)."""
    offsets: dict[str, dict[int, int]] = {}
    for line in text.splitlines()[2:]:
        if line.startswith("{"):
            for topic, parts in json.loads(line).items():
                if isinstance(parts, dict):  # a table source's line is its own (version, index)
                    offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
    return offsets


def batch_watermark_ms(text: str) -> int:
    """The event-time watermark (epoch ms) Spark recorded for a batch in its ``offsets/<n>``
    file, before running it; 0 when there is none yet.

    Spark's offset log format (a version line, then the batch's metadata as JSON) has been
    the same since Spark 2.1; tests/unit/test_derived_spec.py::test_offset_log_watermark reads an entry of
    it."""
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"not a Spark offset log entry (first line {lines[0] if lines else ''!r})")
    return int(json.loads(lines[1]).get("batchWatermarkMs", 0))


def last_batch(names: list[str]) -> int | None:
    """The newest batch id among the file names of ``commits/`` (or ``offsets/``)."""
    return max((int(n) for n in names if n.isdigit()), default=None)


def pending_batch(offsets: list[str], commits: list[str]) -> int | None:
    """The batch planned in ``offsets/`` but absent from ``commits/``: a restart replays it."""
    planned, done = last_batch(offsets), last_batch(commits)
    if planned is None or (done is not None and done >= planned):
        return None
    return planned


#: Beside ``offsets/`` and ``commits/``: the split (see ``Pipeline.split``) of the last start.
SPLIT_FILE = "sluice_split.json"
#: Beside it: the whole spec and schema of that start (``sluice.spec.loader.recorded``), to
#: replay a batch a crash interrupted under the spec it was planned with.
SPEC_FILE = "sluice_spec.json"
#: Beside it: the newest batch that began writing to a table. A planned batch newer than
#: it wrote nothing (it failed a ``fail`` rule, or declined after a stop request), so it
#: may run under a changed split.
WRITING_FILE = "sluice_writing"


def split_changes(planned: dict[str, object], now: dict[str, object]) -> list[str]:
    """The parts of the split that differ between when a batch was planned and now."""
    return sorted(k for k in planned.keys() | now.keys() if planned.get(k) != now.get(k))


def read_committed(checkpoint: str) -> Committed:
    """The last committed batch of a checkpoint (an empty result if none has committed)."""
    root = Location(checkpoint)
    last = _last_commit(root)
    if last is None:
        return Committed()
    offsets = parse_offsets((root / "offsets" / str(last)).read_text())
    return Committed(last, offsets, (root / "commits" / str(last)).mtime())


def _last_commit(root: Location) -> int | None:
    return last_batch([p.name for p in (root / "commits").children()])


def committed_offset(root: Location) -> dict[str, object] | None:
    """A table source's offset at the end of the last committed batch (the third line of its ``offsets/<n>``)."""
    last = _last_commit(root)
    if last is None:
        return None
    lines = (root / "offsets" / str(last)).read_text().splitlines()[2:]
    return json.loads(lines[0]) if lines and lines[0].startswith("{") else None


def files_seen(root: Location) -> set[str]:
    """The files a file source (over a Parquet table's log) has listed, by place (:func:`parquet_log.place`)."""
    seen: set[str] = set()
    for entry in (root / "sources" / "0").children():
        for line in entry.read_text().splitlines()[1:]:
            if line.startswith("{"):
                seen.add(parquet_log.place(json.loads(line)["path"]))
    return seen
