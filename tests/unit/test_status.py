from __future__ import annotations

from jobs.status import run_summary


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
