"""Tables and checkpoints on S3 (S3Proxy from Maven Central, a real S3 server), written by
a driver submitted as in production and read back by a reader that is not Spark (delta-rs),
straight from the server:

- every commit is a put-if-absent the server decides, with the race made exact by a proxy
  that holds one writer's upload until the other's landed: the Parquet log's commit, Spark's
  checkpoint entries, and a Delta version that two drivers commit at once;
- the S3 server restarted while a stream commits: every record in exactly one of the table
  and quarantine, the audits reconcile, and supervision's lag and `sluice check`'s reader
  read the checkpoint and table on S3.

Parquet on S3, read back with pyarrow, is drilled on the production layout
(tests/e2e/test_cluster.py, the random schedule of faults).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import storage
from sluice.dev.generate import EventGenerator
from sluice.dev.objectstore import S3Server
from sluice.dev.produce import send, synthetic
from sluice.errors import StartFailed
from sluice.ops import processes, stream, supervision
from sluice.ops.target import LocalTarget
from sluice.records.checkpoint import read_committed
from sluice.records.tables import read_shape
from sluice.runtime import submit_env
from sluice.topics import end_offsets
from tests.fixtures import (
    all_audit_totals,
    exactly_once,
    make_pipeline,
    new_topic,
    on_s3,
    read_without_spark,
    wait_written,
    written_keys,
)
from tests.s3_proxy import HoldingProxy

pytestmark = pytest.mark.e2e


#: Two writers, each in a thread of one driver, create one object at once through the proxy: the
#: Parquet log's commit (jobs/tables/hadoopfs.py) and an entry of Spark's checkpoint log (through the
#: file manager Sluice sets on S3). Prints what each call returned, then what the object holds.
RACE = """
import functools, sys, threading
from jobs.session import local_session
from jobs.tables import hadoopfs
spark = local_session("put-if-absent", master="local[2]", conf={"spark.ui.enabled": "false"})
jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
log_commit, checkpoint_entry = sys.argv[1], sys.argv[2]

def commit(text):
    return hadoopfs.create_new(spark, log_commit, text)

def entry(text):
    manager_class = spark.conf.get("spark.sql.streaming.checkpointFileManagerClass")  # as Sluice sets it
    path = jvm.org.apache.hadoop.fs.Path(checkpoint_entry)
    manager = functools.reduce(getattr, manager_class.split("."), jvm)(path.getParent(), conf)
    out = manager.createAtomic(path, False)
    out.write(bytearray(text.encode()))
    try:
        out.close()
        return True
    except Exception as exc:
        out.cancel()
        return "FileAlreadyExistsException" in str(exc) and False

for name, create, path in (("commit", commit, log_commit), ("entry", entry, checkpoint_entry)):
    results = {}
    threads = [threading.Thread(target=lambda w=w: results.__setitem__(w, create(w))) for w in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(name, results["first"], results["second"], hadoopfs.read_text(spark, path))
"""


def test_two_writers_of_one_commit_on_s3_are_decided_by_the_server(object_store: S3Server, monkeypatch) -> None:
    """The Parquet log's commit and Spark's checkpoint entries on S3 are put-if-absent: two
    writers that both pass every check before their upload (the first one's upload is held
    until the second's is answered) get one success; the server refuses the other (412)."""
    store = on_s3(object_store, monkeypatch)
    proxy = HoldingProxy(object_store.port).start()
    try:
        commit, entry = f"{store}/t/_spark_metadata/0", f"{store}/checkpoint/commits/0"
        proxy.hold(r"/_spark_metadata/0$")
        proxy.hold(r"/commits/0$")
        done = subprocess.run(
            [sys.executable, "-c", RACE, commit, entry],
            env=os.environ | submit_env() | proxy.env(object_store.env()),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stderr[-4000:]
    results = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.split()}
    for name in ("commit", "entry"):
        first, second, content = results[name]
        assert sorted([first, second]) == ["False", "True"], results  # one writer won
        assert content == ("first" if first == "True" else "second"), results  # the winner's text stands
    assert [h.status for h in proxy.held] == [412, 412], proxy.held  # the server refused the held uploads
    assert all(h.rival_status == 200 for h in proxy.held), proxy.held


def test_a_store_that_ignores_put_if_absent_is_refused_before_anything_is_written(
    object_store: S3Server, broker, tmp_path, monkeypatch, request
) -> None:
    """On a store that answers a second create of one object with success (an S3-compatible
    server that ignores ``If-None-Match: *``, played here by the proxy), two writers of one
    commit would both succeed. The driver probes the store first and refuses it, in words,
    before it writes a row or a checkpoint entry."""
    store = on_s3(object_store, monkeypatch)
    proxy = HoldingProxy(object_store.port).start()
    request.addfinalizer(proxy.stop)
    for k, v in proxy.env(object_store.env()).items():
        monkeypatch.setenv(k, v)  # the driver's S3 client goes through the proxy
    proxy.ignore_conditions(r"/_sluice_probe/")
    topic = new_topic(broker)
    p = make_pipeline(tmp_path, topic, store=store, name="no_put_if_absent")
    send(broker.bootstrap, topic, synthetic(EventGenerator(p, seed=11), 20))
    with pytest.raises(StartFailed) as failed:
        stream.start(p, LocalTarget("local[2]"), by="test", available_now=True)
    assert "does not refuse a second create of one object" in str(failed.value), failed.value
    assert proxy.unconditional, "the probe's second create never reached the store"
    written = [key for method, key, _ in proxy.requests if method == "PUT" and "_sluice_probe" not in key]
    assert written == [], written  # no table file, no log entry, no checkpoint entry
    monkeypatch.setenv("AWS_ENDPOINT_URL", object_store.endpoint)  # this process reads the server itself
    assert read_without_spark("delta", p.sink_path).num_rows == 0


#: One Spark driver appending ``rows`` rows tagged ``writer`` to the Delta table at argv[1].
APPEND = """
import sys
from jobs.session import local_session
path, writer, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = local_session("append-" + writer, master="local[1]", conf={"spark.ui.enabled": "false"})
spark.range(rows).selectExpr(f"'{writer}' AS writer", "id").write.format("delta").mode("append").save(path)
"""


def test_two_drivers_committing_one_delta_version_on_s3_keep_both_commits(object_store: S3Server, monkeypatch) -> None:
    """Two Spark drivers append to one Delta table on S3; the first one's upload of version 1
    is held until the other's has landed. With Delta's own S3 log store both exited 0 and the
    held upload replaced the other's commit (11 rows of 21 readable); with Sluice's, the server
    refuses the held upload and Delta commits it as version 2."""
    store = on_s3(object_store, monkeypatch)
    table = f"{store}/t"

    def append(writer: str, rows: int, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", APPEND, table, writer, str(rows)],
            env=os.environ | submit_env() | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = append("zero", 1, object_store.env())
    assert first.wait(300) == 0, (first.stderr.read() if first.stderr else "")[-3000:]
    proxy = HoldingProxy(object_store.port).start()
    try:
        proxy.hold(r"/t/_delta_log/\d{20}\.json$")
        writers = [append(w, 10, proxy.env(object_store.env())) for w in ("a", "b")]
        for w in writers:
            _, err = w.communicate(timeout=300)
            assert w.returncode == 0, err[-3000:]
    finally:
        proxy.stop()
    assert [(h.key.rsplit("/", 1)[-1], h.status, h.rival_status) for h in proxy.held] == [
        ("00000000000000000001.json", 412, 200)
    ]
    rows = read_without_spark("delta", table, ["writer"]).column("writer").to_pylist()
    assert sorted(Counter(rows).items()) == [("a", 10), ("b", 10), ("zero", 1)]
    assert storage.delta_table(table).version() == 2  # type: ignore[union-attr]


def test_the_s3_server_restarted_while_a_stream_commits_loses_and_doubles_nothing(
    broker, object_store: S3Server, tmp_path: Path, monkeypatch, capsys
) -> None:
    store = on_s3(object_store, monkeypatch)
    topic = new_topic(broker, partitions=2)
    p = make_pipeline(
        tmp_path,
        topic,
        store=store,
        source={"max_offsets_per_trigger": 100},
        trigger={"processing_time": "500 milliseconds"},
    )
    assert p.sink_path.startswith("s3a://") and p.checkpoint_path.startswith("s3a://")
    gen = EventGenerator(p, seed=37)
    sent: set[tuple[str, int, int]] = set()

    def produce(n: int) -> None:
        sent.update(
            (topic, d.partition, d.offset)
            for d in send(broker.bootstrap, topic, synthetic(gen, n, bad_fraction=0.1), keep=True).delivered
        )

    target = LocalTarget("local[2]")
    started = stream.start(p, target, by="drill")
    produce(300)
    wait_written(p, 100, lambda: processes.log_tail(started.driver.log, 60))  # batches are committing
    produce(300)
    down = object_store.restart(down_for=3.0)
    restarts = 0
    began = time.monotonic()
    while len(set(written_keys(p))) < len(sent):
        # Supervision's part: a driver that gave up while the store was away is started again.
        if supervision.supervise(p, target, by="drill").started is not None:
            restarts += 1
        assert time.monotonic() - began < 300, processes.log_tail(started.driver.log, 80)
        time.sleep(1)
    recovered = time.monotonic() - began
    stream.stop(p, by="drill")
    result = exactly_once(p, sent)
    with capsys.disabled():
        print(
            f"\nS3 restart drill: {result}, store down {down:.1f}s, all written {recovered:.1f}s after it was back, {restarts} restarts"
        )
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    totals = all_audit_totals(p)  # the audits, read from S3
    assert totals["records_in"] == len(sent) == totals["records_out"] + totals["records_quarantined"], totals
    assert totals["records_quarantined"] >= 2
    committed = read_committed(p.checkpoint_path)  # supervision's lag, from the checkpoint on S3
    assert committed.batch_id is not None and committed.lag({topic: end_offsets(broker.bootstrap, topic)}) == 0
    shape = read_shape("delta", p.sink_path)  # `sluice check`'s reader
    assert shape is not None and "device_id" in shape.columns


@pytest.mark.drill
def test_every_writer_of_one_delta_table_on_s3_meets_the_others_and_loses_nothing(
    broker, object_store: S3Server, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Several writers meet on one Delta table on S3 by design: a stream, a backfill beside it,
    OPTIMIZE from the maintenance DAG, and every driver's rows in the one event log. Through
    the proxy, one writer's commit of each table is held until another writer's commit of the
    same version has landed: the store refuses the held one, Delta commits it on top, and the
    table (read from S3 with delta-rs) has every record once; the event log, every batch once."""
    from sluice.ops import backfill as backfills
    from sluice.ops.submit import maintenance_submission

    store = on_s3(object_store, monkeypatch)
    monkeypatch.setenv("SLUICE_STORE", store)  # the event log lives there too
    monkeypatch.setenv("SLUICE_EVENTS_FLUSH_SECONDS", "1")
    proxy = HoldingProxy(object_store.port).start()

    @contextlib.contextmanager
    def through_the_proxy() -> Iterator[None]:
        """Drivers launched in the block reach S3 through the proxy. (The test's own readers go
        to the server: delta-rs holds the GIL while it waits, and the proxy runs in this process.)"""
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        try:
            yield
        finally:
            monkeypatch.setenv("AWS_ENDPOINT_URL", object_store.endpoint)

    topic, other_topic = new_topic(broker, partitions=2), new_topic(broker, partitions=1)
    trigger = {"processing_time": "1 second"}
    p = make_pipeline(
        tmp_path,
        topic,
        store=store,
        source={"starting_offsets": "latest", "max_offsets_per_trigger": 1000},  # the backfill in a batch or two
        trigger=trigger,
    )
    other = make_pipeline(tmp_path, other_topic, store=store, trigger=trigger)
    gen, other_gen = EventGenerator(p, seed=41), EventGenerator(other, seed=42)
    sent: set[tuple[str, int, int]] = set()

    def produce(n: int) -> None:
        report = send(broker.bootstrap, topic, synthetic(gen, n, bad_fraction=0.05), keep=True)
        sent.update((topic, d.partition, d.offset) for d in report.delivered)

    produce(150)  # before the stream, which starts at the latest offsets: the backfill's to add
    # A held upload waits as long as its rival takes to start (a JVM): S3A's 60 s would retry it.
    target = LocalTarget("local[2]", conf={"spark.hadoop.fs.s3a.connection.request.timeout": "300s"})
    table_log = rf"{p.sink_path.split('://', 1)[1].split('/', 1)[1]}/_delta_log/\d{{20}}\.json$"
    events_log = r"/_sluice_events/_delta_log/\d{20}\.json$"
    with through_the_proxy():
        started = stream.start(p, target, by="drill")
    producing = threading.Event()

    def keep_producing() -> None:  # the stream commits all along, a few records a second
        while not producing.wait(2.0):
            produce(10)

    feeder = threading.Thread(target=keep_producing)
    feeder.start()
    try:
        wait_written(
            p, 20, lambda: processes.log_tail(started.driver.log, 60)
        )  # the backfill re-reads what it committed
        send(broker.bootstrap, other_topic, synthetic(other_gen, 100))
        proxy.hold(events_log, timeout=180)  # the two streams' event-log rows
        with through_the_proxy():
            stream.start(other, target, by="drill")
        proxy.hold(table_log, timeout=180)  # the stream against its backfill
        backfill = backfills.plan(p, from_offset=0)
        with through_the_proxy(), capsys.disabled():  # the job's log goes to this process's stderr
            backfills.run(p, target, backfill)
        proxy.hold(table_log, timeout=180)  # the stream against OPTIMIZE
        with through_the_proxy(), capsys.disabled():
            target.run(maintenance_submission(p.spec_path, pipeline_name=p.name))
    finally:
        producing.set()
        feeder.join()
    try:
        wait_written(p, len(sent), lambda: f"held: {proxy.held}\n{processes.log_tail(started.driver.log, 60)}", 300)
        deadline = time.monotonic() + 120
        while len(proxy.raced()) < 3 and time.monotonic() < deadline:  # the event logs meet at a flush
            time.sleep(1)
    finally:
        for q in (p, other):
            stream.stop(q, by="drill")
        proxy.stop()
    races = [(h.key.split("/_delta_log/")[0].rsplit("/", 1)[-1], h.status, h.rival_status) for h in proxy.held]
    result = exactly_once(p, sent)
    history = [c["operation"] for c in storage.delta_table(p.sink_path).history()]  # type: ignore[union-attr]
    events = read_without_spark("delta", f"{store}/tables/_sluice_events", ["pipeline", "query_id", "batch_id"])
    rows = [(r["query_id"], r["batch_id"]) for r in events.to_pylist()]
    with capsys.disabled():
        print(f"\nwriters of one table on S3: {races}; {result}; {len(rows)} event-log rows")
    assert [(status, rival) for _, status, rival in races] == [(412, 200)] * 3, races
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    assert "OPTIMIZE" in history, history
    assert len(rows) == len(set(rows)) and {r["pipeline"] for r in events.to_pylist()} == {p.name, other.name}
