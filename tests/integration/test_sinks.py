"""The table writers on real Spark: batches where one table gets nothing, Parquet's commit
log against Spark's own reader and writer, and tables other readers can open."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send
from sluice.records import parquet_log
from sluice.state.lease import Unfenced
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

COLUMNS = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]


def test_batches_with_nothing_for_one_table_keep_the_pipeline_running(spark, broker, tmp_path) -> None:
    # 10 records a batch, 250 in all: the quarantine table gets something only in batches
    # 2, 3 and 19, and the output table nothing in batch 2. Spark's own file sink died at
    # the compaction of batch 19 (BATCH_METADATA_NOT_FOUND .../9.compact). Delta never had
    # this problem; the chaos matrix covers its empty batches.
    fmt = "parquet"
    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": fmt}, source={"max_offsets_per_trigger": 10})
    gen = EventGenerator(pipeline, seed=11)
    bad_at = {*range(20, 30), 35, 195}
    records = [gen.bad(gen.kinds[i % len(gen.kinds)]) if i in bad_at else gen.record() for i in range(250)]
    send(broker.bootstrap, topic, records[:120])
    run_available_now(spark, pipeline)
    send(broker.bootstrap, topic, records[120:])  # a restart in between, past the compaction at 9
    run_available_now(spark, pipeline)

    for path, offsets in ((pipeline.sink_path, set(range(250)) - bad_at), (pipeline.quarantine_path, bad_at)):
        expected = sorted((topic, 0, o) for o in offsets)
        assert sorted(kafka_keys(read_without_spark(fmt, path, COLUMNS))) == expected
        rows = read_table(spark, fmt, path).select(*COLUMNS).collect()
        assert sorted(tuple(r) for r in rows) == expected
    assert audit_totals(pipeline) == {"records_in": 250, "records_out": 238, "records_quarantined": 12}
    if fmt == "parquet":
        names = {p.name for p in (Path(pipeline.sink_path) / parquet_log.LOG_DIR).iterdir()}
        assert "9.compact" in names and "19.compact" in names  # 24 batches wrote, so the log compacted twice
        quarantine_commits = parquet_log.latest(
            p.name for p in (Path(pipeline.quarantine_path) / "_spark_metadata").iterdir()
        )
        assert quarantine_commits == 2  # three batches had bad records: commits 0, 1, 2


def test_spark_reads_sluice_parquet_log_and_sluice_reads_spark_file_sink(spark, tmp_path) -> None:
    # Spark's file-sink log format is Spark's, not a public API: if a Spark upgrade changes it,
    # this fails (in both directions) before any table does.
    own = tmp_path / "spark_sink"
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 200)
        .load()
        .selectExpr("value", "to_date(timestamp) AS date")
        .writeStream.format("parquet")
        .partitionBy("date")
        .option("checkpointLocation", str(tmp_path / "spark_sink_cp"))
        .trigger(processingTime="200 milliseconds")
        .start(str(own))
    )
    deadline = time.monotonic() + 120
    try:
        while (parquet_log.latest(p.name for p in (own / "_spark_metadata").glob("*")) or -1) < 11:
            assert time.monotonic() < deadline, "Spark's file sink committed fewer than 12 batches in 120 s"
            query.awaitTermination(0.5)
    finally:
        query.stop()
    by_spark = spark.read.parquet(str(own)).count()
    by_log = read_without_spark("parquet", str(own), ["value"]).num_rows
    assert by_spark == by_log > 0
    assert parquet_log.partition_columns(str(own), parquet_log.committed_files(own)) == ["date"]


def test_parquet_commits_compact_and_expire_and_replays_are_skipped(spark, tmp_path, monkeypatch) -> None:
    from jobs.tables import sinks
    from jobs.tables.sinks import ParquetSink

    sink = ParquetSink(spark, str(tmp_path / "t"), "date", "writer-a")
    other = ParquetSink(spark, str(tmp_path / "t"), "date", "writer-b")
    df = spark.range(3).selectExpr("id", "current_date() AS date")
    for batch in range(35):
        if batch == 30:
            # Young commits outlive their compaction, for readers that listed the log before it.
            assert (tmp_path / "t" / "_spark_metadata" / "0").exists()
            monkeypatch.setattr(sinks, "EXPIRE_AFTER", 0)
        sink.write(df, batch)
        if batch % 7 == 0:
            other.write(df, batch)  # a second writer (a backfill) commits between them
    sink.write(df, 34)  # a replay of the last batch
    fresh = ParquetSink(spark, str(tmp_path / "t"), "date", "writer-a")
    fresh.write(df, 30)  # a replay after a restart: found in the log, not in memory
    assert spark.read.parquet(str(tmp_path / "t")).count() == (35 + 5) * 3
    log = {p.name for p in (tmp_path / "t" / "_spark_metadata").iterdir() if not p.name.startswith(".")}
    assert parquet_log.latest(log) == 39  # 35 + 5 commits; the replays committed nothing
    assert {"19.compact", "29.compact", "39.compact", "38"} <= log
    assert not {"0", "8", "9.compact", "18"} & log  # two compactions old: expired
    assert not (tmp_path / "t" / "_sluice_staging").exists() or not any((tmp_path / "t" / "_sluice_staging").iterdir())
    entries = parquet_log.committed_files(tmp_path / "t")
    assert parquet_log.last_batch(entries, "writer-a") == 34 and parquet_log.last_batch(entries, "writer-b") == 28
    assert read_without_spark("parquet", str(tmp_path / "t"), ["id"]).num_rows == 120


def test_a_crashed_attempt_leaves_nothing_readable_and_its_retry_cleans_up(spark, tmp_path) -> None:
    from jobs.tables.sinks import ParquetSink

    table = tmp_path / "t"
    df = spark.range(5).selectExpr("id", "current_date() AS date")
    ParquetSink(spark, str(table), "date", "w").write(df, 0)
    # An attempt at batch 1 by an earlier driver (epoch 3) that died after moving its files,
    # before its commit; the retry (this driver, another epoch) commits, then removes them.
    attempt = table / "_sluice_staging" / f"w-{1:012d}-e3"
    df.write.partitionBy("date").parquet(str(attempt))
    day = next(attempt.glob("date=*")).name
    for f in attempt.glob("date=*/*.parquet"):
        f.rename(table / day / (parquet_log.tag("w", 1, 3) + f.name))
    assert spark.read.parquet(str(table)).count() == 5  # not listed, not read
    ParquetSink(spark, str(table), "date", "w").write(df, 1)
    assert spark.read.parquet(str(table)).count() == 10
    on_disk = [p for p in (table / day).glob("*.parquet")]
    listed = {parquet_log.location(e.path).name for e in parquet_log.committed_files(table)}
    assert {p.name for p in on_disk} == listed  # the dead attempt's files are gone


def as_stream_and_backfill(write_all: Callable[[str], None]) -> None:
    """Run ``write_all(writer)`` for a 'stream' and a 'backfill' writer in two threads at
    once; any error of either fails the test."""
    errors: list[BaseException] = []

    def run(writer: str) -> None:
        try:
            write_all(writer)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in ("stream", "backfill")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors


def test_writers_committing_at_once_lose_no_commit(spark, tmp_path) -> None:
    """A stream and a backfill commit to one table at the same moment, many times over: the
    commit lock orders them, and every batch of both is listed once."""
    from jobs.tables.sinks import ParquetSink

    table = str(tmp_path / "t")
    df = spark.range(0, 2, 1, 1).selectExpr("id", "current_date() AS date")  # one file a batch

    def write_all(writer: str) -> None:
        sink = ParquetSink(spark, table, "date", writer)
        for batch in range(12):
            sink.write(df, batch)

    as_stream_and_backfill(write_all)
    entries = parquet_log.committed_files(tmp_path / "t")
    assert parquet_log.last_batch(entries, "stream") == parquet_log.last_batch(entries, "backfill") == 11
    assert len(entries) == len({e.path for e in entries}) == 24  # one file a batch, each listed once
    names = {p.name for p in (tmp_path / "t" / "_spark_metadata").iterdir() if not p.name.startswith(".")}
    assert parquet_log.latest(names) == 23 and "19.compact" in names
    assert read_without_spark("parquet", table, ["id"]).num_rows == spark.read.parquet(table).count() == 48


def test_two_writers_creating_one_delta_table_at_once_both_land(spark, tmp_path) -> None:
    """The stream and a backfill may both create a quarantine that does not exist yet; Delta
    lets one first commit win, and the other writes again: every batch once, in every table."""
    from deltalake import DeltaTable

    from jobs.tables.sinks import DeltaSink

    df = spark.range(0, 2, 1, 1).selectExpr("id", "current_date() AS date")
    tables = [str(tmp_path / f"t{i}") for i in range(4)]
    barrier = threading.Barrier(2)

    def write_all(writer: str) -> None:
        for table in tables:
            sink = DeltaSink(spark, table, "date", writer)
            barrier.wait(timeout=120)  # both create the table at the same moment
            for batch in range(2):
                sink.write(df, batch)
            sink.write(df, 1)  # a replayed batch is skipped

    as_stream_and_backfill(write_all)
    for table in tables:
        assert DeltaTable(table).to_pyarrow_table().num_rows == 8  # 2 writers x 2 batches x 2 rows


class _Driver(Unfenced):
    """A writer as one driver of a checkpoint: its lease's epoch, no store."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch


@pytest.mark.parametrize("seed", range(3))
def test_a_driver_paused_before_its_commit_while_another_took_over_loses_and_doubles_nothing(
    spark, tmp_path, monkeypatch, seed
) -> None:
    """Driver A (epoch 1) has moved batch 3's files into the table and read the next commit
    number; it pauses there (a GC pause, SIGSTOP) past its lease. Driver B (epoch 2) takes over
    the checkpoint and writes batch 3 too. Without the commit section (its holder's store
    transaction ended when A froze), in every order the seed picks: nobody deletes the other
    epoch's files before the batch is in the log, the log's put-if-absent lets one of them
    commit batch 3, and the log never names a file that is gone."""
    import random

    from jobs.tables import sinks
    from jobs.tables.sinks import ParquetSink
    from sluice import faults

    monkeypatch.setattr(sinks, "commit_section", lambda claim, fence, timeout=120.0: contextlib.nullcontext())
    table = str(tmp_path / "t")
    df = spark.range(0, 4, 1, 1).selectExpr("id", "current_date() AS date")
    for batch in range(3):
        ParquetSink(spark, table, "date", "w", _Driver(1)).write(df, batch)
    rng = random.Random(seed)
    a_paused, b_at, a_go, b_go = (threading.Event() for _ in range(4))
    b_first = rng.random() < 0.5  # which of the two reaches the log first once both are ready

    def pause(batch: int | None) -> None:
        if threading.current_thread().name == "A":
            a_paused.set()
            assert a_go.wait(120)
        else:
            b_at.set()
            assert b_go.wait(120)

    errors: list[BaseException] = []

    def run(epoch: int) -> None:
        try:
            ParquetSink(spark, table, "date", "w", _Driver(epoch)).write(df, 3)
        except BaseException as exc:
            errors.append(exc)

    with faults.hook("parquet.before-commit", pause):
        a = threading.Thread(target=run, args=(1,), name="A")
        a.start()
        assert a_paused.wait(120)
        b = threading.Thread(target=run, args=(2,), name="B")
        b.start()
        assert b_at.wait(120)  # both have their files in the table, and neither has committed
        first, second = (b_go, a_go) if b_first else (a_go, b_go)
        first.set()
        (b if b_first else a).join(120)
        second.set()
        a.join(120)
        b.join(120)
    assert not errors, errors
    entries = parquet_log.committed_files(tmp_path / "t")
    assert all(Path(parquet_log.location(e.path).uri).exists() for e in entries)  # no listed file is gone
    assert parquet_log.last_batch(entries, "w") == 3
    assert read_without_spark("parquet", table, ["id"]).num_rows == 4 * 4  # batches 0-3, each once
    on_disk = {p.name for p in (tmp_path / "t").glob("date=*/*.parquet")}
    assert on_disk == {parquet_log.location(e.path).name for e in entries}  # the loser's copies are gone


def test_a_delta_writer_paused_between_its_check_and_its_commit_writes_its_batch_once(spark, tmp_path, caplog) -> None:
    """Delta's append answers the writer's last batch from the table's checksum
    (``sluice.delta.IdempotentAppend``): a replayed batch is skipped without a Spark job, also
    by a driver that reads the table from disk, through a checkpoint. Delta's internals it uses are not a public API,
    so this fails when they change. And the storage still decides: writer A finds batch 3
    missing, then pauses while its files are written (a UDF that waits); B writes batch 3 under
    the same app id and commits; A's commit then fails on B's, and its retry finds the batch."""
    import uuid

    from pyspark.sql import functions as F

    from jobs.tables.sinks import DeltaSink, idempotent_append

    assert idempotent_append(spark) is not None, "sluice-delta.jar is not built: run `make setup`"
    table = str(tmp_path / "t")
    df = spark.range(0, 4, 1, 1).selectExpr("id", "current_date() AS date")
    with delta_checkpoints_every(spark, 2):  # a driver that finds the table reads a checkpoint
        for batch in range(3):
            DeltaSink(spark, table, "date", "w").write(df, batch)
    assert (tmp_path / "t" / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()

    def jobs_of(write: Callable[[], None]) -> list[int]:
        group = f"replay-{uuid.uuid4().hex}"
        spark.sparkContext.setJobGroup(group, "a replayed batch")
        try:
            write()
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    assert jobs_of(lambda: DeltaSink(spark, table, "date", "w").write(df, 2)) == []
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # as a new driver finds the table
    assert jobs_of(lambda: DeltaSink(spark, table, "date", "w").write(df, 1)) == []
    assert read_without_spark("delta", table, ["id"]).num_rows == 3 * 4

    started, go = tmp_path / "a-checked", tmp_path / "a-go"

    def wait(value: int) -> int:  # in a Python worker: A has checked the table and is writing
        started.touch()
        while not go.exists():
            time.sleep(0.05)
        return value

    slow = spark.range(0, 4, 1, 1).select(F.udf(wait, "long")("id").alias("id"), F.current_date().alias("date"))
    errors: list[BaseException] = []

    def run_a() -> None:
        try:
            DeltaSink(spark, table, "date", "w").write(slow, 3)
        except BaseException as exc:
            errors.append(exc)

    a = threading.Thread(target=run_a, name="A")
    with caplog.at_level("WARNING", logger="sluice.sinks"):
        a.start()
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "writer A never started writing"
        DeltaSink(spark, table, "date", "w").write(df, 3)  # B, while A is paused
        go.touch()
        a.join(180)
    assert not a.is_alive() and not errors, errors
    assert "lost a commit race (ConcurrentTransactionException)" in caplog.text  # the log decided, not a check
    assert read_without_spark("delta", table, ["id"]).num_rows == 4 * 4  # batches 0-3, each once
