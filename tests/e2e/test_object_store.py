"""Tables and checkpoints on S3 (S3Proxy from Maven Central, a real S3 server), written by
a driver submitted as in production and read back by a reader that is not Spark (delta-rs),
straight from the server:

- the Parquet commit's put-if-absent: S3A's conditional create, refused by the server;
- the S3 server restarted while a stream commits: every record in exactly one of the table
  and quarantine, the audits reconcile, and supervision's lag and `sluice check`'s reader
  read the checkpoint and table on S3.

Parquet on S3, read back with pyarrow, is drilled on the production layout
(tests/e2e/test_cluster.py, the paused driver).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.dev.generate import EventGenerator
from sluice.dev.objectstore import S3Server
from sluice.dev.produce import send, synthetic
from sluice.ops import stream
from sluice.ops.submit import submit_env
from sluice.ops.target import LocalTarget
from sluice.records.checkpoint import read_committed
from sluice.records.tables import read_shape
from sluice.topics import end_offsets
from tests.fixtures import (
    all_audit_totals,
    exactly_once,
    make_pipeline,
    new_topic,
    on_s3,
    wait_written,
    written_keys,
)

pytestmark = pytest.mark.e2e


def test_the_parquet_commit_is_a_put_if_absent_on_s3(object_store: S3Server, monkeypatch) -> None:
    """Two writers create the same commit file: S3 refuses the second (If-None-Match: *)."""
    store = on_s3(object_store, monkeypatch)
    script = (
        "import sys\n"
        "from jobs.session import local_session\n"
        "from jobs import hadoopfs\n"
        "spark = local_session('put-if-absent', master='local[1]', conf={'spark.ui.enabled': 'false'})\n"
        "path = sys.argv[1]\n"
        "print(hadoopfs.create_new(spark, path, 'first'), hadoopfs.create_new(spark, path, 'second'))\n"
        "print(hadoopfs.read_text(spark, path))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, f"{store}/_spark_metadata/000000000000.json"],
        env=os.environ | submit_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["True", "False", "first"], done.stdout


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
    wait_written(p, 100, lambda: stream.log_tail(started.driver.log, 60))  # batches are committing
    produce(300)
    down = object_store.restart(down_for=3.0)
    restarts = 0
    began = time.monotonic()
    while len(set(written_keys(p))) < len(sent):
        # Supervision's part: a driver that gave up while the store was away is started again.
        if stream.supervise(p, target, by="drill").started is not None:
            restarts += 1
        assert time.monotonic() - began < 300, stream.log_tail(started.driver.log, 80)
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
