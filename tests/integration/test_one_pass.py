"""The one-pass parse (jobs.stream.one_pass) against the reference parse (jobs.stream.parse.parse without it), record for record.

Wherever ``OnePass`` claims a record, the reference must have read the same struct and the
same rescued fields, and found no reason but one about the event time (which is derived
from the typed row after either parse). Records come from the seeded generator (every bad
kind, with undeclared fields added at every depth), from hand-written edge cases of JSON
itself, and from the real samples. The generator's good records must all be claimed where
the schema has only types the one pass reads, so the comparison is never vacuous.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.spec import load_pipeline
from tests.conftest import ROOT, require_real_data

pytestmark = pytest.mark.integration

EVENT_TIME_REASONS = ("bad event time", "event time out of range", "missing event time")


def compare(spark, pipeline, values: list[bytes | None]) -> dict[str, int]:
    """Both parses over ``values``; fails on any claimed record they read differently.
    Returns how many records there were, how many the one pass claimed, and how many the
    reference found good."""
    from pyspark.sql import functions as F

    from jobs.stream import one_pass
    from jobs.stream.parse import parse, rescued_json
    from sluice.spec import quarantine as q
    from sluice.spec.columns import REASON
    from sluice.spec.flatten import PARSED

    one_pass.register(spark, pipeline)
    stamp = datetime(2026, 11, 28, tzinfo=UTC)
    raw = spark.createDataFrame(
        [(None, v, "t", 0, i, stamp) for i, v in enumerate(values)],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    reference = parse(raw, pipeline, one_pass_first=False).select(
        "offset",
        F.to_json(F.col(PARSED).dropFields(q.CORRUPT)).alias("ref_data"),
        F.expr(rescued_json()).alias("ref_rescued"),
        F.col(REASON).alias("reason"),
    )
    fast = raw.select("offset", one_pass.read("value", pipeline).alias("one")).select(
        "offset",
        F.col("one").isNotNull().alias("claimed"),
        F.to_json("one.data").alias("data"),
        F.expr(one_pass.rescued_json("one.rescued")).alias("rescued"),
    )
    both = reference.join(fast, "offset")
    timing = " OR ".join(f"reason LIKE '{r}%'" for r in EVENT_TIME_REASONS)
    differ = both.filter("claimed").filter(
        f"NOT (ref_data <=> data) OR NOT (ref_rescued <=> rescued) OR (reason IS NOT NULL AND NOT ({timing}))"
    )
    rows = differ.orderBy("offset").limit(5).collect()
    shown = [(values[r["offset"]], r.asDict()) for r in rows]
    assert not rows, f"the one pass reads {differ.count()} claimed records otherwise than the reference: {shown}"
    counts = both.agg(
        F.count("*").alias("records"),
        F.count_if("claimed").alias("claimed"),
        F.count_if(F.col("reason").isNull()).alias("good"),
        F.count_if(F.col("reason").isNull() & ~F.col("claimed")).alias("good_unclaimed"),
    ).first()
    return counts.asDict()


def undeclared(event: Any, rng: random.Random, depth: int = 0) -> Any:
    """``event`` with fields the schema does not declare added to some of its objects, at
    every depth and inside arrays, with names that sort before, between and after the
    declared ones and names a path must quote."""
    names = ["aaa", "zz_new", "Mid", "a.b", "back`tick", "ünï", "", "9lives"]
    if isinstance(event, dict):
        out = {k: undeclared(v, rng, depth + 1) for k, v in event.items()}
        if rng.random() < 0.3:
            for name in rng.sample(names, rng.randint(1, 2)):
                out.setdefault(name, rng.choice([1, 2.50, "x", None, True, [1, {"q": 1}], {"n": {"m": 1e-7}}]))
        items = list(out.items())
        rng.shuffle(items)  # keys in any order: the rescued order must not depend on it
        return dict(items)
    if isinstance(event, list):
        return [undeclared(v, rng, depth + 1) for v in event]
    return event


def generated(pipeline, seed: int, n: int) -> list[bytes | None]:
    from sluice.dev.generate import EventGenerator

    gen = EventGenerator(pipeline, seed=seed)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        record = gen.record(0.3)
        if record.kind == "good" and record.event is not None and rng.random() < 0.5:
            out.append(json.dumps(undeclared(record.event, rng)).encode())
        else:
            out.append(record.value)
    return out


@pytest.mark.parametrize("shipped", ["device_signals", "github_events", "wikimedia_recentchange", "payments"])
def test_wherever_the_one_pass_claims_a_record_it_reads_what_the_reference_reads(spark, shipped) -> None:
    pipeline = load_pipeline(ROOT / "pipelines" / f"{shipped}.yaml")
    counts = compare(spark, pipeline, [v for seed in (1, 2, 3) for v in generated(pipeline, seed, 700)])
    assert counts["records"] == 2100
    if shipped == "device_signals":
        # Every type in this schema is one the one pass reads: it must claim every good record.
        assert counts["good_unclaimed"] == 0, counts
        assert counts["claimed"] >= counts["good"] > 1000, counts


def test_json_edge_cases_are_read_alike_or_left_to_the_reference(spark) -> None:
    pipeline = load_pipeline(ROOT / "pipelines" / "device_signals.yaml")
    base = '"timestamp": 1764288000, "device": {"id": "d-1", "location": {"lat": 1.5, "lon": -2}}, "signal": -60.5'
    cases = [
        f"{{{base}}}",
        f" \n{{{base}}}\t ",
        f"{{{base}}}{{}}",  # two values
        f'{{{base}, "battery": 7, "battery": 8}}',  # a key twice
        f'{{{base}, "zz": 1, "zz": 2}}',  # an undeclared key twice
        f'{{{base}, "battery": 2147483648}}',  # beyond INT
        f'{{{base}, "battery": 7.0}}',
        f'{{{base}, "battery": 1e2}}',
        f'{{{base}, "battery": "7"}}',
        f'{{{base}, "battery": -0}}',
        f'{{{base}, "battery": null, "tags": null}}',
        f'{{{base}, "tags": ["a", null, "\\u00e9\\ud83d\\ude00"]}}',
        f'{{{base}, "tags": [1, true]}}',
        f'{{{base}, "tags": "a"}}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": 1e400}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": 123456789012345678901234567890}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": -0.0}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": 4.9e-324}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": 0.1000000000000000055511151231257827}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": NaN}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": "1.5"}',
        '{"timestamp": 1764288000, "device": {"id": "d-1"}, "signal": 01}',
        '{"timestamp": 1764288000, "device": {"id": 5}, "signal": 1}',
        '{"timestamp": 1764288000, "device": {"id": {"x": 1}}, "signal": 1}',
        '{"timestamp": 1764288000, "device": {"id": "a\\u0000b\\"c\\\\"}, "signal": 1}',
        '{"timestamp": 1764288000, "device": {"id": "d"}}',  # a required field missing
        '{"timestamp": 1764288000, "device": null, "signal": 1}',
        '{"timestamp": "1764288000", "device": {"id": "d"}, "signal": 1}',
        '{"timestamp": 1764288000.5, "device": {"id": "d"}, "signal": 1}',
        '{"timestamp": -99999999999999, "device": {"id": "d"}, "signal": 1}',
        "{'timestamp': 1764288000}",
        '{"timestamp": 1764288000, /* c */ "device": {"id": "d"}, "signal": 1}',
        '[{"timestamp": 1764288000}]',
        '"text"',
        "",
        "   ",
        "{",
        "{}",
        f'{{{base}, "extra": {{"deep": [1, {{"k": "v"}}]}}, "device2": 1.50, "b": 1E+2}}',
        f'{{{base}, "new": 12345678901234567890123, "new2": 1.0e-10, "new3": "\\u00e9"}}',
    ]
    values: list[bytes | None] = [c.encode() for c in cases]
    values += [
        None,
        b"\xff\xfe{}",
        f'{{{base}, "tags": ["\xe9"]}}'.encode("latin-1"),
        b"\xef\xbb\xbf" + f"{{{base}}}".encode(),  # a byte-order mark
        f"{{{base}}}".encode("utf-16-le"),  # UTF-16 without a mark: Jackson would detect it
        f'{{{base}, "tags": ["'.encode() + b"\xed\xa0\xbd\xed\xb8\x80" + b'"]}',  # CESU-8
        f'{{{base}, "tags": ["'.encode() + b"\xc0\x80" + b'"]}',  # an overlong NUL
        f'{{{base}, "note\\n": 1, "x\\u2028": 2}}'.encode(),  # names Spark's RLIKE '$' takes
        f'{{{base}, "extra": {{"k": 1, "k": 2}}}}'.encode(),  # a key twice inside an undeclared value
    ]
    nested = json.loads(f"{{{base}}}")
    nested["device"] |= {"vendor": "acme", "id2": 1}
    nested["device"]["location"] |= {"alt": 3, "Alt": 4, "a b": None}
    values.append(json.dumps(nested).encode())
    counts = compare(spark, pipeline, values)
    # The plain records, the whitespace, the nulls, -0, 7.0-free integers and the undeclared fields.
    assert counts["claimed"] >= 8, counts


@pytest.mark.parametrize(
    ("sample", "shipped"),
    [("github-events-2021-07-21.ndjson", "github_events"), ("wikimedia-recentchange.ndjson", "wikimedia_recentchange")],
)
def test_real_samples_are_read_alike(spark, sample, shipped) -> None:
    path = require_real_data(sample)
    pipeline = load_pipeline(ROOT / "pipelines" / f"{shipped}.yaml")
    values = [line.encode() for line in path.read_text().splitlines() if line.strip()]
    counts = compare(spark, pipeline, values)
    assert counts["records"] == len(values)


def test_names_the_reference_cannot_write_as_a_json_path_leave_every_record_to_it(spark, tmp_path) -> None:
    from tests.fixtures import make_pipeline

    schema = tmp_path / "odd.ddl"
    schema.write_text("timestamp BIGINT, `it's` STRUCT<x: INT>, `a.b` STRING, `c]` INT")
    pipeline = make_pipeline(tmp_path, "odd", schema=str(schema))
    values = [
        b'{"timestamp": 1764288000, "it\'s": {"x": 1, "y": 2}}',
        b'{"timestamp": 1764288000, "a.b": "s", "a": {"b": 1}}',
        b'{"timestamp": 1764288000, "c]": 3}',
    ]
    counts = compare(spark, pipeline, values)
    assert counts["claimed"] == 0, counts
