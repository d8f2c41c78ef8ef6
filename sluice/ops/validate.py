"""Validate a written table with Great Expectations, and pick its date partitions."""

from __future__ import annotations

from sluice.errors import InvalidInput, JobFailed
from sluice.ops.submit import validation_submission
from sluice.ops.target import SparkTarget
from sluice.records.validation import Report, Selection, new_report_path, read_report
from sluice.spec import Pipeline


def selection(
    pipeline: Pipeline,
    *,
    dates: str | None = None,
    from_date: str | None = None,
    to_date: str | None = None,
    latest: int | None = None,
) -> Selection:
    """The partitions to validate from either front end: ``dates`` as the CLI takes it
    (``2026-11-20``, ``2026-11-18..2026-11-20``), or a form's from/to dates (one of them
    alone is that one day), or the newest ``latest`` partitions (the spec's default)."""
    if dates and (from_date or to_date):
        raise InvalidInput("give dates as one range or as from/to, not both")
    if (dates or from_date or to_date) and latest is not None:
        raise InvalidInput("give dates or a number of newest partitions, not both")
    if from_date or to_date:
        dates = f"{from_date or to_date}..{to_date or from_date}"
    if dates:
        return Selection.parse(dates)
    return Selection(latest=latest or pipeline.spec.expectations.validation.partitions)


def validate(pipeline: Pipeline, target: SparkTarget, chosen: Selection) -> Report:
    """Run the validation job on the target and return its report (which may have failed)."""
    report_path = new_report_path(pipeline.name)
    target.run(
        validation_submission(pipeline.spec_path, pipeline_name=pipeline.name, dates=str(chosen), report=report_path)
    )
    try:
        return read_report(report_path)
    except FileNotFoundError:
        raise JobFailed(f"the {pipeline.name} validation job ended without writing {report_path}") from None
