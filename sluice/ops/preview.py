"""Preview a spec on real records before deploying it: a sample from its topic or a file.

The sample is read without a consumer group or a commit (:func:`sluice.topics.sample`), and
the Spark side runs the pipeline's own stages over it in a local session, writing nothing
(``jobs/preview.py``). The stream's tables, checkpoint and run state are not touched.
"""

from __future__ import annotations

import re
import time
from itertools import islice
from pathlib import Path

from sluice.dev.produce import ndjson_lines
from sluice.errors import InvalidInput, NothingToDo
from sluice.records.preview import Preview, Sampled
from sluice.spec import Pipeline
from sluice.topics import list_topics, sample


def from_file(path: Path, topic: str, n: int) -> list[Sampled]:
    """The first ``n`` non-blank lines of a newline-delimited file, each as it is (as ``sluice
    replay`` would send it); a record's offset is its line number."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    now = int(time.time() * 1000)
    return [Sampled(topic, 0, number, now, None, line) for number, line in islice(ndjson_lines(path), n)]


def records(pipeline: Pipeline, n: int, file: Path | None = None) -> tuple[list[Sampled], str]:
    """The sample, and where it came from in words."""
    if pipeline.spec.reads_table:
        raise InvalidInput(
            f"{pipeline.name} reads a table, not Kafka: preview the pipeline that writes it, or query the "
            "table with sluice sql"
        )
    if pipeline.spec.mode == "continuous":
        raise InvalidInput(
            f"{pipeline.name} is a continuous branch: its verdicts go to a topic, not a table, and sluice "
            "preview shows a table's rows; preview the pipeline that reads its topic"
        )
    src = pipeline.kafka
    if file is not None:
        topic = (src.topics or [src.topic_pattern or "file"])[0]
        lines = from_file(file, topic, n)
        if not lines:
            raise NothingToDo(f"{file} has no records to preview")
        return lines, f"{file} (its first {len(lines)} records; offsets are line numbers)"
    topics = src.topics or sorted(
        t for t in list_topics(src.bootstrap_servers) if re.fullmatch(str(src.topic_pattern), t)
    )
    if not topics:
        raise NothingToDo(f"no topic matches {src.topic_pattern!r} on {src.bootstrap_servers}")
    sampled = sample(src.bootstrap_servers, topics, n, src.options.get("kafka.isolation.level", "read_uncommitted"))
    if not sampled:
        raise NothingToDo(f"{', '.join(topics)} has no records to preview")
    return sampled, f"{', '.join(topics)} (the newest {len(sampled)} records)"


def preview(pipeline: Pipeline, n: int = 20, file: Path | None = None, master: str | None = None) -> Preview:
    """What the pipeline would make of the sample: rows, quarantined records, rescued paths, rules."""
    if n < 1:
        raise InvalidInput("-n: give at least 1 record")
    sampled, source = records(pipeline, n, file)
    from jobs.preview import run  # Spark starts only when there is something to show
    from jobs.session import local_session

    return run(local_session("sluice-preview", master), pipeline, sampled, source)
