"""The cluster deploy target: a real Spark standalone master and worker started from the
pyspark installation, the same pipeline submitted to it by Airflow through the connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.sinks import read_table
from sluice import supervise
from sluice.airflow_env import CONN_ID, spark_connection
from sluice.generate import EventGenerator
from sluice.produce import send, synthetic
from sluice.submit import spark_home
from tests.fixtures import free_port, make_pipeline, new_topic

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def standalone_cluster(sluice_home: Path) -> Iterator[str]:
    spark_class = str(Path(spark_home()) / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = os.environ | {"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1"}
    logs = sluice_home / "logs"
    logs.mkdir(exist_ok=True)
    procs = []
    for name, args in (
        (
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
        ),
        (
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(free_port()),
                master_url,
            ],
        ),
    ):
        with (logs / f"spark-{name}.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        if name == "master":
            time.sleep(3)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as resp:
                    if json.loads(resp.read()).get("aliveworkers", 0) >= 1:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    "the standalone cluster did not come up:\n" + (logs / "spark-worker.log").read_text()[-3000:]
                )
            time.sleep(1)
        yield master_url
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def test_airflow_deploys_to_a_standalone_cluster(airflow, broker, spark, standalone_cluster) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(airflow.pipelines, topic, name="on_cluster", supervision={"schedule": None})
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=11), 250))

    conn = {f"AIRFLOW_CONN_{CONN_ID.upper()}": spark_connection(standalone_cluster)}
    run = airflow.dags_test("sluice_on_cluster", {"action": "start", "trigger": "available_now"}, env=conn)
    assert run.state == "success", run.log[-4000:]
    assert f"--master {standalone_cluster}" in run.log
    assert f"launched on_cluster on {standalone_cluster}" in run.log

    status = supervise.Status.read("on_cluster")
    assert status is not None and status.app_id and status.app_id.startswith("app-"), status  # a cluster application
    driver = supervise.Driver.read("on_cluster")
    deadline = time.monotonic() + 240
    while supervise.driver_process(pipeline) is not None and time.monotonic() < deadline:
        time.sleep(2)
    assert supervise.Status.read("on_cluster").state == "finished", supervise.log_tail(driver.log, 60)
    assert read_table(spark, "delta", pipeline.sink_path).count() == 250
