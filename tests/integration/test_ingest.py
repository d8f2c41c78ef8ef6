"""The ingest job on a real broker, real Spark and real Delta/Parquet tables."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from jobs.stream.batches import CheckpointMismatch
from jobs.stream.micro_batch import start
from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator, Record
from sluice.dev.produce import send, synthetic
from sluice.records.audit import file_name as audit_file
from sluice.spec import quarantine as q
from tests.fixtures import (
    audit_totals,
    delta_checkpoints_every,
    kafka_keys,
    make_pipeline,
    new_topic,
    read_without_spark,
    run_available_now,
)

pytestmark = pytest.mark.integration


def value_at(event: dict[str, Any], dotted: str) -> Any:
    node: Any = event
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_every_record_lands_once_row_for_row_and_reason_for_reason(spark, broker, tmp_path, fmt) -> None:
    topic = new_topic(broker, partitions=3)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": fmt})
    report = send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=42), 600, 0.2), keep=True)

    run_available_now(spark, pipeline)

    good = {(d.partition, d.offset): d.record for d in report.delivered if d.record.kind == "good"}
    bad = {(d.partition, d.offset): d.record for d in report.delivered if d.record.kind != "good"}
    assert len(good) + len(bad) == 600 and len(bad) > 60

    out = read_table(spark, fmt, pipeline.sink_path).collect()
    rows = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in out}
    assert len(rows) == len(out), "a Kafka record was written twice"
    assert rows.keys() == good.keys()
    for key, record in good.items():
        row, event = rows[key], record.event
        assert event is not None
        for col in pipeline.plan.columns:
            assert row[col.name] == value_at(event, col.source), (key, col.name)
        assert row["_kafka_topic"] == topic
        assert row["date"] == datetime.fromtimestamp(event["timestamp"], UTC).date()

    quarantined = read_table(spark, fmt, pipeline.quarantine_path).collect()
    reasons = {(r["_kafka_partition"], r["_kafka_offset"]): r["reason"] for r in quarantined}
    assert len(reasons) == len(quarantined)
    assert reasons == {key: record.reason for key, record in bad.items()}
    raw = {(r["_kafka_partition"], r["_kafka_offset"]): r["raw_value"] for r in quarantined}
    assert all((bytes(raw[k]) if raw[k] is not None else None) == r.value for k, r in bad.items())

    assert audit_totals(pipeline) == {"records_in": 600, "records_out": len(good), "records_quarantined": len(bad)}


def test_restart_reads_only_new_records(spark, broker, tmp_path) -> None:
    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic)
    gen = EventGenerator(pipeline, seed=1)
    send(broker.bootstrap, topic, synthetic(gen, 100))
    run_available_now(spark, pipeline)
    send(broker.bootstrap, topic, synthetic(gen, 50))
    run_available_now(spark, pipeline)
    table = read_table(spark, "delta", pipeline.sink_path)
    assert table.count() == 150
    assert table.select("_kafka_partition", "_kafka_offset").distinct().count() == 150


def test_dates_follow_the_spec_timezone_and_decimals_survive(spark, broker, tmp_path) -> None:
    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(
        tmp_path,
        topic,
        schema="payment/v1.json",
        event_time={"field": "created_at", "format": "iso8601"},
        date_partition={"column": "day", "timezone": "Europe/Berlin"},
    )
    base = {"payment_id": "p1", "amount": 1234.56, "currency": "EUR", "card": {"id": "c1"}}
    times = ["2026-03-28T23:30:00Z", "2026-03-28T22:59:59Z", "2026-07-01T21:59:59.500+00:00"]
    records = [Record(json.dumps(base | {"created_at": t}).encode(), "good", None) for t in times]
    send(broker.bootstrap, topic, records)
    run_available_now(spark, pipeline)
    rows = read_table(spark, "delta", pipeline.sink_path).orderBy("_kafka_offset").collect()
    # 23:30Z is 00:30 in Berlin (CET, +1); 22:59:59Z is still the 28th; in July Berlin is +2.
    assert [str(r["day"]) for r in rows] == ["2026-03-29", "2026-03-28", "2026-07-01"]
    assert [str(r["amount"]) for r in rows] == ["1234.56"] * 3
    assert rows[0]["card_id"] == "c1" and rows[0]["merchant_category"] is None


def test_parquet_readers_see_only_committed_files(spark, broker, tmp_path) -> None:
    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": "parquet"})
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=3), 200))
    run_available_now(spark, pipeline)
    # A file left by a batch that died before its commit: present on disk, not in the log.
    partition_dir = next(Path(pipeline.sink_path).glob("date=*"))
    data_file = next(partition_dir.glob("*.parquet"))
    shutil.copy(data_file, partition_dir / "part-uncommitted-from-a-crash.parquet")
    assert read_table(spark, "parquet", pipeline.sink_path).count() == 200
    globbed = spark.read.parquet(f"{pipeline.sink_path}/date=*/*.parquet").count()
    assert globbed > 200  # what a reader that globs would wrongly see


def test_a_new_checkpoint_for_a_table_with_data_is_refused(spark, broker, tmp_path) -> None:
    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic)
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=4), 20))
    run_available_now(spark, pipeline)
    moved = make_pipeline(
        tmp_path, topic, name="moved", sink={"path": pipeline.sink_path}, checkpoint=str(tmp_path / "fresh")
    )
    with pytest.raises(CheckpointMismatch, match="already has data"):
        start(spark, moved, available_now=True)


def test_exploded_arrays_keep_one_row_per_element_and_records_reconcile(spark, broker, tmp_path) -> None:
    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(tmp_path, topic, flatten={"explode": ["tags"], "rename": {"tags": "tag"}})
    gen = EventGenerator(pipeline, seed=9)
    events = [gen.good() for _ in range(30)]
    send(broker.bootstrap, topic, [Record(json.dumps(e).encode(), "good", None, e) for e in events])
    run_available_now(spark, pipeline)
    table = read_table(spark, "delta", pipeline.sink_path)
    expected_rows = sum(max(1, len(e.get("tags") or [])) for e in events)
    assert table.count() == expected_rows
    assert table.select("_kafka_offset").distinct().count() == 30
    totals = audit_totals(pipeline)
    assert totals["records_out"] == 30


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_absurd_event_times_and_non_utf8_values_are_quarantined_so_every_reader_opens_the_tables(
    spark, broker, tmp_path, fmt
) -> None:
    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(
        tmp_path,
        topic,
        schema="payment/v1.json",
        event_time={"field": "created_at", "format": "iso8601"},
        sink={"format": fmt},
    )
    now = datetime.now(UTC)

    def at(delta: timedelta) -> str:
        return (now + delta).strftime("%Y-%m-%dT%H:%M:%SZ")

    accepted = "1970-01-01T00:00:00Z to 1 day after ingestion"
    times = {  # event time -> accepted?
        "+99999-01-01T00:00:00Z": False,
        "0001-01-01T00:00:00Z": False,
        "2999-12-31T00:00:00Z": False,
        "1969-12-31T23:59:59Z": False,
        at(timedelta(days=2)): False,
        "1970-01-01T00:00:00Z": True,
        at(timedelta(hours=-1)): True,
        at(timedelta(hours=12)): True,
    }
    base = {"payment_id": "p", "amount": 10.5, "currency": "EUR", "card": {"id": "c1"}}
    records = [Record(json.dumps(base | {"created_at": t}).encode(), "x", None) for t in times]
    gen = EventGenerator(pipeline, seed=8)
    latin1 = [gen.bad("not_utf8") for _ in range(10)]
    send(broker.bootstrap, topic, records + latin1)
    run_available_now(spark, pipeline)

    out = read_without_spark(fmt, pipeline.sink_path)  # delta-rs failed here on date=+99999-01-01
    assert sorted(out.column("_kafka_offset").to_pylist()) == [i for i, ok in enumerate(times.values()) if ok]
    assert {str(d) for d in out.column("date").to_pylist()} <= {
        str((now + timedelta(hours=h)).date()) for h in (-1, 0, 12)
    } | {"1970-01-01"}

    quarantine = read_without_spark(fmt, pipeline.quarantine_path)
    quarantine.validate(full=True)  # every string column is valid UTF-8
    by_offset = {r["_kafka_offset"]: r for r in quarantine.to_pylist()}
    for offset, (ts, ok) in enumerate(times.items()):
        if not ok:
            assert by_offset[offset]["reason"] == f"event time out of range: created_at={ts} (accepted {accepted})"
    for offset, record in enumerate(latin1, start=len(times)):
        row = by_offset[offset]
        assert row["reason"] == q.NOT_UTF8
        assert row["raw_value"] == record.value  # the bytes as they came
        assert "\ufffd" in row["raw_text"] and row["raw_text"].isprintable()
    assert len(by_offset) == quarantine.num_rows == 15
    assert audit_totals(pipeline) == {"records_in": 18, "records_out": 3, "records_quarantined": 15}


def test_a_first_batch_killed_while_its_offsets_were_written_starts_again(spark, broker, tmp_path) -> None:
    """A driver killed while Spark wrote offsets/0 leaves only Spark's temporary file
    (`.0.<uuid>.tmp`, seen in a chaos run); Spark 4.1 then refused every restart
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). The restart clears it and reads everything."""
    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic)
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=5), 40))
    offsets = Path(pipeline.checkpoint_path) / "offsets"
    offsets.mkdir(parents=True)
    (Path(pipeline.checkpoint_path) / "metadata").write_text('{"id":"6f1f4b1e-59a4-4b50-9d55-3b0d2d5bc1a1"}\n')
    leftover = offsets / ".0.39dfb8d1-3317-47be-bb18-da4065ebcede.tmp"
    leftover.write_text("v1\n{}\n")

    run_available_now(spark, pipeline)

    assert not leftover.exists()
    assert audit_totals(pipeline)["records_in"] == 40
    keys = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]
    written = kafka_keys(read_without_spark("delta", pipeline.sink_path, keys))
    written += kafka_keys(read_without_spark("delta", pipeline.quarantine_path, keys))
    assert len(written) == len(set(written)) == 40


def test_values_from_json_would_change_are_quarantined_with_the_field_or_coerced_where_the_spec_says(
    spark, broker, tmp_path
) -> None:
    """Spark's from_json rounds, reads numbers from strings, takes NaN and a bare year: each
    such value is quarantined with its field and why, unless the spec opts in under coerce."""
    topic = new_topic(broker, partitions=1)
    schema = tmp_path / "readings.ddl"
    schema.write_text(
        "ts STRING, amount DECIMAL(10,2), signal DOUBLE, n INT, device STRING, "
        "lenient DECIMAL(10,2), reading DOUBLE, anything STRING"
    )
    pipeline = make_pipeline(
        tmp_path,
        topic,
        schema=str(schema),
        event_time={"field": "ts", "format": "iso8601"},
        coerce={
            "lenient": {"round": "half_up", "from_string": True},
            "reading": {"allow_non_finite": True},
            "anything": {"json_text": True},
        },
    )
    ts = '"ts": "2026-11-20T10:15:00Z"'
    sent: list[tuple[str, str | None]] = [  # the record -> its quarantine reason (None: written)
        (f'{{{ts}, "amount": 2000.004}}', "type mismatch: amount (2000.004 has more than 2 decimal places)"),
        (f'{{{ts}, "amount": "2500.00"}}', 'type mismatch: amount ("2500.00" is a string, expected decimal(10,2))'),
        (f'{{{ts}, "n": "42"}}', "type mismatch: n (expected int)"),
        (f'{{{ts}, "signal": "NaN"}}', 'type mismatch: signal ("NaN" is not a finite number)'),
        (f'{{{ts}, "signal": "Infinity"}}', 'type mismatch: signal ("Infinity" is not a finite number)'),
        # Spark's VARIANT holds 1e400 as an infinite double, which its JSON text quotes.
        (f'{{{ts}, "signal": 1e400}}', 'type mismatch: signal ("Infinity" is not a finite number)'),
        (f'{{{ts}, "device": {{"id": "d-1"}}}}', 'type mismatch: device ({"id":"d-1"} is an object, expected string)'),
        ('{"ts": "2021"}', "bad event time: ts=2021 is not iso8601"),
        ('{"ts": "10:15:00"}', "bad event time: ts=10:15:00 is not iso8601"),
        ('{"ts": "2026-11-20"}', "bad event time: ts=2026-11-20 is not iso8601"),
        (f'{{{ts}, "amount": 1999.99, "signal": 1.5, "n": 42, "device": "d-1"}}', None),
        (f'{{{ts}, "lenient": 2000.005}}', None),
        (f'{{{ts}, "lenient": "2500.00"}}', None),
        (f'{{{ts}, "reading": "NaN"}}', None),
        (f'{{{ts}, "anything": {{"id": "d-1"}}}}', None),
    ]
    send(broker.bootstrap, topic, [Record(text.encode(), "x", reason) for text, reason in sent])
    run_available_now(spark, pipeline)

    out = {r["_kafka_offset"]: r for r in read_without_spark("delta", pipeline.sink_path).to_pylist()}
    quarantined = read_without_spark("delta", pipeline.quarantine_path).to_pylist()
    assert {r["_kafka_offset"]: r["reason"] for r in quarantined} == {
        offset: reason for offset, (_, reason) in enumerate(sent) if reason is not None
    }
    assert sorted(out) == [offset for offset, (_, reason) in enumerate(sent) if reason is None]
    first = out[10]
    assert (first["amount"], first["signal"], first["n"], first["device"]) == (Decimal("1999.99"), 1.5, 42, "d-1")
    assert first["_event_time"] == datetime(2026, 11, 20, 10, 15, tzinfo=UTC)
    assert out[11]["lenient"] == Decimal("2000.01")  # rounded half up, as the spec allows
    assert out[12]["lenient"] == Decimal("2500.00")
    assert math.isnan(out[13]["reading"])
    assert out[14]["anything"] == '{"id":"d-1"}'
    assert audit_totals(pipeline) == {"records_in": len(sent), "records_out": 5, "records_quarantined": 10}


def write_paths(monkeypatch) -> list[str]:
    """The names of the BatchWriter paths each batch takes (_write_once, _write_cached), in order."""
    from jobs.stream import micro_batch

    passes: list[str] = []
    for method in ("_write_once", "_write_cached"):
        original = getattr(micro_batch.BatchWriter, method)

        def spy(self, *args, _original=original, _name=method):
            passes.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(micro_batch.BatchWriter, method, spy)
    return passes


# This one compares batches written in one pass with cached batches, record for record, in
# about 90 s a format: `make drills`.
@pytest.mark.drill
@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_batches_written_in_one_pass_audit_and_write_what_cached_batches_do(
    spark, broker, tmp_path, monkeypatch, caplog, fmt
) -> None:
    """A batch written in one pass, counted on the way (BatchWriter._write_once, forced here
    for every batch after the first), and a batch kept in memory and counted first
    (_write_cached: a writer's first batch, a backfill, a ``fail`` rule, the batch after one
    with rejects or rescued fields). Both read the same topic here, 40
    records a batch from 3 partitions, with rejects, rescued fields, exploded arrays and
    rules that warn and drop: every batch's audit and every table must come out the same."""
    import random

    from jobs.stream import micro_batch

    topic = new_topic(broker, partitions=3)
    gen = EventGenerator(make_pipeline(tmp_path, topic), seed=31)
    rng = random.Random(31)
    records = []
    for i, record in enumerate(synthetic(gen, 300, 0.15)):
        if record.kind == "good" and record.event is not None and i % 7 == 0:
            event = dict(record.event, firmware_channel=rng.choice(["beta", "stable"]))  # not in the schema
            record = Record(json.dumps(event).encode(), "good", None, event)
        records.append(record)
    send(broker.bootstrap, topic, records)
    fields: dict[str, Any] = {
        "sink": {"format": fmt},
        "source": {"max_offsets_per_trigger": 40},
        "flatten": {"explode": ["tags"], "rename": {"tags": "tag"}},
        "expectations": {
            "rows": {
                "strong": {"sql": "signal > -90", "action": "drop"},
                "typed": {"column": "device_type", "not_null": True, "action": "warn"},
            }
        },
    }

    # Every batch here has rejects, after which a stream keeps its next batch (cached_next):
    # one pass is forced, to be compared.
    monkeypatch.setattr(micro_batch, "cached_next", lambda audit: False)
    passes = write_paths(monkeypatch)
    once = make_pipeline(tmp_path, topic, name="once", **fields)
    run_available_now(spark, once)
    assert passes[0] == "_write_cached" and set(passes[1:]) == {"_write_once"} and len(passes) >= 8, passes

    # A one-pass write both tables skip: the last batch, uncommitted as a crash between its
    # write and its commit leaves it, replayed by a writer that takes it for a later batch
    # (as when another driver wrote it). Nothing may be written twice or counted otherwise.
    commits = Path(once.checkpoint_path) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    init = micro_batch.BatchWriter.__init__

    def taken_for_later(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._written = True

    monkeypatch.setattr(micro_batch.BatchWriter, "__init__", taken_for_later)
    monkeypatch.setattr(micro_batch, "OBSERVED_WAIT", 2.0)
    passes.clear()
    run_available_now(spark, once)
    assert passes == ["_write_once"] and (commits / str(last)).exists()
    assert f"batch {last}: the output table skipped it" in caplog.text
    replayed = json.loads((Path(once.audit_path) / audit_file(last)).read_text())
    assert replayed["records_out"] and replayed["records_quarantined"], replayed  # both tables skipped it
    monkeypatch.setattr(micro_batch.BatchWriter, "__init__", init)

    passes.clear()
    monkeypatch.setattr(micro_batch, "MAX_OBSERVED_PARTITIONS", 0)  # every batch counted first
    cached = make_pipeline(tmp_path, topic, name="cached", **fields)
    run_available_now(spark, cached)
    assert set(passes) == {"_write_cached"}

    def audits(pipeline: Any) -> list[dict[str, Any]]:
        found = []
        for f in sorted(Path(pipeline.audit_path).glob("*.json")):
            audit = json.loads(f.read_text())
            found.append({k: v for k, v in audit.items() if k not in ("pipeline", "seconds", "written_at")})
        return found

    assert audits(once) == audits(cached)
    totals = audit_totals(once)
    assert totals["records_in"] == 300 == totals["records_out"] + totals["records_quarantined"]
    assert any(a["records_rescued"] for a in audits(once)) and totals["records_quarantined"] > 30
    for path in ("sink_path", "quarantine_path"):
        columns = ["_kafka_partition", "_kafka_offset"] + (["tag"] if path == "sink_path" else ["reason"])
        rows = [read_without_spark(fmt, getattr(p, path), columns).to_pylist() for p in (once, cached)]
        key = lambda r: tuple(str(v) for v in r.values())  # noqa: E731
        assert sorted(rows[0], key=key) == sorted(rows[1], key=key) and rows[0]


def test_a_batch_after_a_clean_one_is_written_in_one_pass_and_after_rejects_from_a_copy(
    spark, broker, tmp_path, monkeypatch
) -> None:
    """cached_next: while the last batch was clean, a stream writes the next in one pass (its
    rejects read again for the quarantine); after a batch with rejects, from a copy in memory.
    Three batches of 20, the middle one with 5 malformed records: both paths, end to end."""

    topic = new_topic(broker, partitions=1)
    gen = EventGenerator(make_pipeline(tmp_path, topic), seed=41)
    mixed = [gen.bad("malformed") if i % 4 == 0 else gen.record() for i in range(20)]
    send(broker.bootstrap, topic, [*synthetic(gen, 20), *mixed, *synthetic(gen, 20)])
    passes = write_paths(monkeypatch)
    pipeline = make_pipeline(tmp_path, topic, name="alternating", source={"max_offsets_per_trigger": 20})
    run_available_now(spark, pipeline)
    assert passes == ["_write_cached", "_write_once", "_write_cached"]
    assert audit_totals(pipeline) == {"records_in": 60, "records_out": 55, "records_quarantined": 5}
    assert read_without_spark("delta", pipeline.sink_path, ["_kafka_offset"]).num_rows == 55
    quarantined = read_without_spark("delta", pipeline.quarantine_path, ["_kafka_offset", "reason"]).to_pylist()
    assert sorted(r["_kafka_offset"] for r in quarantined) == [20, 24, 28, 32, 36]
    assert {r["reason"] for r in quarantined} == {q.MALFORMED}


def test_a_batch_shaped_like_the_last_compiles_no_code(spark, broker, tmp_path, monkeypatch) -> None:
    """A streaming query writes each batch's time into its plan as a literal; compiled into
    the code, it would make Spark compile every batch afresh (see eventtime.per_batch). Six
    clean batches of 10: after the first two (the cached path, then the one-pass path), Spark
    compiles nothing."""
    from jobs.stream import micro_batch

    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(tmp_path, topic, name="same_code", source={"max_offsets_per_trigger": 10})
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=43), 60))
    # Spark's own count of the Java classes it compiled, since the session started.
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    counts: list[int] = []
    original = micro_batch.BatchWriter.written

    def spy(self, audit):
        original(self, audit)
        counts.append(compiled.getCount())

    monkeypatch.setattr(micro_batch.BatchWriter, "written", spy)
    # Delta writes a checkpoint at every tenth commit of a table, with code of its own.
    with delta_checkpoints_every(spark, 100):
        run_available_now(spark, pipeline)
    assert len(counts) == 6
    assert [b - a for a, b in itertools.pairwise(counts[1:])] == [0, 0, 0, 0], counts
    assert audit_totals(pipeline) == {"records_in": 60, "records_out": 60, "records_quarantined": 0}


def test_counts_a_write_did_not_observe_are_none_not_a_wait_for_ever(spark) -> None:
    """A one-pass batch reads its audit from the write's observed metrics; when the table
    skipped the write (the batch was in it), none come, and the writer counts again."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from jobs.stream.micro_batch import observed

    seen = Observation("skipped-write")
    df = spark.range(3).observe(seen, F.count(F.lit(1)).alias("n"))
    assert observed(seen, timeout=1.0) is None
    df.collect()
    assert observed(seen) == {"n": 3}


def test_a_second_read_that_finds_other_rejects_fails_the_batch(spark, broker, tmp_path) -> None:
    """The quarantine of a one-pass batch reads the batch again; if that read does not find
    the rejects the write counted, the batch fails before writing any of them."""
    from jobs.stream import row_rules
    from jobs.stream.micro_batch import BatchReadChanged, BatchWriter
    from jobs.stream.parse import parse

    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic)
    sent = list(synthetic(EventGenerator(pipeline, seed=5), 30, 0.3))
    send(broker.bootstrap, topic, sent)
    rejects = sum(r.kind != "good" for r in sent)
    raw = spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
    batch = row_rules.check(parse(raw.load(), pipeline), pipeline)
    Path(pipeline.checkpoint_path).mkdir(parents=True)  # the tables' writer id is the query's
    (Path(pipeline.checkpoint_path) / "metadata").write_text(json.dumps({"id": "c0ffee00-0000-4000-8000-000000000001"}))
    writer = BatchWriter(spark, pipeline)
    with pytest.raises(BatchReadChanged, match=f"batch 0: {rejects + 1} records to quarantine .* {rejects} when"):
        writer._quarantine_again(batch, 0, rejects + 1)
    assert not Path(pipeline.quarantine_path).exists()  # nothing written, not even the table
    writer._quarantine_again(batch, 1, rejects)
    assert read_without_spark("delta", pipeline.quarantine_path, ["reason"]).num_rows == rejects > 0


def test_a_log_entry_a_fenced_driver_wrote_meanwhile_restarts_the_query(spark, broker, tmp_path, monkeypatch, caplog):
    """A driver paused past its lease can wake between its batch's writes and Spark's entry in
    the commit log, and write that entry after another driver took over and replayed the
    batch; the driver holding the lease then failed on CONCURRENT_STREAM_LOG_UPDATE (seen in
    the pause drills, tests/e2e/test_two_hosts.py). It starts again from the checkpoint,
    which has the entry, and every record is in the tables once."""
    import logging

    from sluice import faults

    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic)
    gen = EventGenerator(pipeline, seed=8)
    send(broker.bootstrap, topic, synthetic(gen, 60))

    def stale_driver_commits(batch_id: int | None) -> None:  # right after this batch's writes
        entry = Path(pipeline.checkpoint_path) / "commits" / str(batch_id)
        if batch_id == 0 and not entry.exists():
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.write_text('v1\n{"nextBatchWatermarkMs":0}')

    with caplog.at_level(logging.WARNING, logger="sluice.ingest"), faults.hook("batch.written", stale_driver_commits):
        run_available_now(spark, pipeline)
    assert "a fenced-off driver wrote a log entry of the batch it had in progress" in caplog.text
    send(broker.bootstrap, topic, synthetic(gen, 20))
    run_available_now(spark, pipeline)  # the checkpoint moves on from the entry

    keys = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]
    written = kafka_keys(read_without_spark("delta", pipeline.sink_path, keys))
    written += kafka_keys(read_without_spark("delta", pipeline.quarantine_path, keys))
    assert len(written) == len(set(written)) == 80
