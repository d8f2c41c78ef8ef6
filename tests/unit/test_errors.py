"""The one line a person reads from a failed streaming query (sluice.errors.root_cause),
checked on the error texts Spark 4.1 and py4j produce (captured from real failed queries)."""

from __future__ import annotations

import pytest

from sluice.errors import root_cause

QUERY = """
=== Streaming Query ===
Identifier: [id = aa85c37f-904e-46c7-bfd8-6f0901adaf39, runId = 7fdf0a4d-96ff-4b5d-b78e-a1493b6359fa]
Current Committed Offsets: {}

Current State: ACTIVE
Thread State: RUNNABLE"""

# A foreachBatch function raised: py4j wraps the Python traceback, Spark appends the query.
RAISED_IN_BATCH = (
    """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 162, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/work/jobs/stream/row_rules.py", line 119, in enforce
    raise ExpectationFailed(
jobs.stream.row_rules.ExpectationFailed: payments: expectation 'card_id_format' failed for 1 of 1 records in batch 2
"""
    + QUERY
)

# The batch's write failed on the JVM, inside the Python function, after another error.
CHAINED = (
    """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/work/jobs/tables/sinks.py", line 70, in write
    .save(self.path)
ValueError: first
During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/jobs/tables/sinks.py", line 80, in write
    raise
pyspark.errors.exceptions.captured.AnalysisException: [DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'n'
JVM stacktrace:
org.apache.spark.sql.AnalysisException: [DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'n'
\tat org.apache.spark.sql.delta.DeltaErrors$.failedMergeFields(DeltaErrors.scala:1)
"""
    + QUERY
)

# The query itself failed on the JVM: the message comes first, then Spark's SQL context.
ON_THE_JVM = (
    """[DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor being 0 and return NULL instead. SQLSTATE: 22012
== SQL (line 1, position 1) ==
1 div (value - value) AS x
^^^^^^^^^^^^^^^^^^^^^
"""
    + QUERY
)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (RAISED_IN_BATCH, "payments: expectation 'card_id_format' failed for 1 of 1 records in batch 2"),
        (CHAINED, "[DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'n'"),
        (
            ON_THE_JVM,
            "[DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor being 0 and return NULL "
            "instead. SQLSTATE: 22012",
        ),
        (
            "[STREAM_FAILED] Query [id = a, runId = b] terminated with exception: [DELTA_SOURCE_TABLE_IGNORE_CHANGES] "
            "Detected a data update\n\tat org.apache.spark...",
            "[DELTA_SOURCE_TABLE_IGNORE_CHANGES] Detected a data update",
        ),
        ("a plain message", "a plain message"),
    ],
)
def test_the_root_cause_is_the_raised_message_in_one_line(text: str, cause: str) -> None:
    assert root_cause(text) == cause
