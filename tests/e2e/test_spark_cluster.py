"""The cluster deploy target: a real Spark standalone master and worker started from the
pyspark installation, the same pipeline submitted to it by Airflow through the connection."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.sinks import read_table
from sluice.airflow.env import CONN_ID, spark_connection
from sluice.dev.cluster import StandaloneCluster
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import stream
from sluice.ops.target import LocalTarget
from sluice.records.run import Driver, Status
from tests.fixtures import kafka_keys, make_pipeline, new_topic, read_without_spark, shared_state

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def standalone(sluice_home: Path) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(sluice_home / "logs")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def standalone_cluster(standalone: StandaloneCluster) -> str:
    return standalone.url


def test_airflow_deploys_to_a_standalone_cluster(airflow, broker, spark, standalone_cluster) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(airflow.pipelines, topic, name="on_cluster", supervision={"schedule": None})
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=11), 250))

    conn = {f"AIRFLOW_CONN_{CONN_ID.upper()}": spark_connection(standalone_cluster)}
    run = airflow.dags_test("sluice_on_cluster", {"action": "start", "trigger": "available_now"}, env=conn)
    assert run.state == "success", run.log[-4000:]
    assert f"--master {standalone_cluster}" in run.log
    assert f"launched on_cluster on {standalone_cluster}" in run.log

    status = Status.read("on_cluster")
    assert status is not None and status.app_id and status.app_id.startswith("app-"), status  # a cluster application
    driver = Driver.read("on_cluster")
    deadline = time.monotonic() + 240
    while stream.driver_process(pipeline) is not None and time.monotonic() < deadline:
        time.sleep(2)
    assert Status.read("on_cluster").state == "finished", stream.log_tail(driver.log, 60)
    assert read_table(spark, "delta", pipeline.sink_path).count() == 250


KEYS = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]


def test_a_driver_whose_host_died_is_restarted_by_another_host_before_its_lease_expires(
    broker, postgres, standalone: StandaloneCluster, tmp_path: Path, monkeypatch
) -> None:
    """SIGKILL the driver host's processes: the master reports the application ended, so the
    other host's supervision frees its leases and restarts it at once, not after the 30 s ttl."""
    shared_state(postgres, monkeypatch, ttl=30)
    monkeypatch.setenv("SLUICE_SPARK_MASTER_UI", f"http://127.0.0.1:{standalone.ui}")
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(tmp_path, topic, trigger={"processing_time": "500 milliseconds"})
    gen = EventGenerator(pipeline, seed=27)
    sent = {
        (topic, d.partition, d.offset) for d in send(broker.bootstrap, topic, synthetic(gen, 300), keep=True).delivered
    }
    target = LocalTarget(standalone.url)

    def written() -> list[tuple[str, int, int]]:
        return kafka_keys(read_without_spark("delta", pipeline.sink_path, KEYS)) + kafka_keys(
            read_without_spark("delta", pipeline.quarantine_path, KEYS)
        )

    def wait_written(count: int, log: str) -> None:
        deadline = time.monotonic() + 240
        while len(set(written())) < count:
            assert time.monotonic() < deadline, stream.log_tail(log, 60)
            time.sleep(0.5)

    monkeypatch.setenv("SLUICE_HOSTNAME", "worker-a")
    a = stream.start(pipeline, target, by="drill worker-a")
    wait_written(300, a.driver.log)
    os.killpg(os.getpgid(a.driver.pid), signal.SIGKILL)  # the host and everything it ran
    killed, killed_at = time.monotonic(), time.time()
    sent |= {
        (topic, d.partition, d.offset) for d in send(broker.bootstrap, topic, synthetic(gen, 200), keep=True).delivered
    }

    monkeypatch.setenv("SLUICE_HOSTNAME", "worker-b")
    while True:
        assert time.monotonic() - killed < 30, "not restarted before the lease expired"
        done = stream.supervise(pipeline, target, by="drill worker-b")
        if done.started is not None:
            break
        time.sleep(1)
    relaunched, running = done.started.driver.launched_at - killed_at, time.monotonic() - killed
    assert relaunched < 15, f"relaunched {relaunched:.1f}s after the kill: the lease's 30 s were waited for"
    wait_written(500, done.started.driver.log)
    stream.stop(pipeline, by="drill")
    rows = written()
    figures = {"records": len(sent), "lost": len(sent - set(rows)), "duplicated": len(rows) - len(set(rows))}
    print(
        f"\nhost-kill drill (standalone): {figures}, relaunched by the other host {relaunched:.1f}s after the kill, "
        f"running {running:.1f}s after"
    )
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
