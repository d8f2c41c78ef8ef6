"""The production layout's Kafka: three KRaft brokers from the same jars, topics with three
copies and min.insync.replicas=2. Drill: SIGKILL the broker that leads a partition while a
stream reads it and a producer writes to it; nothing is lost or written twice (read with
delta-rs against what the brokers acknowledged), and the stream goes on."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from sluice.dev.broker import KafkaCluster
from sluice.dev.generate import EventGenerator
from sluice.dev.ports import free_port
from sluice.dev.produce import send, synthetic
from sluice.ops import stream
from sluice.ops.target import LocalTarget
from sluice.topics import create_topics
from tests.fixtures import kafka_keys, make_pipeline, read_without_spark

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

KEYS = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]


@pytest.fixture(scope="module")
def kafka(sluice_home: Path) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(sluice_home / "kafka-cluster", [(free_port(), free_port()) for _ in range(3)], heap="256m")
    cluster.start(timeout=180)
    yield cluster
    cluster.stop()


def written(pipeline) -> list[tuple[str, int, int]]:
    return kafka_keys(read_without_spark("delta", pipeline.sink_path, KEYS)) + kafka_keys(
        read_without_spark("delta", pipeline.quarantine_path, KEYS)
    )


def test_topics_get_three_copies_two_in_sync(kafka: KafkaCluster) -> None:
    [made] = create_topics(kafka.bootstrap, ["rf-check"], partitions=3)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    md = admin.list_topics("rf-check", timeout=10).topics["rf-check"]
    assert made.partitions == 3 and {len(p.replicas) for p in md.partitions.values()} == {3}
    [conf] = admin.describe_configs([ConfigResource("topic", "rf-check")]).values()
    assert conf.result()["min.insync.replicas"].value == "2"


def test_killing_a_partition_leader_mid_stream_loses_nothing(kafka: KafkaCluster, tmp_path: Path, monkeypatch) -> None:
    topic = "leader-drill"
    create_topics(kafka.bootstrap, [topic], partitions=2)
    pipeline = make_pipeline(
        tmp_path,
        topic,
        source={"bootstrap_servers": kafka.bootstrap},
        trigger={"processing_time": "500 milliseconds"},
    )
    gen = EventGenerator(pipeline, seed=26)
    sent: set[tuple[str, int, int]] = set()
    sent |= {
        (topic, d.partition, d.offset) for d in send(kafka.bootstrap, topic, synthetic(gen, 500), keep=True).delivered
    }
    started = stream.start(pipeline, LocalTarget(), by="drill")
    try:
        deadline = time.monotonic() + 240
        while len(set(written(pipeline))) < 500:
            assert time.monotonic() < deadline, stream.log_tail(started.driver.log, 60)
            time.sleep(0.5)

        # A producer keeps writing (acks=all) while the leader of partition 0 is killed.
        report: dict[str, object] = {}
        producing = threading.Thread(
            target=lambda: report.update(sent=send(kafka.bootstrap, topic, synthetic(gen, 1500), rate=300, keep=True))
        )
        producing.start()
        time.sleep(1.5)
        md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(topic, timeout=10).topics[topic]
        leader = md.partitions[0].leader
        victim = next(b for b in kafka.brokers if b.node_id == leader)
        pid = victim.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        producing.join(180)
        delivered = report["sent"].delivered  # type: ignore[attr-defined]
        sent |= {(topic, d.partition, d.offset) for d in delivered}
        while len(set(written(pipeline))) < len(sent):
            assert time.monotonic() - killed < 240, (
                len(set(written(pipeline))),
                len(sent),
                stream.log_tail(started.driver.log, 60),
            )
            time.sleep(0.5)
        recovered = time.monotonic() - killed
        st = stream.status(pipeline)
        assert st.observation.alive, st.verdict.reason  # the stream went on: no restart needed
    finally:
        stream.stop(pipeline, by="drill")
    rows = written(pipeline)
    figures = {"records": len(sent), "lost": len(sent - set(rows)), "duplicated": len(rows) - len(set(rows))}
    print(f"\nleader-kill drill: broker {leader} killed, {figures}, every record written {recovered:.1f}s after")
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    victim.stop()  # its pid file; the next test module gets its own cluster anyway
