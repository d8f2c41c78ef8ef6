"""Validating a written table, the pure half: which date partitions, and the report.

The validation job (``jobs/validate.py``, Spark and Great Expectations) writes a
:class:`Report` as JSON; ``sluice validate`` and the data-quality DAG read it and decide
the same way: a failed critical expectation fails them, a failed warning is reported only.
Nothing here imports pyspark or GX, so the Airflow side reads reports at no cost.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel

from sluice import config
from sluice.errors import InvalidInput
from sluice.storage import Location

_LATEST = re.compile(r"^latest(?::(\d+))?$")


@dataclass(frozen=True)
class Selection:
    """The date partitions to validate: the newest ``latest`` that exist, or every day from
    ``start`` to ``end`` (included), empty days too, so a missing day fails a row-count rule."""

    latest: int | None = None
    start: date | None = None
    end: date | None = None

    def __post_init__(self) -> None:
        if (self.latest is None) == (self.start is None or self.end is None):
            raise InvalidInput("give either a number of newest partitions or a date range")
        if self.latest is not None and self.latest < 1:
            raise InvalidInput(f"latest must be at least 1 (got {self.latest})")
        if self.start and self.end and self.start > self.end:
            raise InvalidInput(f"the range starts on {self.start} after it ends on {self.end}")

    @classmethod
    def parse(cls, text: str) -> Selection:
        """``latest``, ``latest:N``, ``YYYY-MM-DD`` or ``YYYY-MM-DD..YYYY-MM-DD``."""
        text = text.strip()
        if m := _LATEST.match(text):
            return cls(latest=int(m.group(1) or 1))
        first, sep, last = text.partition("..")
        try:
            start = date.fromisoformat(first)
            end = date.fromisoformat(last) if sep else start
        except ValueError:
            raise InvalidInput(
                f"{text!r} is not 'latest', 'latest:N', a date (2026-11-20) or a range (2026-11-18..2026-11-20)"
            ) from None
        return cls(start=start, end=end)

    def days(self) -> list[date]:
        """Every day of a range; empty for ``latest``, which depends on the table."""
        if self.start is None or self.end is None:
            return []
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def __str__(self) -> str:
        if self.latest is not None:
            return f"latest:{self.latest}"
        return f"{self.start}" if self.start == self.end else f"{self.start}..{self.end}"


class Outcome(BaseModel):
    """One expectation on one date partition."""

    partition: str
    rule: str
    expectation: str
    severity: str
    success: bool
    #: Rows the expectation looked at, and how many failed it (column expectations only).
    checked: int | None = None
    failed: int | None = None
    observed: str | None = None
    examples: list[str] = []
    #: Set when GX could not evaluate the expectation (which then counts as failed).
    error: str | None = None

    def detail(self) -> str:
        """The evidence in a few words, for tables and logs."""
        if self.error:
            return f"error: {self.error}"
        parts = []
        if self.failed is not None:
            parts.append(f"{self.failed} of {self.checked} rows failed")
        if self.observed is not None:
            parts.append(f"observed {self.observed}")
        if self.examples:
            parts.append(f"e.g. {', '.join(self.examples)}")
        return "; ".join(parts)


class Partition(BaseModel):
    date: str
    rows: int
    success: bool
    #: The partition's page in the Data Docs.
    docs: str | None = None


class Report(BaseModel):
    pipeline: str
    table: str
    suite: str
    selection: str
    validated_at: datetime
    #: The Data Docs site's index page.
    docs: str
    partitions: list[Partition]
    outcomes: list[Outcome]

    @property
    def critical_failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success and o.severity == "critical"]

    @property
    def warnings(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success and o.severity != "critical"]

    @property
    def passed(self) -> bool:
        return not self.critical_failures

    def page(self) -> str | None:
        """The Data Docs page to open, inside the site: the partition's, or the index for several."""
        page = self.partitions[0].docs if len(self.partitions) == 1 else self.docs
        return site_page(page) if page else None

    def summary(self) -> list[str]:
        """Lines for a log: the verdict, each failed expectation, and where the Data Docs are."""
        dates = ", ".join(f"{p.date} ({p.rows} rows)" for p in self.partitions) or "none"
        verdict = "FAILED" if self.critical_failures else "passed"
        lines = [
            f"{self.pipeline}: validation {verdict}: {len(self.outcomes)} expectations on partitions {dates}; "
            f"{len(self.critical_failures)} critical failed, {len(self.warnings)} "
            f"warning{'' if len(self.warnings) == 1 else 's'}"
        ]
        for label, outcomes in (("CRITICAL", self.critical_failures), ("warning", self.warnings)):
            lines += [f"  {label} {o.rule} on {o.partition} ({o.expectation}): {o.detail()}" for o in outcomes]
        lines.append(f"Data Docs: {self.docs}")
        return lines


def quality_home() -> Path:
    """The Great Expectations stores and Data Docs of every pipeline (one site for all)."""
    return config.sluice_home() / "quality"


def docs_site() -> Path:
    """The Data Docs site GX builds from those stores (its ``local_site``)."""
    return quality_home() / SITE


#: The GX stores a validation reads and adds to; the Data Docs are built from all of them.
STORES = ("expectations", "validations", "checkpoints", "validation_definitions")
#: The Data Docs site inside :func:`quality_home`.
SITE = "uncommitted/data_docs/local_site"


#: Some filesystems keep coarse file times: what a run wrote may look up to this much older.
CLOCK_MARGIN_S = 2.0


def shared_quality() -> Location | None:
    """Where every host finds the quality stores and the Data Docs, on a cluster
    (``SLUICE_STORE`` elsewhere than ``SLUICE_HOME``); None on one machine, where
    :func:`quality_home` is the only copy.

    GX keeps its stores as local files, so a validation takes the store files its host lacks
    from here (:func:`pull_stores`), validates and builds the pages locally, then hands over
    what it wrote (:func:`push_changed`); Airflow's API server serves the pages from here.
    Result files are written once, so hosts add them without conflict; a suite, an index or
    a page two hosts both write is the last writer's."""
    store = config.store()
    if "://" not in store or store.startswith("file://"):
        folder = Path(store.removeprefix("file://")).resolve()
        if folder == config.sluice_home().resolve():
            return None
        return Location(str(folder / "quality"))
    return Location(f"{store}/quality")


def safe_key(rel: str) -> bool:
    """A key that stays inside the folder it is listed under, on every filesystem."""
    return all(p not in ("", ".", "..") for p in rel.split("/")) and not any(c in rel for c in "\\?#")


def pull_stores(shared: Location, local: Path) -> tuple[int, list[str]]:
    """Copy the store files this host lacks, each checked as JSON and written whole: how many,
    and the keys refused (not JSON, or a name that would land outside the store)."""
    pulled, refused = 0, []
    for store in STORES:
        for rel in (shared / store).files():
            target = local / store / rel
            if target.exists():
                continue
            if not safe_key(rel):
                refused.append(f"{store}/{rel}")
                continue
            data = (shared / store / rel).read_bytes()
            try:
                json.loads(data)
            except ValueError:
                refused.append(f"{store}/{rel}")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            part.write_bytes(data)
            os.utime(part, (0, 0))  # taken, not written here: push_changed never hands it back
            part.replace(target)
            pulled += 1
    return pulled, refused


def push_changed(local: Path, shared: Location, since: float) -> int:
    """Copy to the shared copy the stores' and the site's files written since ``since`` (epoch
    seconds), and those it lacks (the site's CSS and JavaScript keep the times of their first
    copy); how many."""
    pushed = 0
    for folder in (*STORES, SITE):
        there = (shared / folder).files()
        for file in sorted((local / folder).rglob("*")):
            if not file.is_file() or file.name.endswith(".part"):
                continue
            rel = file.relative_to(local / folder).as_posix()
            if file.stat().st_mtime >= since - CLOCK_MARGIN_S or rel not in there:
                (shared / folder / rel).write_bytes(file.read_bytes())
                pushed += 1
    return pushed


def site_page(url: str) -> str | None:
    """A Data Docs URL (``file://...``) as a path inside :func:`docs_site`; None when it is elsewhere."""
    path = Path(unquote(urlparse(url).path))
    try:
        return path.relative_to(docs_site()).as_posix()
    except ValueError:
        return None


def new_report_path(pipeline_name: str, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    return quality_home() / "reports" / pipeline_name / f"{stamp}.json"


def read_report(path: str | Path) -> Report:
    return Report.model_validate_json(Path(path).read_text(encoding="utf-8"))
