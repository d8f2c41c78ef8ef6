"""Each run mode is one class (jobs.stream.modes): which one a spec gets, and what each refuses
before anything starts. The modes' runs themselves are tested on a real broker and Spark in
tests/integration (test_ingest.py, test_derived.py, test_continuous.py)."""

from __future__ import annotations

import pytest

from jobs.stream.backfill import BackfillRefused
from jobs.stream.modes import Continuous, Derived, MicroBatch, mode_of
from sluice.records.backfill import BackfillPlan
from sluice.spec import load_pipeline
from sluice.spec.continuous import ContinuousError
from sluice.state.lease import Unfenced

PLAN = BackfillPlan(id="bf-1", ranges={"t": {0: (0, 10)}})


@pytest.mark.parametrize(
    ("spec", "mode", "rebuilds"),
    [
        ("device_signals", MicroBatch, False),
        ("github_pushes", Derived, True),  # reads the github_events table
        ("payments_fraud", Continuous, False),
    ],
)
def test_each_shipped_spec_runs_in_its_mode(spec: str, mode: type, rebuilds: bool) -> None:
    chosen = mode_of(load_pipeline(spec))
    assert type(chosen) is mode and chosen.rebuilds is rebuilds


def test_a_mode_refuses_what_it_cannot_run() -> None:
    MicroBatch(load_pipeline("device_signals")).refuse(PLAN, True, "10 seconds")  # a backfill is its own run
    derived = Derived(load_pipeline("github_pushes"))
    with pytest.raises(BackfillRefused, match="github_pushes keeps event-time state"):
        derived.refuse(PLAN, False, None)
    derived.refuse(None, True, "1 minute")
    branch = Continuous(load_pipeline("payments_fraud"))
    for asked in [(PLAN, False, None), (None, True, None), (None, False, "1 second")]:
        with pytest.raises(ContinuousError, match="is a continuous branch: no backfill or micro-batch trigger"):
            branch.refuse(*asked)
    branch.refuse(None, False, None)
    assert ContinuousError in branch.refusals and ContinuousError not in derived.refusals


class _Fence(Unfenced):
    """A driver's lease as the modes see it: ``lost`` says why it is gone."""

    def __init__(self, lost: str | None) -> None:
        super().__init__()
        self.lost = lost

    def verify(self) -> str | None:
        return self.lost


def test_a_query_starts_again_after_a_fenced_drivers_log_entry_only_while_it_holds_the_lease() -> None:
    from jobs.stream.modes import _restartable

    concurrent = Exception("[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs")
    holding, lost = _Fence(None), _Fence("taken over by worker-2")
    assert _restartable(concurrent, holding) == "a fenced-off driver wrote a log entry of the batch it had in progress"
    assert _restartable(concurrent, lost) is None  # this driver is the stale one: it stops
    assert _restartable(Exception("something else"), holding) is None
