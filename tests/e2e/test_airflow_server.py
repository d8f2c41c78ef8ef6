"""The real clients of one Airflow standalone (API server, scheduler, DAG processor,
triggerer, on SQLite): DAG runs triggered through the REST API, and through the trigger form
in Chromium, checked in the tables."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urljoin, urlparse

import psutil
import pytest
from playwright.sync_api import expect

from jobs.tables.readers import read_table
from sluice.dev.generate import EventGenerator
from sluice.dev.ports import free_port
from sluice.dev.produce import send, synthetic
from sluice.ops import drivers
from sluice.records.run import Driver
from tests.fixtures import chromium, make_pipeline, new_topic

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

    def finished(self, what: str, run_path: str, timeout: float, log) -> str:
        """The state a DAG run ends in (success or failed), once it has."""

        def ended() -> str | None:
            state = self.call("GET", run_path)[1]["state"]
            return state if state in ("success", "failed") else None

        return self.wait(what, ended, timeout, log)


def airflow_processes(port: int) -> list[psutil.Process]:
    """Airflow's processes (its venv's) serving on ``port``, by their environment: whatever
    their parents, sessions or process groups."""
    return [
        p
        for p in psutil.process_iter(["environ", "cmdline"])
        if (p.info["environ"] or {}).get("AIRFLOW__API__PORT") == str(port)
        and any(".venv-airflow" in part for part in p.info["cmdline"] or [])
    ]


@dataclass
class Server:
    api: Api
    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> list[str]:
        """SIGTERM to `sluice airflow standalone`, as `kill` or systemd sends it; what of Airflow
        was left running (then killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        left = airflow_processes(self.port)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        return [f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}" for p in left]


@pytest.fixture(scope="module")
def server(airflow, broker, tmp_path_factory) -> Iterator[Server]:
    """Airflow standalone with a password login, a fast DAG processor and scheduler."""
    home = tmp_path_factory.mktemp("standalone")
    port = free_port()
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"admin": "s3cret"}))
    log = home / "standalone.log"
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
    sluice = str(Path(sys.executable).with_name("sluice"))  # as users start it, and stop it
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sluice, "airflow", "standalone"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    api = Api(url)
    server = Server(api, url, log, proc, port)
    try:
        api.wait("the API server", lambda: api.call("GET", "/api/v2/monitor/health")[0] == 200, 240, log)
        status, body = api.call("POST", "/auth/token", {"username": "admin", "password": "s3cret"})
        assert status in (200, 201), body
        api.token = body["access_token"]
        assert api.call("POST", "/auth/token", {"username": "admin", "password": "wrong"})[0] == 401
        yield server
    finally:
        server.stop()


# The form's refusals and a start right after unpausing are in test_the_trigger_form_in_chromium;
# this one adds the REST API's own answers (HTTP 400 for what the form's schema refuses).
@pytest.mark.drill
def test_trigger_through_the_rest_api(airflow, server, broker, spark) -> None:
    topic = new_topic(broker, partitions=2)
    # The default schedule: unpausing queues a scheduled supervision, as in the UI.
    pipeline = make_pipeline(airflow.pipelines, topic, name="restapi")
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=5), 100))
    api, log = server.api, server.log
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
    state = api.finished("the run to finish", run_path, 420, log)
    assert state == "success", log.read_text()[-4000:]
    tasks = {t["task_id"]: t["state"] for t in api.call("GET", f"{run_path}/taskInstances")[1]["task_instances"]}
    assert tasks["start"] == "success" and tasks["supervise"] == tasks["stop"] == tasks["backfill"] == "skipped"
    assert Driver.read("restapi") is not None and Driver.read("restapi").desired == "once"  # as asked
    scheduled = [r for r in api.call("GET", f"{dag}/dagRuns")[1]["dag_runs"] if r["run_type"] == "scheduled"]
    assert scheduled, "unpausing queued no scheduled run: this test no longer reproduces the form"
    for r in scheduled:  # it ran first (earlier run_after) and left the stream to the user's run
        state = api.finished("the scheduled run to finish", f"{dag}/dagRuns/{r['dag_run_id']}", 240, log)
        assert state == "success", log.read_text()[-4000:]
        said = json.dumps(
            api.call("GET", f"{dag}/dagRuns/{r['dag_run_id']}/taskInstances/supervise/logs/1?full_content=true")[1]
        )
        assert "leaves the stream to them" in said, said[-4000:]

    # What depends on two fields is refused by plan_backfill at once, and an empty range skips.
    for conf, state, plan, backfill in (
        ({"action": "backfill"}, "failed", "failed", "upstream_failed"),
        ({"action": "backfill", "from_offset": 10**9}, "success", "skipped", "skipped"),
    ):
        status, run = api.call("POST", f"{dag}/dagRuns", {"logical_date": None, "conf": conf})
        assert status == 200, run
        run_path = f"{dag}/dagRuns/{run['dag_run_id']}"
        got = api.finished(f"the {conf} run to finish", run_path, 240, log)
        tasks = {t["task_id"]: t["state"] for t in api.call("GET", f"{run_path}/taskInstances")[1]["task_instances"]}
        assert (got, tasks["plan_backfill"], tasks["backfill"]) == (state, plan, backfill), (conf, tasks)
        assert tasks["publish"] in ("skipped", "upstream_failed"), tasks  # no asset event

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


class Form:
    """The trigger form of one DAG, as a user fills it in."""

    def __init__(self, page, url: str, dag: str) -> None:
        page.goto(f"{url}/dags/{dag}")
        page.get_by_role("button", name="Trigger").first.click()
        self.page, self.dialog = page, page.get_by_role("dialog")
        self.dialog.get_by_text("Run Parameters").wait_for()

    def pick(self, field: str, typed: str) -> Any:
        """Type into a list field (it filters its options) and take the first option left."""
        box = self.dialog.locator(f"input[name=element_{field}]").locator("xpath=..")
        box.click()
        box.locator("input[type=text]").fill(typed)
        return box

    def value(self, field: str) -> str:
        return self.dialog.locator(f"input[name=element_{field}]").input_value()

    def type_number(self, field: str, keys: str) -> str:
        """Type key by key into a number field, leave it, and return what it then shows."""
        self.dialog.get_by_text("Backfill range: offsets or times").click()
        box = self.dialog.locator(f"input[name=element_{field}]")
        box.click()
        self.page.keyboard.type(keys)
        self.dialog.get_by_text("Run Parameters").click()  # leaving the field, as a user does
        return box.input_value()

    def trigger(self) -> None:
        self.dialog.get_by_role("button", name="Trigger").click()
        self.dialog.wait_for(state="hidden")  # the dialog closes once the run is created


def test_the_trigger_form_in_chromium(airflow, server, broker, spark) -> None:
    """A user in the browser: start right after unpausing (not skipped), stop, an interval that
    is not offered, a negative offset and a reversed range (each refused, saying why); then the
    Data Docs of a validation with a failed warning, logged in and out."""
    topic = new_topic(broker, partitions=2)
    # The default schedule: unpausing queues a run. Its quality DAG runs only when triggered.
    pipeline = make_pipeline(
        airflow.pipelines,
        topic,
        name="uiform",
        # "5 sec" typed into the interval list once took "as the spec says (15 seconds)".
        trigger={"processing_time": "15 seconds"},
        expectations={
            "rows": {"battery_percent": {"column": "battery", "in_range": {"min": 0, "max": 100}}},
            "table": {
                "some_rows": {"row_count": {"min": 1}},
                "a_million_rows": {"row_count": {"min": 1_000_000}, "severity": "warning"},
            },
            "validation": {"schedule": None},
        },
    )
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=7), 100))
    api, log, dag = server.api, server.log, "sluice_uiform"
    api.wait("the DAG to be parsed", lambda: api.call("GET", f"/api/v2/dags/{dag}")[0] == 200, 240, log)

    def manual_runs() -> list[dict[str, Any]]:
        return api.call("GET", f"/api/v2/dags/{dag}/dagRuns?run_type=manual&order_by=-run_after")[1]["dag_runs"]

    def run(form: Form, timeout: float = 300) -> dict[str, str]:
        """Trigger the form; the task states of the run it created, once that has finished."""
        before = len(manual_runs())
        form.trigger()

        def done() -> Any:
            runs = manual_runs()
            return runs[0] if len(runs) > before and runs[0]["state"] in ("success", "failed") else None

        got = api.wait("the run to finish", done, timeout, log)
        path = f"/api/v2/dags/{dag}/dagRuns/{got['dag_run_id']}"
        tasks = {t["task_id"]: t["state"] for t in api.call("GET", f"{path}/taskInstances")[1]["task_instances"]}
        return {"run": got["state"], "id": got["dag_run_id"], **tasks}

    def errors(run_id: str, task: str) -> list[str]:
        got = api.call("GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/{task}/logs/1?full_content=true")
        return [str(e.get("event")) for e in got[1]["content"] if e.get("level") == "error"]

    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.goto(server.url)
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill("s3cret")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda u: "/auth/login" not in u)

        # Start, with the form's defaults: "Unpause on trigger" ticked, Airflow's date backfill off.
        form = Form(page, server.url, dag)
        assert form.dialog.get_by_label(f"Unpause {dag} on trigger").is_checked()
        assert form.dialog.get_by_role("radio", name="Backfill").is_disabled()
        form.pick("action", "start")
        page.keyboard.press("Enter")
        form.pick("trigger", "micro-batches")
        page.keyboard.press("Enter")
        form.pick("processing_time", "soon")  # not an interval: the list offers nothing
        expect(form.dialog.get_by_text("No options")).to_be_visible()
        form.pick("processing_time", "5 sec")
        page.keyboard.press("Enter")
        assert (form.value("action"), form.value("trigger"), form.value("processing_time")) == (
            "start",
            "processing_time",
            "5 seconds",
        )
        started = run(form)
        assert started["run"] == "success" and started["start"] == "success", started
        driver = Driver.read("uiform")
        assert driver is not None and driver.desired == "running", driver
        assert "--processing-time 5 seconds" in " ".join(driver.command), driver.command
        deadline = time.monotonic() + 180
        while read_table_count(spark, pipeline.sink_path) < 100 and time.monotonic() < deadline:
            time.sleep(2)
        assert read_table_count(spark, pipeline.sink_path) == 100

        # Stop.
        form = Form(page, server.url, dag)
        form.pick("action", "stop")
        page.keyboard.press("Enter")
        stopped = run(form)
        assert stopped["run"] == "success" and stopped["stop"] == "success", stopped
        assert drivers.driver_process(pipeline) is None

        # A negative offset: the field does not turn it into 0 (a backfill of everything);
        # it cannot hold it, so the run fails at once, naming the fields.
        form = Form(page, server.url, dag)
        form.pick("action", "backfill")
        page.keyboard.press("Enter")
        assert form.type_number("from_offset", "-5") != "0"
        refused = run(form)
        assert (refused["run"], refused["plan_backfill"], refused["backfill"]) == (
            "failed",
            "failed",
            "upstream_failed",
        ), refused
        assert any("from_offset" in e for e in errors(refused["id"], "plan_backfill")), refused

        # A reversed range: one line saying why, in the task's own log lines.
        form = Form(page, server.url, dag)
        form.pick("action", "backfill")
        page.keyboard.press("Enter")
        form.type_number("from_offset", "50")
        form.type_number("to_offset", "10")
        reversed_ = run(form)
        assert (reversed_["run"], reversed_["plan_backfill"]) == ("failed", "failed"), reversed_
        assert any("the range is empty" in e for e in errors(reversed_["id"], "plan_backfill")), reversed_
        # Where the user reads it: the task's log page says why, with no traceback under it.
        page.goto(f"{server.url}/dags/{dag}/runs/{quote(reversed_['id'], safe='')}/tasks/plan_backfill")
        expect(page.get_by_text("the range is empty").first).to_be_visible(timeout=60_000)
        shown = page.inner_text("body")
        assert "Traceback" not in shown and "Task failed with exception" not in shown, shown[-2000:]
        assert read_table_count(spark, pipeline.sink_path) == 100  # the refused backfills wrote nothing

        # The quality DAG's validate task opens its Data Docs, served by Airflow behind its login.
        quality = f"/api/v2/dags/{dag}_quality"
        assert api.call("PATCH", quality, {"is_paused": False})[0] == 200
        status, checked = api.call("POST", f"{quality}/dagRuns", {"logical_date": None, "conf": {}})
        assert status == 200, checked
        run_path = f"{quality}/dagRuns/{checked['dag_run_id']}"
        state = api.finished("the validation", run_path, 420, log)
        assert state == "success", log.read_text()[-4000:]
        links = api.call("GET", f"{run_path}/taskInstances/validate/links")[1]
        assert links["extra_links"]["Data Docs"].startswith("/sluice-docs/validations/"), links
        page.goto(f"{server.url}/dags/{dag}_quality/runs/{checked['dag_run_id']}/tasks/validate/details")
        button = page.get_by_role("link", name="Data Docs")
        expect(button).to_be_visible(timeout=60_000)
        href = button.get_attribute("href") or ""
        assert href == links["extra_links"]["Data Docs"] and urlparse(href).path.endswith(".html"), href
        task_page = f"/dags/{dag}_quality/runs/{quote(checked['dag_run_id'], safe='')}/tasks/validate"
        failed: list[str] = []
        offline = page.context.new_page()  # the same login; every request but Airflow's own refused
        offline.on("requestfailed", lambda r: failed.append(r.url))
        offline.route(lambda url: not url.startswith(server.url), lambda route: route.abort())
        offline.goto(server.url + href)
        offline.wait_for_load_state("load")
        text = " ".join(offline.inner_text("body").split())
        assert "sluice.uiform" in text and "Status: Succeeded" in text and "Data asset: uiform" in text, text[:500]
        assert not failed, failed
        # The failed warning reads as one, beside the passed rules; the way back is the task's page.
        expect(offline.locator("i.fa-exclamation-circle.text-warning")).to_have_count(1)
        assert " warning" in text and offline.locator("i.fa-times.text-danger").count() == 0
        back = offline.get_by_role("link", name="Back to the task in Airflow")
        assert back.get_attribute("href") == task_page
        favicon = offline.get_attribute('link[rel="shortcut icon"]', "href") or ""
        assert offline.request.get(urljoin(offline.url, favicon)).ok, favicon
        assert offline.evaluate(
            "typeof jQuery === 'function' && typeof jQuery.fn.tab === 'function'"
            " && typeof jQuery.fn.bootstrapTable === 'function'"
        )
        for link in offline.eval_on_selector_all("a[href]", "as => as.map(a => a.href)"):
            assert "greatexpectations.io" not in link, link  # no newsletter, tutorials or credit link
            if link.startswith(f"{server.url}/sluice-docs/"):
                assert offline.request.get(link).ok, link  # every page of the site it links to is served
        back.click()
        offline.wait_for_url(lambda u: "/tasks/validate" in u and "/sluice-docs/" not in u)
        for elsewhere in ("//evil.example/x", "/\t/evil.example", "/\\evil.example", "https://evil.example"):
            offline.goto(f"{server.url}{urlparse(href).path}?{urlencode({'back': elsewhere})}")
            assert offline.get_by_role("link", name="Back to Airflow").get_attribute("href") == "/", elsewhere
        offline.close()
        # Logged out, the button's page sends the browser to Airflow's login, and back after it.
        stranger = browser.new_context().new_page()
        stranger.goto(server.url + href)
        stranger.get_by_label("Username").fill("admin")
        stranger.get_by_label("Password").fill("s3cret")
        stranger.get_by_role("button", name="Sign in").click()
        stranger.wait_for_url(lambda u: "/sluice-docs/" in u, timeout=60_000)
        assert "sluice.uiform" in stranger.inner_text("body")
    # Only the site's own files, even logged in: sent as typed (browsers would resolve the dots).
    conn = http.client.HTTPConnection(urlparse(server.url).netloc, timeout=30)
    conn.request("GET", "/sluice-docs/%2e%2e/%2e%2e/reports/", headers={"Authorization": f"Bearer {api.token}"})
    answer = conn.getresponse()
    assert (answer.status, json.loads(answer.read())["detail"]) == (404, "no such page")
    conn.close()
    # Without Airflow's login, nothing.
    with pytest.raises(urllib.error.HTTPError) as refused_page:
        urllib.request.urlopen(server.url + href, timeout=30)
    assert refused_page.value.code in (401, 403)


def test_a_sigterm_stops_standalone_airflow_whole(server) -> None:
    """Last in this module, for it stops the shared server: SIGTERM to `sluice airflow
    standalone` ends every Airflow process (Airflow's standalone alone left 8 running)."""
    started = time.monotonic()
    left = server.stop()
    took = time.monotonic() - started
    # 0: Airflow's standalone took the SIGINT and stopped its components itself (a stop that
    # needed the group killed ends otherwise); and none of its processes is left anywhere.
    assert (server.proc.returncode, left) == (0, []), f"after {took:.0f}s: {left}"
    print(f"\nsluice airflow standalone stopped whole in {took:.1f}s")
