from __future__ import annotations

from jobs.stream.status import run_summary


def test_run_summary_counts_batches_with_input_and_sums_each_phase() -> None:
    progress = [
        {"numInputRows": 200, "durationMs": {"triggerExecution": 900, "addBatch": 700, "walCommit": 20}},
        {"numInputRows": 0, "durationMs": {"triggerExecution": 5, "latestOffset": 5}},  # an idle trigger
        {"numInputRows": 10, "durationMs": {"triggerExecution": 300, "addBatch": 250, "walCommit": 15}},
    ]
    assert run_summary(progress) == {
        "batches": 2,
        "input_rows": 210,
        "batch_ms": [900, 300],
        "phase_ms": {"triggerExecution": 1200, "addBatch": 950, "walCommit": 35},
    }
    assert run_summary([]) == {"batches": 0, "input_rows": 0, "batch_ms": [], "phase_ms": {}}


def test_run_summary_counts_records_as_the_writer_did_not_as_spark_read_them() -> None:
    """A batch written in one pass that had records to quarantine reads its input twice,
    and Spark counts both reads; the writer's own count is the one that reconciles."""
    from jobs.stream.events import WriterCounts

    progress = [
        {"batchId": 4, "numInputRows": 80, "durationMs": {"triggerExecution": 900}},
        {"batchId": 5, "numInputRows": 40, "durationMs": {"triggerExecution": 300}},
    ]
    assert run_summary(progress, {4: WriterCounts(40, 0, 0)})["input_rows"] == 80
