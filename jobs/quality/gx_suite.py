"""The spec's expectations as a Great Expectations 1.x suite: one source of truth.

Every declaration becomes one GX expectation, tagged in ``meta`` with the rule's name so
results map back to the spec:

=========================  ==============================================================
declaration                GX expectation
=========================  ==============================================================
row ``not_null``           ``ExpectColumnValuesToNotBeNull``
row ``in_range``           ``ExpectColumnValuesToBeBetween`` (same bounds and strictness)
row ``matches``            ``ExpectColumnValuesToMatchRegex``
row ``in_set``             ``ExpectColumnValuesToBeInSet``
row ``sql``                ``UnexpectedRowsExpectation`` (rows where the expression is not true)
table ``row_count``        ``ExpectTableRowCountToBeBetween`` (per date-partition batch)
table ``unique``           ``ExpectColumnValuesToBeUnique`` (per date-partition batch)
table ``freshness``        ``ExpectColumnMaxToBeBetween`` on ``_event_time``, from now - bound
table ``no_unexp...``      ``ExpectTableColumnsToMatchSet`` with the spec's columns, exactly
=========================  ==============================================================

Severity: a row rule that stops (``fail``) or removes (``drop``) rows in the stream is
critical on the table, where no such row should remain; a ``warn`` rule is a warning.
Table rules carry their declared severity.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe

from sluice.spec import Pipeline, flatten
from sluice.spec.expectations import RowRule, TableRule
from sluice.spec.model import duration_seconds


def table_columns(pipeline: Pipeline) -> list[str]:
    """The columns the ingest job writes: flattened fields, lineage, times and the date."""
    return [*pipeline.plan.names, *flatten.METADATA_COLUMNS, pipeline.spec.date_partition.column]


def local_naive(moment: datetime) -> datetime:
    return moment.astimezone().replace(tzinfo=None)


def row_expectation(name: str, rule: RowRule) -> Any:
    common: dict[str, Any] = {
        "meta": {"sluice_rule": name, "action": rule.action},
        "severity": "warning" if rule.action == "warn" else "critical",
    }
    if rule.sql is not None:
        # The expression is the spec author's own SQL, as in the stream; nothing else is spliced in.
        return gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=f"SELECT * FROM {{batch}} WHERE NOT coalesce(({rule.sql}), false)",  # noqa: S608
            description=f"{name}: {rule.sql}",
            **common,
        )
    column = rule.column
    assert column is not None  # every kind but sql names one, checked by the model
    if rule.not_null:
        return gxe.ExpectColumnValuesToNotBeNull(column=column, **common)
    if rule.in_range is not None:
        r = rule.in_range
        return gxe.ExpectColumnValuesToBeBetween(
            column=column,
            min_value=r.min,
            max_value=r.max,
            strict_min=r.strict_min,
            strict_max=r.strict_max,
            **common,
        )
    if rule.matches is not None:
        return gxe.ExpectColumnValuesToMatchRegex(column=column, regex=rule.matches, **common)
    assert rule.in_set is not None  # one kind is set, checked by the model
    return gxe.ExpectColumnValuesToBeInSet(column=column, value_set=list(rule.in_set), **common)


def table_expectation(name: str, rule: TableRule, pipeline: Pipeline, now: datetime) -> Any:
    common: dict[str, Any] = {"meta": {"sluice_rule": name}, "severity": rule.severity}
    if rule.row_count is not None:
        return gxe.ExpectTableRowCountToBeBetween(
            min_value=None if rule.row_count.min is None else int(rule.row_count.min),
            max_value=None if rule.row_count.max is None else int(rule.row_count.max),
            strict_min=rule.row_count.strict_min,
            strict_max=rule.row_count.strict_max,
            **common,
        )
    if rule.unique is not None:
        return gxe.ExpectColumnValuesToBeUnique(column=rule.unique, **common)
    if rule.freshness is not None:
        oldest = now.astimezone(UTC) - timedelta(seconds=duration_seconds(rule.freshness))
        # PySpark hands timestamps to Python as naive local times, and GX compares the
        # column's max with this bound in Python: give it the same kind of value.
        return gxe.ExpectColumnMaxToBeBetween(column=flatten.EVENT_TIME, min_value=local_naive(oldest), **common)
    return gxe.ExpectTableColumnsToMatchSet(column_set=table_columns(pipeline), exact_match=True, **common)


def suite(pipeline: Pipeline, now: datetime | None = None) -> gx.ExpectationSuite:
    """The pipeline's expectation suite, named ``sluice.<name>``, in declaration order."""
    e = pipeline.spec.expectations
    now = now or datetime.now(UTC)
    # Given whole, so the suite needs no data context until it is validated.
    return gx.ExpectationSuite(
        name=f"sluice.{pipeline.name}",
        expectations=[
            *(row_expectation(name, row) for name, row in e.rows.items()),
            *(table_expectation(name, table, pipeline, now) for name, table in e.table.items()),
        ],
    )
