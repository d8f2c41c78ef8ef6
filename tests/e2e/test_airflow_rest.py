"""The real client: Airflow standalone (API server, scheduler, DAG processor, triggerer) on
SQLite, a DAG run triggered through the REST API with parameters, checked in the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from jobs.sinks import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.ports import free_port
from sluice.dev.produce import send, synthetic
from sluice.records.run import Driver
from tests.fixtures import make_pipeline, new_topic

pytestmark = pytest.mark.e2e


class Api:
    def __init__(self, base: str) -> None:
        self.base, self.token = base, ""

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}
            | ({"Authorization": f"Bearer {self.token}"} if self.token else {}),
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def wait(self, what: str, ok, timeout: float, log) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = ok()
                if got:
                    return got
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        pytest.fail(f"timed out waiting for {what}\n{log.read_text()[-4000:]}")


def test_trigger_through_the_rest_api(airflow, broker, spark, tmp_path) -> None:
    topic = new_topic(broker, partitions=2)
    # The default schedule: unpausing queues a scheduled supervision, as in the UI.
    pipeline = make_pipeline(airflow.pipelines, topic, name="restapi")
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=5), 100))

    port = free_port()
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": "s3cret"}))
    log = tmp_path / "standalone.log"
    env = (
        os.environ
        | airflow.env
        | {
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        }
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [airflow.binary, "standalone"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    api = Api(f"http://127.0.0.1:{port}")
    try:
        api.wait("the API server", lambda: api.call("GET", "/api/v2/monitor/health")[0] == 200, 240, log)
        status, body = api.call("POST", "/auth/token", {"username": "admin", "password": "s3cret"})
        assert status in (200, 201), body
        api.token = body["access_token"]
        assert api.call("POST", "/auth/token", {"username": "admin", "password": "wrong"})[0] == 401

        dag = "/api/v2/dags/sluice_restapi"
        api.wait("the DAG to be parsed", lambda: api.call("GET", dag)[0] == 200, 240, log)

        # The form's JSON Schema refuses what it does not offer.
        for bad in ({"action": "explode"}, {"action": "backfill", "from_offset": -5}, {"processing_time": "soon"}):
            status, body = api.call("POST", f"{dag}/dagRuns", {"logical_date": None, "conf": bad})
            assert status == 400, (bad, status, body)
        assert api.call("GET", f"{dag}/dagRuns")[1]["total_entries"] == 0

        # What the trigger form's "Unpause on trigger" does: unpause, which queues a scheduled
        # supervision, then the user's run-once start, which must run as asked, not be skipped.
        status, body = api.call("PATCH", dag, {"is_paused": False})
        assert status == 200 and body["is_paused"] is False, body
        status, run = api.call(
            "POST", f"{dag}/dagRuns", {"logical_date": None, "conf": {"action": "start", "trigger": "available_now"}}
        )
        assert status == 200, run
        run_path = f"{dag}/dagRuns/{run['dag_run_id']}"
        state = api.wait(
            "the run to finish",
            lambda: (s := api.call("GET", run_path)[1]["state"]) in ("success", "failed") and s,
            420,
            log,
        )
        assert state == "success", log.read_text()[-4000:]
        tasks = {t["task_id"]: t["state"] for t in api.call("GET", f"{run_path}/taskInstances")[1]["task_instances"]}
        assert tasks["start"] == "success" and tasks["supervise"] == tasks["stop"] == tasks["backfill"] == "skipped"
        assert Driver.read("restapi") is not None and Driver.read("restapi").desired == "once"  # as asked
        scheduled = [r for r in api.call("GET", f"{dag}/dagRuns")[1]["dag_runs"] if r["run_type"] == "scheduled"]
        assert scheduled, "unpausing queued no scheduled run: this test no longer reproduces the form"
        for r in scheduled:  # it started nothing: it found nothing started, or left it to the user's run
            state = api.wait(
                "the scheduled run to finish",
                lambda r=r: (
                    (s := api.call("GET", f"{dag}/dagRuns/{r['dag_run_id']}")[1]["state"]) in ("success", "failed")
                    and s
                ),
                240,
                log,
            )
            assert state == "success", log.read_text()[-4000:]
            said = json.dumps(
                api.call("GET", f"{dag}/dagRuns/{r['dag_run_id']}/taskInstances/supervise/logs/1?full_content=true")[1]
            )
            assert "leaves the stream to them" in said or "not started yet" in said, said[-4000:]

        # What depends on two fields is refused by plan_backfill at once, and an empty range skips.
        for conf, state, plan, backfill in (
            ({"action": "backfill"}, "failed", "failed", "upstream_failed"),
            ({"action": "backfill", "from_offset": 10**9}, "success", "skipped", "skipped"),
        ):
            status, run = api.call("POST", f"{dag}/dagRuns", {"logical_date": None, "conf": conf})
            assert status == 200, run
            run_path = f"{dag}/dagRuns/{run['dag_run_id']}"
            got = api.wait(
                f"the {conf} run to finish",
                lambda run_path=run_path: (s := api.call("GET", run_path)[1]["state"]) in ("success", "failed") and s,
                240,
                log,
            )
            tasks = {
                t["task_id"]: t["state"] for t in api.call("GET", f"{run_path}/taskInstances")[1]["task_instances"]
            }
            assert (got, tasks["plan_backfill"], tasks["backfill"]) == (state, plan, backfill), (conf, tasks)
            assert tasks["publish"] in ("skipped", "upstream_failed"), tasks  # no asset event
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # The run-once job ends by itself once Kafka is drained; wait for its rows.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if read_table_count(spark, pipeline.sink_path) == 100:
            break
        time.sleep(2)
    assert read_table_count(spark, pipeline.sink_path) == 100


def read_table_count(spark, path: str) -> int:
    try:
        return read_table(spark, "delta", path).count()
    except Exception:  # not created yet
        return -1
