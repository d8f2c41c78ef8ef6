"""The cluster deploy target: a real Spark standalone master and worker started from the
pyspark installation, the same pipeline submitted to it by Airflow through the connection."""

from __future__ import annotations

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
from sluice.records.run import Driver, Status
from tests.fixtures import make_pipeline, new_topic

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def standalone_cluster(sluice_home: Path) -> Iterator[str]:
    cluster = StandaloneCluster(sluice_home / "logs")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


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
