"""Row expectations inside the ingest job: per batch, count, quarantine or stop.

The spec's row rules (:mod:`sluice.spec.expectations`) become one boolean column per rule,
true where a record that parsed fails it, evaluated over its flattened columns. Plain
boolean columns, not an array of rule names: Spark generates code for them, while the
lambdas an array needs are interpreted row by row (they cost a median 9 % of the job's
throughput with five rules; benchmarks/expectations.py). ``drop`` failures turn into a
quarantine reason before the batch is split, so the audit's reconciliation (in = out +
quarantined) holds as it is; ``fail`` failures stop the batch before anything is written,
so the query fails with the same message every time it is restarted on that batch, until
the data or the rule changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.stream.parse import REASON
from sluice.records.audit import BatchAudit
from sluice.spec import Pipeline
from sluice.spec import quarantine as q
from sluice.spec.columns import CHECKED
from sluice.spec.columns import RECORD as _RECORD
from sluice.spec.expectations import DROPPED, describe, failing_sql
from sluice.spec.flatten import quote


def failed(rule: str) -> str:
    """The column that is true where a checked record fails ``rule``."""
    return f"__failed_{rule}"


class ExpectationFailed(RuntimeError):
    """A ``fail`` rule found a record that breaks it: the query stops on this batch."""


@dataclass
class RuleCount:
    action: str
    checked: int
    failed: int  # passed = checked - failed


def check(batch: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The parsed batch with CHECKED and a failed column per rule, and ``drop`` failures
    as quarantine reasons."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return batch
    # Rules name flattened columns; evaluate them beside the record, not inside it, so a
    # flattened name can never collide with the parsing stage's own columns.
    flat = [F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns if "[]" not in c.source]
    record = F.struct(*[F.col(quote(c)) for c in batch.columns]).alias(_RECORD)
    parsed_ok = F.col(f"{_RECORD}.{REASON}").isNull()
    checked = batch.select(record, *flat).select(
        f"{_RECORD}.*",
        parsed_ok.alias(CHECKED),
        *[
            (parsed_ok & F.coalesce(F.expr(failing_sql(rule)), F.lit(False))).alias(failed(name))
            for name, rule in rules.items()
        ],
    )
    drops = pipeline.spec.expectations.by_action("drop")
    if not drops:
        return checked
    dropped = F.concat_ws(", ", *[F.when(F.col(failed(name)), F.lit(name)) for name in drops])
    return checked.withColumn(REASON, F.when(dropped != "", F.concat(F.lit(DROPPED), dropped)).otherwise(F.col(REASON)))


def fail_rule_failed(pipeline: Pipeline) -> Column | None:
    """True where a ``fail`` rule failed (the batch keeps those records' raw value to quote
    one), or None when the pipeline has no ``fail`` rule."""
    names = pipeline.spec.expectations.by_action("fail")
    if not names:
        return None
    return reduce(lambda a, b: a | b, [F.col(failed(name)) for name in names])


def count_columns(pipeline: Pipeline) -> list[Column]:
    """Aggregates for the batch's audit: records checked, and failures per rule."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return []
    return [F.sum(F.col(CHECKED).cast("long")).alias(CHECKED)] + [
        F.sum(F.col(failed(name)).cast("long")).alias(failed(name)) for name in rules
    ]


def read_counts(pipeline: Pipeline, rows: list[Any]) -> dict[str, RuleCount]:
    """Per rule: action, records checked and failed, summed over the aggregated rows."""
    rules = pipeline.spec.expectations.rows
    if not rules:
        return {}
    checked = sum(int(r[CHECKED] or 0) for r in rows)
    return {
        name: RuleCount(rule.action, checked, sum(int(r[failed(name)] or 0) for r in rows))
        for name, rule in rules.items()
    }


def enforce(batch: DataFrame, pipeline: Pipeline, batch_id: int, counts: dict[str, RuleCount]) -> None:
    """Raise :class:`ExpectationFailed` if a ``fail`` rule failed, with an example record."""
    for name, count in counts.items():
        if count.action != "fail" or not count.failed:
            continue
        text_sql = q.raw_text_sql()
        example = (
            batch.filter(F.col(failed(name))).selectExpr(f"{text_sql} AS text", "topic", "partition", "offset").first()
        )
        assert example is not None  # the count says there is one
        text = example["text"] if len(example["text"]) <= 500 else example["text"][:500] + "..."
        text = text.replace("\r", "\\r").replace("\n", "\\n")  # the message stays one line
        raise ExpectationFailed(
            f"{pipeline.name}: expectation {name!r} ({describe(pipeline.spec.expectations.rows[name])}) failed "
            f"for {count.failed} of {count.checked} records in batch {batch_id}; nothing of this batch was "
            f"written. For example {example['topic']}[{example['partition']}] offset {example['offset']}: {text}. "
            f"To go on, set the rule's action to drop (such records go to the quarantine with its name) or "
            f"correct the rule, then restart {pipeline.name}"
        )


def summary(audit: BatchAudit) -> str:
    """The batch's rule counts, as its audit records them, in one line."""
    verbs = {"warn": "warned", "drop": "dropped", "fail": "failed"}
    return "; ".join(
        f"{name} {verbs[c['action']]} {c['failed']} of {c['checked']}" for name, c in audit.expectations.items()
    )
