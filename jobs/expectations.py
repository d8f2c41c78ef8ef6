"""Row expectations inside the ingest job: per batch, count, quarantine or stop.

The spec's row rules (:mod:`sluice.expectations`) become one array column per record:
the names of the rules it fails, checked over the flattened columns of records that
parsed. ``drop`` failures turn into a quarantine reason before the batch is split, so
the audit's reconciliation (in = out + quarantined) holds as it is; ``fail`` failures
stop the batch before anything is written, so the query fails with the same message
every time it is restarted on that batch, until the data or the rule changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.parse import REASON
from sluice import quarantine as q
from sluice.expectations import DROPPED, describe, failing_sql
from sluice.flatten import quote
from sluice.spec import Pipeline

#: Columns added to the parsed batch: did the record reach the rules, and which did it fail.
CHECKED = "__checked"
FAILED = "__failed"
_RECORD = "__record"


class ExpectationFailed(RuntimeError):
    """A ``fail`` rule found a record that breaks it: the query stops on this batch."""


@dataclass
class RuleCount:
    action: str
    checked: int
    failed: int  # passed = checked - failed


def check(batch: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The parsed batch with CHECKED and FAILED, and ``drop`` failures as quarantine reasons."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return batch
    # Rules name flattened columns; evaluate them beside the record, not inside it, so a
    # flattened name can never collide with the parsing stage's own columns.
    flat = [F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns if "[]" not in c.source]
    record = F.struct(*[F.col(quote(c)) for c in batch.columns]).alias(_RECORD)
    fired = F.array(*[F.when(F.expr(failing_sql(rule)), F.lit(name)) for name, rule in rules.items()])
    parsed_ok = F.col(f"{_RECORD}.{REASON}").isNull()
    checked = batch.select(record, *flat).select(
        f"{_RECORD}.*",
        parsed_ok.alias(CHECKED),
        F.when(parsed_ok, F.filter(fired, lambda r: r.isNotNull()))
        .otherwise(F.array().cast("array<string>"))
        .alias(FAILED),
    )
    drops = pipeline.spec.expectations.by_action("drop")
    if not drops:
        return checked
    dropped = F.filter(FAILED, lambda r: r.isin(*drops))
    return checked.withColumn(
        REASON,
        F.when(F.size(dropped) > 0, F.concat(F.lit(DROPPED), F.array_join(dropped, ", "))).otherwise(F.col(REASON)),
    )


def count_columns(pipeline: Pipeline) -> list[Column]:
    """Aggregates for the batch's audit: records checked, and failures per rule."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return []
    return [F.sum(F.col(CHECKED).cast("long")).alias(CHECKED)] + [
        F.sum(F.array_contains(FAILED, name).cast("long")).alias(f"{FAILED}_{name}") for name in rules
    ]


def read_counts(pipeline: Pipeline, rows: list[Any]) -> dict[str, RuleCount]:
    """Per rule: action, records checked and failed, summed over the aggregated rows."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return {}
    checked = sum(int(r[CHECKED] or 0) for r in rows)
    return {
        name: RuleCount(rule.action, checked, sum(int(r[f"{FAILED}_{name}"] or 0) for r in rows))
        for name, rule in rules.items()
    }


def enforce(batch: DataFrame, pipeline: Pipeline, batch_id: int, counts: dict[str, RuleCount]) -> None:
    """Raise :class:`ExpectationFailed` if a ``fail`` rule failed, with an example record."""
    for name, count in counts.items():
        if count.action != "fail" or not count.failed:
            continue
        example = batch.filter(F.array_contains(FAILED, name)).select(q.JSON, "topic", "partition", "offset").first()
        assert example is not None  # the count says there is one
        text = example[q.JSON] if len(example[q.JSON]) <= 500 else example[q.JSON][:500] + "..."
        raise ExpectationFailed(
            f"{pipeline.name}: expectation {name!r} ({describe(pipeline.spec.expectations.rows[name])}) failed "
            f"for {count.failed} of {count.checked} records in batch {batch_id}; nothing of this batch was "
            f"written. For example {example['topic']}[{example['partition']}] offset {example['offset']}: {text}"
        )


def summary(counts: dict[str, RuleCount]) -> str:
    verbs = {"warn": "warned", "drop": "dropped", "fail": "failed"}
    return "; ".join(f"{name} {verbs[c.action]} {c.failed} of {c.checked}" for name, c in counts.items())
