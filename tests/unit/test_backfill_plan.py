"""The backfill rule, without a broker: re-read only what the live stream has committed."""

from __future__ import annotations

import pytest

from sluice.records.backfill import BackfillPlan, clip, describe, size
from sluice.records.checkpoint import last_batch, parse_offsets


def test_clip_keeps_what_the_stream_committed_and_refuses_the_rest() -> None:
    ranges = {"t": {0: (0, 500), 1: (100, 200), 2: (0, 50)}, "u": {0: (0, 10)}}
    committed = {"t": {0: 300, 1: 400}}  # partition 2 and topic u: never read by the stream
    kept, refused = clip(ranges, committed)
    assert kept == {"t": {0: (0, 300), 1: (100, 200)}}  # partitions with nothing left are not read
    assert refused == {"t": {0: (300, 500), 2: (0, 50)}, "u": {0: (0, 10)}}
    assert size(kept) + size(refused) == size(ranges)
    assert describe(refused) == "t[0] 300..500, t[2] 0..50, u[0] 0..10"


def test_a_range_wholly_behind_the_stream_is_kept_whole() -> None:
    ranges = {"t": {0: (10, 20)}}
    assert clip(ranges, {"t": {0: 20}}) == (ranges, {})


def test_the_plan_says_what_it_refused() -> None:
    plan = BackfillPlan("offsets-x", {"t": {0: (0, 300)}}, "offsets [0, end)", {"t": {0: (300, 500)}})
    assert plan.records == 300
    assert plan.refusal() == (
        "refused 200 records the stream has not committed yet (t[0] 300..500): the stream reads them "
        "itself, and a backfill of them would write them twice"
    )
    assert BackfillPlan("offsets-y", {"t": {0: (0, 3)}}, "d").refusal() is None


def test_committed_offsets_are_read_from_the_checkpoint_files() -> None:
    text = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"t":{"1":40,"0":35}}\n{"u":{"0":7}}'
    assert parse_offsets(text) == {"t": {0: 35, 1: 40}, "u": {0: 7}}
    assert last_batch(["0", "1", "12", ".12.crc", "2"]) == 12
    assert last_batch([]) is None


def test_a_plan_survives_its_json_round_trip() -> None:
    plan = BackfillPlan(
        "times-abc", {"t": {0: (5, 9), 1: (0, 4)}, "u": {3: (7, 7)}}, "times [a, b)", {"t": {0: (9, 12)}}
    )
    assert BackfillPlan.from_json(plan.to_json()) == plan
    clipped = plan.clip({"t": {0: 7, 1: 4}})
    assert clipped.ranges == {"t": {0: (5, 7), 1: (0, 4)}}
    assert clipped.refused == {"t": {0: (7, 12)}}  # what was refused before, and now 7..9 too
    assert BackfillPlan.from_json(clipped.to_json()) == clipped


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"id": ""}',
        '{"id": "x", "ranges": {"t": {"0": [5, 2]}}}',
        '{"id": "x", "ranges": {"t": {"0": [-1, 2]}}}',
        '{"id": "x", "ranges": {"t": [1]}}',
        '{"id": "x", "ranges": {"t": {"a": [1, 2]}}}',
        '{"id": "x", "ranges": {"t": {"0": [1]}}}',
    ],
)
def test_anything_but_a_plan_is_refused_with_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        BackfillPlan.from_json(text)


def test_a_backfill_reads_from_its_range_whatever_the_spec_says_about_where_to_start() -> None:
    from jobs.stream.backfill import source_options

    plan = BackfillPlan("b1", {"t": {0: (40, 90), 1: (5, 7)}})
    stream = {
        "kafka.bootstrap.servers": "k:9092",
        "subscribe": "t",
        "startingOffsets": "earliest",
        # Spark prefers these to startingOffsets: left in, the backfill started at the timestamp.
        "startingTimestamp": "1700000000000",
        "startingOffsetsByTimestamp": '{"t": {"0": 1700000000000}}',
        "endingTimestamp": "1800000000000",
        "kafka.security.protocol": "SASL_SSL",
    }
    assert source_options(plan, stream) == {
        "kafka.bootstrap.servers": "k:9092",
        "kafka.security.protocol": "SASL_SSL",
        "assign": '{"t": [0, 1]}',
        "startingOffsets": '{"t": {"0": 40, "1": 5}}',
    }
