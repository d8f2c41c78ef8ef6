"""Data-quality expectations, declared with the table in its spec: the one source of truth.

Row rules run inside the ingest job, per micro-batch, as Spark SQL over the flattened
columns; the validation job checks the same declarations, and the table rules, on the
written table. Nothing here imports pyspark::

    expectations:
      rows:
        payment_id_present: {column: payment_id, not_null: true, action: fail}
        amount_positive: {column: amount, in_range: {min: 0.01}, action: drop}
        currency_known: {column: currency, in_set: [EUR, USD, GBP]}        # action: warn
        card_id_format: {column: card_id, matches: '^card-[0-9]+$'}
        online_or_domestic: {sql: "channel = 'online' OR card_country = merchant_country"}
      table:
        rows_per_date: {row_count: {min: 1, max: 1000000}}
        one_row_per_payment: {unique: payment_id}
        fresh: {freshness: 2 hours, severity: warning}
        known_columns: {no_unexpected_columns: true}
      validation:                 # when the data-quality DAG runs Great Expectations
        schedule: table_updated   # after new batches land (the table's asset); or a cron, or null
        partitions: 1             # how many of the newest date partitions a scheduled run checks

Row actions, as declarative-pipeline products have them: ``warn`` keeps the row and counts
it, ``drop`` moves the record to the quarantine table with the reason ``expectation failed:
<name>``, ``fail`` stops the query, naming the rule, the batch and an example record.
Column rules (``not_null`` aside) pass null values, as Great Expectations does; an ``sql``
rule fails a row unless its expression is true.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal, Self

from pydantic import AfterValidator, Field, PositiveInt, model_validator

from sluice.spec.flatten import quote
from sluice.spec.model import Duration, StrictModel, check_schedule

Action = Literal["warn", "drop", "fail"]
Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

#: The quarantine reason of a record a ``drop`` rule removed.
DROPPED = "expectation failed: "


class _OneKind(StrictModel):
    """A rule that sets exactly one of its ``KINDS``; the subclass's own checks come after."""

    KINDS: ClassVar[tuple[str, ...]] = ()

    @property
    def kind(self) -> str:
        return next(k for k in self.KINDS if getattr(self, k))

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        kinds = [k for k in self.KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {', '.join(self.KINDS)} (found: {', '.join(kinds) or 'none'})")
        return self


class Range(StrictModel):
    """Bounds on a number: ``min``, ``max`` or both, each included unless made strict."""

    min: float | None = None
    """The lowest value allowed."""
    max: float | None = None
    """The highest value allowed."""
    strict_min: bool = False
    """Whether ``min`` itself is refused."""
    strict_max: bool = False
    """Whether ``max`` itself is refused."""

    @model_validator(mode="after")
    def _bounds(self) -> Range:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class RowRule(_OneKind):
    """One check per row; exactly one of the kinds is given."""

    KINDS = ("not_null", "in_range", "matches", "in_set", "sql")

    column: str | None = None
    """The flattened column the rule checks (every kind but ``sql``)."""
    not_null: bool = False
    """The column holds a value."""
    in_range: Range | None = None
    """The column's value lies between bounds."""
    matches: str | None = Field(default=None, min_length=1)
    """The column's value matches this regular expression."""
    in_set: list[str | int | float | bool] | None = Field(default=None, min_length=1)
    """The column's value is one of these."""
    sql: str | None = Field(default=None, min_length=1)
    """A Spark SQL boolean over the flattened columns that a good row makes true."""
    action: Action = "warn"
    """What a failing row does: ``warn`` (counted, written), ``drop`` (quarantined with the rule's name) or ``fail``
    (the batch fails before it writes)."""

    @model_validator(mode="after")
    def _columns(self) -> RowRule:
        if self.kind == "sql" and self.column is not None:
            raise ValueError("an sql rule names its columns in the expression; drop 'column'")
        if self.kind != "sql" and not self.column:
            raise ValueError(f"a {self.kind} rule needs a column")
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ValueError(f"matches: {self.matches!r} is not a regular expression ({exc})") from None
        return self


class TableRule(_OneKind):
    """One check on the written table, per date partition; exactly one of the kinds is given."""

    KINDS = ("row_count", "unique", "freshness", "no_unexpected_columns")

    row_count: Range | None = None
    """The partition's row count lies between bounds."""
    unique: str | None = None
    """This column's values are unique in the partition."""
    freshness: Duration | None = None
    """The newest event time of the partition is no older than this."""
    no_unexpected_columns: bool = False
    """The table has exactly the columns the spec makes: none missing, none extra."""
    severity: Literal["critical", "warning"] = "critical"
    """A critical failure fails the validation (and its Airflow task); a warning is reported only."""


def _on_update_or_schedule(v: str) -> str:
    return v if v == "table_updated" else check_schedule(v)


class Validation(StrictModel):
    """When the data-quality DAG validates the written table with Great Expectations."""

    schedule: Annotated[str, AfterValidator(_on_update_or_schedule)] | None = "table_updated"
    """``table_updated``: on the table's Airflow asset, i.e. after new batches landed; or a cron expression or preset
    (``@daily``); null: only when triggered."""
    partitions: PositiveInt = 1
    """A scheduled run validates this many of the newest date partitions."""


class Expectations(StrictModel):
    """Data-quality rules: on each row in the stream, and on the written table per date partition."""

    rows: dict[Name, RowRule] = Field(default_factory=dict)
    """Rule name -> a check on each row: in the stream (``warn``, ``drop`` or ``fail``), and again on the table by the
    validation job (``drop`` and ``fail`` rules critical there, ``warn`` ones warnings)."""
    table: dict[Name, TableRule] = Field(default_factory=dict)
    """Rule name -> a check on the written table, run by the validation job."""
    validation: Validation = Validation()
    """When the data-quality DAG validates the table."""

    @property
    def declared(self) -> bool:
        return bool(self.rows or self.table)

    @model_validator(mode="after")
    def _distinct_names(self) -> Expectations:
        both = sorted(set(self.rows) & set(self.table))
        if both:
            raise ValueError(f"a name is used by a row rule and a table rule: {', '.join(both)}")
        return self

    def by_action(self, action: Action) -> list[str]:
        return [name for name, rule in self.rows.items() if rule.action == action]

    def row_columns(self) -> dict[str, str]:
        """Rule name -> the column a column rule checks."""
        return {name: r.column for name, r in self.rows.items() if r.column}


def sql_literal(value: str | int | float | bool) -> str:
    """A Spark SQL literal (string literals unescape backslashes and quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def failing_sql(rule: RowRule) -> str:
    """A Spark SQL boolean over the flattened columns, true when the row fails the rule."""
    if rule.sql is not None:
        return f"NOT coalesce(({rule.sql}), false)"
    assert rule.column is not None  # checked by the model
    c = quote(rule.column)
    if rule.not_null:
        return f"{c} IS NULL"
    if rule.in_range is not None:
        r, bounds = rule.in_range, []
        if r.min is not None:
            bounds.append(f"{c} {'>' if r.strict_min else '>='} {r.min!r}")
        if r.max is not None:
            bounds.append(f"{c} {'<' if r.strict_max else '<='} {r.max!r}")
        passes = " AND ".join(bounds)
    elif rule.matches is not None:
        passes = f"{c} RLIKE {sql_literal(rule.matches)}"
    else:
        assert rule.in_set is not None
        passes = f"{c} IN ({', '.join(sql_literal(v) for v in rule.in_set)})"
    return f"{c} IS NOT NULL AND NOT ({passes})"


def describe(rule: RowRule) -> str:
    """The rule in a few words, for tables and messages."""
    if rule.sql is not None:
        return rule.sql
    if rule.not_null:
        return f"{rule.column} is not null"
    if rule.in_range is not None:
        r = rule.in_range
        lo = f"{r.min} {'<' if r.strict_min else '<='} " if r.min is not None else ""
        hi = f" {'<' if r.strict_max else '<='} {r.max}" if r.max is not None else ""
        return f"{lo}{rule.column}{hi}"
    if rule.matches is not None:
        return f"{rule.column} matches {rule.matches}"
    return f"{rule.column} in {rule.in_set}"
