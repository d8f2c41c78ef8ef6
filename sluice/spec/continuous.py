"""What a continuous-processing branch may do, checked before anything starts.

Spark's continuous mode runs long-lived tasks that process each record as it arrives
(milliseconds end to end), so it supports map-like queries only: projections, filters and
row-level expressions, from Kafka to Kafka. Everything that needs state or a batch
boundary is refused here with the part of the spec that asks for it, so ``sluice check``,
``sluice run`` and the Airflow DAG all refuse the same spec the same way. Spark's own
``UnsupportedOperationChecker`` errors, raised when a query starts, are translated into
the same message by :func:`explain_spark_error`.
"""

from __future__ import annotations

import os
import re

from sluice.errors import InvalidInput

MICRO_BATCH_HINT = "run this part as an ordinary micro-batch pipeline (mode: micro_batch, the default)"
#: Real-Time Mode's shortest batch (Spark's ``spark.sql.streaming.realTimeMode.minBatchDuration``).
REAL_TIME_MIN_MS = 5000
#: ``continuous.engine`` -> what Spark calls it, for messages and the DAG's docs.
ENGINES = {"continuous": "continuous processing", "real_time": "Real-Time Mode"}

# Functions that make an expression stateful, batch-bound or non-deterministic per record.
_FORBIDDEN_FUNCTIONS = {
    "aggregation": (
        "count sum avg mean min max first last collect_list collect_set approx_count_distinct "
        "percentile percentile_approx stddev variance any_value count_if bool_and bool_or every some "
        "max_by min_by median mode"
    ),
    "current-time function": "current_timestamp current_date now localtimestamp current_time unix_timestamp",
    "explode (one record to many rows)": "explode explode_outer posexplode posexplode_outer inline inline_outer stack",
    "window or ranking function": "window session_window lag lead row_number rank dense_rank ntile",
    "non-deterministic function": "rand randn uuid monotonically_increasing_id shuffle",
}
_FUNCTION_KIND = {name: kind for kind, names in _FORBIDDEN_FUNCTIONS.items() for name in names.split()}
_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_OVER = re.compile(r"\)\s*over\s*\(", re.IGNORECASE)


class ContinuousError(InvalidInput):
    """A continuous branch asks for something continuous processing cannot do."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


#: Spark's Kafka reader asks the broker for the partition's offset range after every poll
#: (SPARK-34187), on the connection where the consumer has already sent its next fetch. The
#: broker answers one connection in order, so the question waits until the next record arrives
#: or the fetch wait ends: each record waits for its successor. A short fetch wait bounds that
#: wait; it matters on quiet topics (measured with benchmarks/latency.py).
SOURCE_DEFAULTS = {"kafka.fetch.max.wait.ms": "5"}


def source_options(spec_options: dict[str, str]) -> dict[str, str]:
    """The Kafka source options of a continuous branch: the spec's own win over the latency defaults."""
    return SOURCE_DEFAULTS | spec_options


def check_expression(field: str, expression: str) -> None:
    """Refuse an SQL expression that is not map-like, naming the function that makes it so.

    For example ``count(*) > 3`` fails with ``rules.too_many: count() is an aggregation``;
    ``upper(name) = 'X'`` passes. Text inside string literals is ignored.
    """
    code = _STRING.sub("''", expression)
    if _OVER.search(code):
        raise ContinuousError(field, f"'{expression}' uses a window (OVER ...): {MICRO_BATCH_HINT}")
    for name in _CALL.findall(code):
        kind = _FUNCTION_KIND.get(name.lower())
        if kind:
            raise ContinuousError(
                field,
                f"{name}() is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, which continuous processing does not "
                f"support; {MICRO_BATCH_HINT}",
            )


# Spark's messages for operations continuous processing refuses, with what to call them.
_SPARK_UNSUPPORTED = (
    (re.compile(r"Continuous processing does not support (\w+) operations", re.I), "{0} operations"),
    (re.compile(r"Continuous processing does not support current time operations", re.I), "current-time functions"),
    (re.compile(r"(\w+) is not supported (?:in|with) continuous (?:processing|trigger)", re.I), "{0}"),
    (
        re.compile(r"Data source (\S+) does not support continuous (?:processing|writing|reading)", re.I),
        "the {0} source or sink",
    ),
)


def explain_spark_error(pipeline: str, error: str) -> str | None:
    """Spark's unsupported-operation error as Sluice's message, or None if it is another error."""
    for pattern, what in _SPARK_UNSUPPORTED:
        m = pattern.search(error)
        if m:
            part = what.format(*m.groups())
            return (
                f"{pipeline}: continuous processing does not support {part} (Spark: {m.group(0)}); {MICRO_BATCH_HINT}"
            )
    return None


def required_slots(master: str) -> int | None:
    """Task slots a local master offers (``local[4]`` → 4); None when only the cluster knows."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if not m:
        return None
    if m.group(1) == "*":
        return os.cpu_count() or 1
    return int(m.group(1))


def check_slots(pipeline: str, partitions: int, slots: int) -> None:
    """Continuous mode runs one long-lived task per Kafka partition; with fewer slots it hangs silently."""
    if slots < partitions:
        raise ContinuousError(
            "source",
            f"{pipeline}: the topic has {partitions} partitions but Spark offers {slots} task slots; continuous "
            f"processing needs one slot per partition and would hang without an error. Give it at least "
            f"{partitions} cores (e.g. --master local[{partitions}], or more executor cores on the cluster).",
        )


def precheck(pipeline_name: str, topics_partitions: int, master: str) -> None:
    """Before spark-submit: refuse a local master with fewer cores than the topic has partitions."""
    slots = required_slots(master)
    if slots is not None:
        check_slots(pipeline_name, topics_partitions, slots)
