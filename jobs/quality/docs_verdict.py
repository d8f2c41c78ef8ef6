"""Sluice's verdict on Great Expectations' validation pages: a failed warning reads as one.

GX draws every failed expectation with the same red cross, whatever its severity, and its
pages have no place for the severity (the suite-level ``meta_properties`` columns of its
docs fail to render in GX 1.24: the renderer puts them into the expectation's arguments,
which the expectation then refuses). So once GX has written a validation page,
:func:`mark_warnings` finds the row of each failed warning and gives it a yellow mark and
the word "warning": the page then says what ``sluice validate`` and the Airflow task say.

A row is found by where GX puts it: one section per column, headed by the column's name
(``Table-Level Expectations`` for the rest), its rows in the order of the results. This is
GX's layout, not its API; ``tests/unit/test_docs_verdict.py`` renders a page with GX itself
and fails when that layout changes.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

TABLE_LEVEL = "Table-Level Expectations"
_SECTION = re.compile(r'<div id="section-\d+"[^>]*>')
_HEADING = re.compile(r"<h\d[^>]*>\s*(.*?)\s*</h\d>", re.S)
#: A row's status: passed, failed, or raised an error (GX's own triangle).
_STATUS = re.compile(
    r'<i class="fas (?:fa-check-circle text-success|fa-times text-danger|fa-exclamation-triangle text-warning)"\s*></i>'
)
WARNING_MARK = (
    '<i class="fas fa-exclamation-circle text-warning" title="failed: a warning, which does not fail the validation">'
    "</i> warning"
)


def _section_of(result: Any) -> str:
    kwargs = result.expectation_config.kwargs if result.expectation_config else {}
    return str(kwargs["column"]) if "column" in kwargs else TABLE_LEVEL


def _raised(result: Any) -> bool:
    info = result.exception_info or {}
    if "raised_exception" in info:
        return bool(info["raised_exception"])
    return any(isinstance(v, dict) and v.get("raised_exception") for v in info.values())  # one per metric


def severity(config: Any) -> str:
    """An expectation's severity as a word ("critical", "warning", "info"): GX gives an enum."""
    return getattr(config.severity, "value", str(config.severity))


def is_failed_warning(result: Any) -> bool:
    """A warning that failed on the data; one that raised an error keeps GX's own triangle."""
    if result.expectation_config is None or _raised(result):
        return False
    return not result.success and severity(result.expectation_config) == "warning"


def mark_warnings(page: Path, results: list[Any]) -> int:
    """Mark the failed warnings of ``results`` (one validation's, in order) on its page; how
    many were marked. A page laid out otherwise than expected is left as GX wrote it."""
    text = page.read_text(encoding="utf-8")
    wanted: dict[str, list[bool]] = {}
    for r in results:
        wanted.setdefault(_section_of(r), []).append(is_failed_warning(r))
    if not any(any(flags) for flags in wanted.values()):
        return 0
    starts = [m.start() for m in _SECTION.finditer(text)] + [len(text)]
    pieces, marked, seen = [text[: starts[0]]], 0, set()
    for begin, end in itertools.pairwise(starts):
        section = text[begin:end]
        heading = _HEADING.search(section)
        # GX writes a column's name into its heading as it is (a name it would change, such as
        # one with "$", finds no section here, and the page stays as GX wrote it).
        name = heading.group(1) if heading else None
        if name in wanted:
            statuses = list(_STATUS.finditer(section))
            if len(statuses) != len(wanted[name]):
                return 0  # not the layout this reads: leave GX's page as it is
            seen.add(name)
            for status, flag in reversed(list(zip(statuses, wanted[name], strict=True))):
                if flag and "fa-times" in status.group(0):  # one that raised keeps GX's triangle
                    section = section[: status.start()] + WARNING_MARK + section[status.end() :]
                    marked += 1
        pieces.append(section)
    if seen != set(wanted):
        return 0
    page.write_text("".join(pieces), encoding="utf-8")
    return marked
