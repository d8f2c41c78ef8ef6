"""The production layout (`sluice cluster up`), once for the module, and its failure drills.

Every server is a process of its own, as on separate hosts: PostgreSQL, Redis, three KRaft
brokers, a Spark master and two workers, S3Proxy, and Airflow's API server, scheduler, DAG
processor, triggerer and two Celery workers acting as the hosts worker-1 and worker-2.
Tables and checkpoints are on s3a://; each drill reads them back from the S3 server with
delta-rs, compares them with what the brokers acknowledged, and reports the records lost
and duplicated (both must be 0) and the time to recover. A drill that kills a server starts
it again (``Layout.up`` starts what is down) so the next one finds the whole layout.
``make test`` runs the tests not marked ``drill``; ``make drills`` runs the drills.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from sluice import config, faults
from sluice.dev.generate import EventGenerator
from sluice.dev.layout import Layout
from sluice.dev.produce import send, synthetic
from sluice.errors import AlreadyRunning
from sluice.ops import drivers, processes, stream, supervision
from sluice.ops.target import LocalTarget
from sluice.records.checkpoint import read_committed
from sluice.records.run import Driver, Status
from sluice.spec import Pipeline
from sluice.topics import create_topics
from tests.fixtures import (
    KAFKA_KEYS,
    Sent,
    all_audit_totals,
    exactly_once,
    kafka_keys,
    make_pipeline,
    python_driver,
    read_verdicts,
    read_without_spark,
    wait_written,
    written_keys,
)

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.fixture(scope="module")
def layout() -> Iterator[Layout]:
    # Not under pytest's temporary folder: PostgreSQL runs as its own user (as root here),
    # which must reach its data folder, and pytest's folders are private to this user.
    home = Path(tempfile.mkdtemp(prefix="sluice-layout-"))
    home.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        # The DAG processor reads the specs the drills write; nothing else of this run's.
        mp.setenv("SLUICE_PIPELINES", str(home / "pipelines"))
        (home / "pipelines").mkdir()
        lay = Layout(home / "cluster")
        began = time.monotonic()
        lay.up(lambda _: None)
        up_in = time.monotonic() - began
        rss = sum(rss for _, _, rss in lay.status())
        print(f"\nlayout up in {up_in:.0f}s, {len(lay.services)} processes, {rss / 2**30:.2f} GiB resident")
        try:
            yield lay
        finally:
            lay.down(lambda _: None)
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def hosts(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> Layout:
    """This test as a host of the layout: its brokers, master, shared run state and S3."""
    for k, v in layout.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_PIPELINES", str(layout.home.parent / "pipelines"))
    return layout


def spec(layout: Layout, topic: str, **fields: Any) -> Pipeline:
    return make_pipeline(
        layout.home.parent / "pipelines",
        topic,
        store=f"s3a://sluice/{uuid.uuid4().hex[:8]}",
        name=fields.pop("name", topic.replace("-", "_")),
        source={"bootstrap_servers": layout.kafka.bootstrap} | fields.pop("source", {}),
        **fields,
    )


def produce(
    layout: Layout, topic: str, gen: EventGenerator, n: int, rate: float | None = None, bad_fraction: float = 0.0
) -> Sent:
    report = send(layout.kafka.bootstrap, topic, synthetic(gen, n, bad_fraction), rate=rate, keep=True)
    return {(topic, d.partition, d.offset) for d in report.delivered}


def running(layout: Layout, name: str) -> psutil.Process:
    service = layout.service(name)
    proc = service.process() if service is not None else None
    assert proc is not None, f"{name} is not running"
    return proc


def driver_log(p: Pipeline) -> str:
    d = Driver.read(p.name)
    return processes.log_tail(d.log, 60) if d is not None and Path(d.log).exists() else f"no driver log for {p.name}"


#: Executor log lines that tell where a continuous branch's records went.
EVIDENCE = r"Seeking to offset|is committing|ProducerConfig values|Exception|ERROR|read \d+ records"


def executor_evidence(layout: Layout, p: Pipeline) -> str:
    """What the executors of ``p``'s Spark application said about reading and writing Kafka:
    the workers' logs stay on their hosts, and the layout is gone after the module."""
    status = Status.read(p.name)
    app = status.app_id if status is not None else None
    found = []
    for log in sorted(layout.home.glob(f"spark-worker-*/{app}/*/stderr")) if app else []:
        said = [ln for ln in log.read_text(errors="replace").splitlines() if re.search(EVIDENCE, ln)]
        found.append(f"== {log.relative_to(layout.home)}\n" + "\n".join(ln[:300] for ln in said[-25:]))
    try:  # offsets still at 0 mean rows queued behind epoch markers; at the end, rows lost
        committed = read_committed(p.checkpoint_path)
        epochs = f"last committed epoch {committed.batch_id}, offsets {committed.offsets}"
    except Exception as exc:  # evidence for a failure message, never the failure itself
        epochs = f"checkpoint unreadable: {exc}"
    return f"app {app}, {epochs}\n" + ("\n".join(found) or "no executor logs")


# --- the layout ---------------------------------------------------------------------------


def test_topics_get_three_copies_two_in_sync(hosts: Layout) -> None:
    bootstrap = hosts.kafka.bootstrap
    [made] = create_topics(bootstrap, ["rf-check"], partitions=3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics("rf-check", timeout=10).topics["rf-check"]
    assert made.partitions == 3 and {len(p.replicas) for p in md.partitions.values()} == {3}
    [conf] = admin.describe_configs([ConfigResource("topic", "rf-check")]).values()
    assert conf.result()["min.insync.replicas"].value == "2"


# --- Kafka and Spark ----------------------------------------------------------------------


@pytest.mark.drill
def test_killing_a_partition_leader_mid_stream_loses_nothing(hosts: Layout, capsys) -> None:
    topic = "leader-drill"
    create_topics(hosts.kafka.bootstrap, [topic], partitions=2)
    p = spec(hosts, topic, trigger={"processing_time": "500 milliseconds"})
    gen = EventGenerator(p, seed=26)
    sent = produce(hosts, topic, gen, 500)
    stream.start(p, LocalTarget(hosts.spark_master), by="drill")
    try:
        wait_written(p, 500, lambda: driver_log(p))
        # A producer keeps writing (acks=all) while the leader of partition 0 is killed.
        report: dict[str, Sent] = {}
        producing = threading.Thread(target=lambda: report.update(sent=produce(hosts, topic, gen, 1500, rate=300)))
        producing.start()
        time.sleep(1.5)
        md = AdminClient({"bootstrap.servers": hosts.kafka.bootstrap}).list_topics(topic, timeout=10).topics[topic]
        leader = md.partitions[0].leader
        victim = next(b for b in hosts.kafka.brokers if b.node_id == leader)
        pid = victim.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        producing.join(180)
        sent |= report["sent"]
        wait_written(p, len(sent), lambda: driver_log(p))
        recovered = time.monotonic() - killed
        st = supervision.status(p)
        assert st.observation.alive, st.verdict.reason  # the stream went on: no restart needed
    finally:
        stream.stop(p, by="drill")
        hosts.up(lambda _: None)  # the broker comes back
    result = exactly_once(p, sent)
    with capsys.disabled():
        print(f"\nleader-kill drill: broker {leader} killed, {result}, every record written {recovered:.1f}s after")
    assert result["lost"] == 0 and result["duplicated"] == 0, result


@pytest.mark.drill
def test_killing_a_spark_worker_mid_batch_loses_nothing(hosts: Layout, capsys) -> None:
    topic = "worker-drill"
    create_topics(hosts.kafka.bootstrap, [topic], partitions=2)
    p = spec(hosts, topic, source={"max_offsets_per_trigger": 200}, trigger={"processing_time": "500 milliseconds"})
    gen = EventGenerator(p, seed=28)
    sent = produce(hosts, topic, gen, 200)
    stream.start(p, LocalTarget(hosts.spark_master), by="drill")
    try:
        wait_written(p, 200, lambda: driver_log(p))
        sent |= produce(hosts, topic, gen, 400)  # two batches' worth of backlog: a batch is running
        # The app has one executor (the master's default share is one core): kill the worker
        # that runs it, with the executor, so the master must place it on the other worker.
        workers = [running(hosts, f"spark-worker-{n}") for n in (1, 2)]
        proc = next(w for w in workers if w.children(recursive=True))
        name = f"spark-worker-{workers.index(proc) + 1}"
        victims = [proc, *proc.children(recursive=True)]  # the worker and its executor JVM
        for v in victims:
            v.kill()
        psutil.wait_procs(victims, timeout=30)
        killed = time.monotonic()
        wait_written(p, len(sent), lambda: driver_log(p))
        recovered = time.monotonic() - killed
        st = supervision.status(p)
        assert st.observation.alive, st.verdict.reason  # the other worker's executor took the tasks over
    finally:
        stream.stop(p, by="drill")
        hosts.up(lambda _: None)  # the worker comes back
    assert running(hosts, name).pid not in {v.pid for v in victims}, f"{name} was not restarted"
    result = exactly_once(p, sent)
    with capsys.disabled():
        print(
            f"\nspark-worker drill: {name} and its executor killed mid-batch, {result}, all written {recovered:.1f}s after"
        )
    assert result["lost"] == 0 and result["duplicated"] == 0, result


# --- every action, from either host's command line ----------------------------------------


def cli(layout: Layout, host: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``sluice ARGS`` typed on ``host``: its own name and local folder; the rest is shared."""
    home = layout.home / "hosts" / host
    home.mkdir(parents=True, exist_ok=True)
    jars = str(config.jars_dir("spark").parent)  # installed once, like the Spark runtime
    env = os.environ | {"SLUICE_HOSTNAME": host, "SLUICE_HOME": str(home), "SLUICE_JARS": jars, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args[3:]} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def seen_from_worker_2(hosts: Layout, p: Pipeline) -> None:
    """worker-2's status of a stream worker-1 runs: no lag left, its lease on worker-1, healthy."""
    deadline = time.monotonic() + 30  # the batch's rows are in; its checkpoint commit follows
    while (st := json.loads(ok(cli(hosts, "worker-2", "status", p.name, "--json"))))["observation"]["lag"]:
        assert time.monotonic() < deadline, st
    assert st["lease"]["host"] == "worker-1" and st["healthy"], st


def test_a_stream_started_on_one_host_is_seen_and_stopped_from_the_other(hosts: Layout) -> None:
    """The production path, at every change: started from worker-1's command line on the Spark
    cluster, its tables and checkpoint on S3; its lag and lease seen from worker-2, which stops
    it; every record once, read with delta-rs from S3. Every other action on the layout is in
    test_every_action_works_from_either_hosts_command_line (`make drills`)."""
    topic = "two-hosts"
    create_topics(hosts.kafka.bootstrap, [topic], partitions=2)
    p = spec(hosts, topic, trigger={"processing_time": "1 second"})
    sent = produce(hosts, topic, EventGenerator(p, seed=32), 300, bad_fraction=0.1)
    try:
        assert f"started {p.name}" in ok(cli(hosts, "worker-1", "start", p.name))
        wait_written(p, 300, lambda: driver_log(p))
        seen_from_worker_2(hosts, p)
        result = exactly_once(p, sent)
        assert result["lost"] == 0 and result["duplicated"] == 0, result
        stopped = ok(cli(hosts, "worker-2", "stop", p.name))
        assert "gracefully on worker-1" in stopped, stopped
    finally:
        cli(hosts, "worker-1", "stop", p.name)


@pytest.mark.drill
@pytest.mark.timeout(1800)  # eight Spark applications in turn: 704 s alone on a slow day (2026-11-25)
def test_every_action_works_from_either_hosts_command_line(hosts: Layout, capsys) -> None:
    """start, status with lag, backfill, audit, validate (GX, its Data Docs served by Airflow),
    SQL, a derived pipeline and a continuous branch, each typed on worker-1 or worker-2: the stream's driver on one host is
    seen, backfilled and stopped from the other; every job runs on the Spark cluster at once
    with the stream (the master gives each one core); tables and checkpoints are on S3."""
    topic = "actions"
    create_topics(hosts.kafka.bootstrap, [topic], partitions=2)
    p = spec(
        hosts,
        topic,
        source={"starting_offsets": "latest"},
        trigger={"processing_time": "1 second"},
        expectations={"table": {"rows": {"row_count": {"min": 1}}, "columns": {"no_unexpected_columns": True}}},
    )
    gen = EventGenerator(p, seed=30)
    early = produce(hosts, topic, gen, 200)  # before the stream starts at the end: only a backfill reads these
    timings: dict[str, float] = {}

    def timed(what: str, done: Callable[[], str]) -> str:
        began = time.monotonic()
        out = done()
        timings[what] = time.monotonic() - began
        return out

    try:
        assert f"started {p.name}" in timed("start", lambda: ok(cli(hosts, "worker-1", "start", p.name)))
        # 'latest' is where the first batch finds the end of the topic, not where start returned.
        deadline = time.monotonic() + 60
        while read_committed(p.checkpoint_path).batch_id is None:
            assert time.monotonic() < deadline, driver_log(p)
            time.sleep(0.5)
        later = produce(hosts, topic, gen, 300, bad_fraction=0.1)
        wait_written(p, 300, lambda: driver_log(p))
        assert not set(written_keys(p)) & early

        seen_from_worker_2(hosts, p)

        out = timed("backfill", lambda: ok(cli(hosts, "worker-2", "backfill", p.name, "--from-offset", "0")))
        assert "500 records" in out, out
        result = exactly_once(p, early | later)
        assert result["lost"] == 0 and result["duplicated"] == 0, result

        batches = json.loads(ok(cli(hosts, "worker-1", "audit", p.name, "--json")))
        assert sum(b["records_in"] for b in batches) == 300
        assert sum(b["records_out"] + b["records_quarantined"] for b in batches) == 300

        rows = read_without_spark("delta", p.sink_path, ["date"]).column("date").to_pylist()
        report = json.loads(timed("validate", lambda: ok(cli(hosts, "worker-2", "validate", p.name, "--json"))))
        assert report["partitions"], report
        for part in report["partitions"]:  # GX counted the rows delta-rs reads from S3
            assert part["rows"] == sum(1 for r in rows if str(r) == part["date"]), (part, len(rows))
        # The quality task's Data Docs button: Airflow's API server, on a host of its own, serves
        # the page worker-2 just built, from the copy on the object store.
        page = "/sluice-docs/" + report["partitions"][0]["docs"].split("/local_site/", 1)[1]
        api = Api(hosts)
        html = api.get(page).decode()
        verdict = "Succeeded" if report["partitions"][0]["success"] else "Failed"
        assert f"sluice.{p.name}" in html and verdict in html, html[:500]
        # Its CSS and JavaScript too: the site's own copies (jobs/quality/offline_docs.py), handed over
        # with the first page that needed them.
        assets = set(re.findall(r'(?:src|href)="([^"]*static/vendor/[^"]+)"', html))
        assert any(a.endswith(".js") for a in assets), html[:2000]
        for asset in assets:
            assert api.get(urllib.parse.urljoin(page, asset)), asset

        query = f"SELECT (SELECT count(*) FROM {p.name}) + (SELECT count(*) FROM {p.name}_quarantine) AS n"
        counted = timed("sql", lambda: ok(cli(hosts, "worker-1", "sql", query)))
        assert " 500 " in counted, counted

        derived = p.spec_path.parent / f"{p.name}_typed.yaml"
        store = p.sink_path.rsplit("/tables/", 1)[0]
        derived.write_text(
            json.dumps(
                {
                    "name": f"{p.name}_typed",
                    "source": {"table": p.name},
                    "filter": "device_type IS NOT NULL",
                    "sink": {"format": "delta", "path": f"{store}/tables/{p.name}_typed"},
                    "checkpoint": f"{store}/checkpoints/{p.name}_typed",
                }
            )
        )
        timed("derived", lambda: ok(cli(hosts, "worker-2", "run", str(derived), "--available-now")))
        upstream = read_without_spark("delta", p.sink_path, ["device_type"]).column("device_type").to_pylist()
        typed = read_without_spark("delta", f"{store}/tables/{p.name}_typed", KAFKA_KEYS)
        assert typed.num_rows == sum(1 for t in upstream if t is not None) > 0
        assert len(set(kafka_keys(typed))) == typed.num_rows

        stopped = timed("stop", lambda: ok(cli(hosts, "worker-2", "stop", p.name)))
        assert "gracefully on worker-1" in stopped, stopped
    finally:
        cli(hosts, "worker-1", "stop", p.name)

    pay = "actions-payments"
    create_topics(hosts.kafka.bootstrap, [pay], partitions=2)
    branch = spec(
        hosts,
        pay,
        name="actions_fraud",
        schema="payment/v1.json",
        mode="continuous",
        event_time={"field": "created_at", "format": "iso8601"},
        sink={"format": "kafka", "topic": f"{pay}-verdicts", "path": None},
        continuous={"emit": "all", "rules": {"large_amount": "amount > 1500"}},
    )
    try:
        timed("continuous start", lambda: ok(cli(hosts, "worker-2", "start", branch.name)))
        sent = send(hosts.kafka.bootstrap, pay, synthetic(EventGenerator(branch, seed=31), 200), keep=True)
        verdicts = read_verdicts(hosts.kafka.bootstrap, f"{pay}-verdicts", 200, timeout=120)
        got = {(v["source"]["partition"], v["source"]["offset"]) for v in verdicts}
        # At least once: each one, maybe twice. CI saw none twice (2026-11-25) while the branch's
        # executors read the records and committed epochs; the evidence is kept for that case.
        assert got == {(d.partition, d.offset) for d in sent.delivered}, (
            f"{len(got)} of {len(sent.delivered)} verdicts\n{driver_log(branch)}\n{executor_evidence(hosts, branch)}"
        )
        flagged = {(v["source"]["partition"], v["source"]["offset"]) for v in verdicts if v["flagged"]}
        large = {
            (d.partition, d.offset)
            for d in sent.delivered
            if d.record.event is not None and (d.record.event.get("amount") or 0) > 1500
        }
        assert flagged == large
    finally:
        ok(cli(hosts, "worker-1", "stop", branch.name))
    with capsys.disabled():
        print("\nactions on the layout: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


# --- Airflow on Celery --------------------------------------------------------------------


class Api:
    """Airflow's REST API as the layout's admin."""

    def __init__(self, layout: Layout) -> None:
        self.base = f"http://127.0.0.1:{layout.ports.airflow}"
        password = json.loads((layout.home / "airflow" / "passwords.json").read_text())["admin"]
        self.token = ""
        self.token = self.call("POST", "/auth/token", {"username": "admin", "password": password})["access_token"]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}
            | ({"Authorization": f"Bearer {self.token}"} if self.token else {}),
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def get(self, path: str) -> bytes:
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()

    def runs(self, dag: str) -> list[dict[str, Any]]:
        try:
            return self.call("GET", f"/api/v2/dags/{dag}/dagRuns?order_by=-run_after&limit=20")["dag_runs"]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return []  # the API server is busy or restarting

    def trigger(self, dag: str, conf: dict[str, Any], timeout: float) -> dict[str, dict[str, Any]]:
        """A manual run with the trigger form's fields, once it ended: its task instances by id."""
        run = self.call("POST", f"/api/v2/dags/{dag}/dagRuns", {"logical_date": None, "conf": conf})
        path = f"/api/v2/dags/{dag}/dagRuns/{run['dag_run_id']}"
        deadline = time.monotonic() + timeout
        while (state := self.call("GET", path)["state"]) not in ("success", "failed"):
            assert time.monotonic() < deadline, f"the {conf} run is still {state} after {timeout:.0f}s"
            time.sleep(1)
        tasks = {t["task_id"]: t for t in self.call("GET", f"{path}/taskInstances")["task_instances"]}
        assert state == "success", f"the {conf} run failed: " + str({k: t["state"] for k, t in tasks.items()})
        return tasks

    def supervised_since(self, dag: str, moment: float) -> bool:
        """A scheduled supervision that started after ``moment`` (epoch seconds) succeeded."""
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment))
        return any(
            r["run_type"] == "scheduled" and r["state"] == "success" and (r.get("start_date") or "") > since
            for r in self.runs(dag)
        )

    def wait_dag(self, dag: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", f"/api/v2/dags/{dag}")
                return
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline, f"{dag} was not parsed in {timeout:.0f}s"
                time.sleep(0.5)


def wait_driver(p: Pipeline, ok: Callable[[Driver], bool], timeout: float, why: str) -> Driver:
    deadline = time.monotonic() + timeout
    while True:
        d = Driver.read(p.name)
        if d is not None and ok(d) and supervision.status(p).observation.alive:
            return d
        assert time.monotonic() < deadline, f"{why}\n{driver_log(p)}"
        time.sleep(1)


@pytest.mark.drill
def test_a_lost_celery_worker_and_a_restarted_scheduler_lose_no_stream(hosts: Layout, capsys) -> None:
    """SIGKILL the Celery worker whose supervision started a stream, with every process it
    started (the stream's driver too: the host is gone): the other worker's next scheduled
    supervision starts it again. Then restart the scheduler while the stream runs: the
    stream goes on, and supervision runs again once the scheduler is back. Last, a backfill
    and a stop from the trigger form, on either worker."""
    topic = "celery-drill"
    create_topics(hosts.kafka.bootstrap, [topic], partitions=2)
    p = spec(
        hosts,
        topic,
        trigger={"processing_time": "1 second"},
        # Every 30 s (croniter's sixth field is the second): the drill waits for two of them.
        # autostart: deployed from code, the first scheduled supervision starts the stream.
        supervision={"schedule": "* * * * * */30", "backoff": "1 second", "autostart": True},
    )
    dag = f"sluice_{p.name}"
    api = Api(hosts)
    api.wait_dag(dag)
    gen = EventGenerator(p, seed=29)
    sent = produce(hosts, topic, gen, 300)
    api.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})  # scheduled supervision starts it
    try:
        first = wait_driver(p, lambda d: True, 180, "the scheduled supervision did not start the stream")
        wait_written(p, len(sent), lambda: driver_log(p))
        host = first.host
        assert host in ("worker-1", "worker-2"), host

        # The host dies (between two supervisions: a task it held would wait for Airflow to
        # fail it): its Celery worker and everything it started, the detached driver too.
        while any(r["state"] in ("queued", "running") for r in api.runs(dag)):
            time.sleep(0.5)
        proc = running(hosts, f"airflow-worker-{host.split('-')[-1]}")
        victims = [proc, *proc.children(recursive=True)]
        for d in psutil.process_iter():
            try:
                if d.environ().get("SLUICE_HOSTNAME") == host and d not in victims:
                    victims.append(d)
            except psutil.Error:
                continue
        for v in victims:
            try:
                v.kill()
            except psutil.Error:
                continue
        killed = time.monotonic()
        sent |= produce(hosts, topic, gen, 300)
        other = "worker-2" if host == "worker-1" else "worker-1"
        second = wait_driver(
            p, lambda d: d.host == other and d.launched_at > first.launched_at, 150, f"{other} did not restart it"
        )
        restarted = time.monotonic() - killed
        wait_written(p, len(sent), lambda: driver_log(p))
        all_written = time.monotonic() - killed
        # No takeover before the lease (30 s) runs out, then the next pass (every 30 s) and a launch.
        assert restarted <= 30 + 30 + 30, f"restarted {restarted:.0f}s after the kill: more than the lease and a pass"

        # The scheduler restarts while the stream runs.
        sproc = running(hosts, "airflow-scheduler")
        sproc.terminate()
        psutil.wait_procs([sproc, *sproc.children(recursive=True)], timeout=60)
        stopped_at = time.time()
        sent |= produce(hosts, topic, gen, 300)  # the stream does not need the scheduler
        wait_written(p, len(sent), lambda: driver_log(p))
        began = time.monotonic()
        hosts.up(lambda _: None)  # the scheduler, and the Celery worker killed above

        while not api.supervised_since(dag, stopped_at):
            assert time.monotonic() - began < 180, "no scheduled supervision succeeded after the restart"
            time.sleep(0.5)
        back = time.monotonic() - began
        assert Driver.read(p.name) == second  # the same driver: the restart disturbed nothing

        # A user's actions from the trigger form run on whichever worker Celery hands them to:
        # a backfill over what the stream wrote (it adds nothing), then a stop that the
        # scheduled supervisions after it respect.
        workers = {}
        for conf, task in (({"action": "backfill", "from_offset": 0}, "backfill"), ({"action": "stop"}, "stop")):
            ran = api.trigger(dag, conf, timeout=420)
            assert ran[task]["state"] == "success" and ran["publish"]["state"] in ("success", "skipped"), ran
            workers[task] = ran[task]["hostname"]
            assert workers[task] in ("worker-1", "worker-2"), ran[task]
        stopped_at = time.time()
        assert not supervision.status(p).observation.alive
        while not api.supervised_since(dag, stopped_at):
            assert time.time() - stopped_at < 120, "no scheduled supervision succeeded after the stop"
            time.sleep(0.5)
        assert not supervision.status(p).observation.alive, "supervision started what the user stopped"
    finally:
        api.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": True})
        stream.stop(p, by="drill")
    result = exactly_once(p, sent)
    with capsys.disabled():
        print(
            f"\ncelery-worker drill: {host} killed, {other} restarted the stream {restarted:.1f}s after "
            f"(every record written {all_written:.1f}s after); scheduler restart: supervision ran again "
            f"{back:.1f}s after; a backfill and a stop from the trigger form ran on {workers['backfill']} and "
            f"{workers['stop']}; {result}"
        )
    assert result["lost"] == 0 and result["duplicated"] == 0, result


# --- a random schedule of faults across hosts ----------------------------------------------
# Last in this module: a store outage can leave Airflow's servers needing a restart, which the
# layout does not supervise (docs/cluster.md), and the drills above rely on its scheduler.

#: What a schedule does between batches: kill the driver's host, pause a driver at a named
#: point of its commit path while the other host takes over, stop the run-state store for
#: less or more than the lease, restart the S3 server, kill a partition's leader.
STEPS = ("kill", "pause", "store", "s3", "leader")
PAUSE_POINTS = {
    "delta": ["delta.before-write", "batch.written"],
    "parquet": ["parquet.before-commit", "parquet.after-commit", "batch.written"],
}
SCHEDULE_TTL = 8.0


class Schedule:
    """One seeded schedule on the layout: a stream on S3 that the steps above hit in turn,
    its records checked at the end by readers that are not Spark."""

    def __init__(self, layout: Layout, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.layout, self.rng, self.mp = layout, random.Random(seed), monkeypatch
        self.fmt = self.rng.choice(["delta", "parquet"])
        self.steps = [self.rng.choice(STEPS) for _ in range(int(os.environ.get("SLUICE_LAYOUT_STEPS", "3")))]
        topic = f"schedule-{seed}-{self.fmt}"
        create_topics(layout.kafka.bootstrap, [topic], partitions=2)
        self.p = spec(
            layout,
            topic,
            sink={"format": self.fmt},
            source={"max_offsets_per_trigger": 100},
            trigger={"processing_time": "500 milliseconds"},
            supervision={"backoff": "1 second", "max_failures": 10},
        )
        self.topic, self.gen, self.sent = topic, EventGenerator(self.p, seed=seed), set()
        self.host, self.said = 0, []
        self.target = LocalTarget(layout.spark_master)

    def produce(self, n: int) -> None:
        self.sent |= produce(self.layout, self.topic, self.gen, n, bad_fraction=0.05)

    def launch(self, pause_at: str | None = None) -> stream.Started:
        """Start the stream on the next host (paused at ``pause_at`` in its first batch, if given)."""
        self.host = 1 - self.host
        self.mp.setenv("SLUICE_HOSTNAME", f"worker-{self.host + 1}")
        if pause_at:
            self.mp.setenv(faults.ENV, f"pause@{pause_at}")
        try:
            return stream.start(self.p, self.target, by=f"schedule on worker-{self.host + 1}")
        finally:
            self.mp.delenv(faults.ENV, raising=False)

    def taken_over(self) -> stream.Started:
        """Once the lease of a driver that stopped answering ran out (no host takes it sooner),
        the other host starts the stream."""
        began = time.monotonic()
        other = f"worker-{2 - self.host}"
        self.mp.setenv("SLUICE_HOSTNAME", other)
        with pytest.raises(AlreadyRunning, match=f"already running on worker-{self.host + 1}"):
            stream.start(self.p, self.target, by=f"schedule on {other}")  # its lease is live: refused
        while drivers.running(self.p) is not None:
            assert time.monotonic() - began < SCHEDULE_TTL + 30, "the lease did not expire"
            time.sleep(0.2)
        return self.launch()

    def all_written(self, timeout: float = 300) -> None:
        """Wait for every record, starting the stream again if it stopped (supervision's part)."""
        began = time.monotonic()
        while len(set(written_keys(self.p))) < len(self.sent):
            if drivers.running(self.p) is None:
                self.said.append("restarted by supervision")
                supervision.supervise(self.p, self.target, by="schedule")
            assert time.monotonic() - began < timeout, driver_log(self.p)
            time.sleep(1)

    def step(self, name: str) -> None:
        self.produce(self.rng.randint(100, 300))
        getattr(self, name)()
        self.all_written()

    def kill(self) -> None:
        driver = Driver.read(self.p.name)
        assert driver is not None
        os.killpg(os.getpgid(driver.pid), signal.SIGKILL)  # the driver and its JVM: the host is gone
        self.taken_over()

    def pause(self) -> None:
        stream.stop(self.p, by="schedule")
        point = self.rng.choice(PAUSE_POINTS[self.fmt])
        paused = self.launch(pause_at=point)
        self.produce(100)  # a batch to pause in
        job = python_driver(paused)
        deadline = time.monotonic() + 240
        while job.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, f"the driver did not pause at {point}\n{paused.log_tail()}"
            time.sleep(0.2)
        self.taken_over()
        self.all_written()  # the batch it paused in, written by the other host
        os.killpg(os.getpgid(paused.driver.pid), signal.SIGCONT)  # the driver and its JVM
        code = psutil.Process(paused.driver.pid).wait(timeout=180)
        assert code == 5, f"paused at {point}, then went on: exit {code}\n{paused.log_tail(40)}"
        self.said.append(f"paused at {point}")

    def store(self) -> None:
        driver = Driver.read(self.p.name)
        pg = self.layout.postgres
        pg.stop(remove=False)
        down = self.rng.choice([SCHEDULE_TTL / 3, SCHEDULE_TTL + 4])
        time.sleep(down)
        self.layout.up(lambda _: None)  # PostgreSQL, and the Airflow servers that exited without it
        self.said.append(f"store down {down:.0f}s")
        self.all_written()
        assert Driver.read(self.p.name) == driver, "the stream was restarted over a store outage"

    def s3(self) -> None:
        server = self.layout.service("s3")
        proc = server.process() if server is not None else None
        assert proc is not None
        proc.kill()
        proc.wait(30)
        time.sleep(3)
        self.layout.up(lambda _: None)

    def leader(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.layout.kafka.bootstrap})
        leader = admin.list_topics(self.topic, timeout=10).topics[self.topic].partitions[0].leader
        victim = next(b for b in self.layout.kafka.brokers if b.node_id == leader)
        pid = victim.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        self.produce(100)  # acks=all: two copies of three still take them
        self.all_written()
        self.layout.up(lambda _: None)  # the broker comes back


@pytest.mark.drill
def test_a_random_schedule_of_faults_across_hosts_loses_and_doubles_nothing(
    hosts: Layout, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Seeded schedules of kills, pauses at named points, store outages, S3 restarts and
    leader kills, on a stream whose driver moves between the hosts: every record the brokers
    acknowledged is in the table or its quarantine once, read from S3 with delta-rs or
    pyarrow, and the audits reconcile. One schedule a run; replay one with
    ``SLUICE_LAYOUT_SEED=<seed>``, run more with ``SLUICE_LAYOUT_SCHEDULES=5``."""
    monkeypatch.setenv("SLUICE_LEASE_TTL", str(SCHEDULE_TTL))
    given = os.environ.get("SLUICE_LAYOUT_SEED")
    seeds = (
        [int(given)]
        if given
        else [random.randrange(10**6) for _ in range(int(os.environ.get("SLUICE_LAYOUT_SCHEDULES", "1")))]
    )
    for seed in seeds:
        run = Schedule(hosts, seed, monkeypatch)
        began = time.monotonic()
        run.produce(200)
        run.launch()
        try:
            for name in run.steps:
                run.step(name)
        finally:
            if drivers.running(run.p) is not None:
                stream.stop(run.p, by="schedule")
        result = exactly_once(run.p, run.sent)
        with capsys.disabled():
            print(
                f"\nlayout schedule {seed} ({run.fmt} on S3): {' -> '.join(run.steps)}; {'; '.join(run.said)}; "
                f"{result} in {time.monotonic() - began:.0f}s (replay: SLUICE_LAYOUT_SEED={seed})"
            )
        assert result["lost"] == 0 and result["duplicated"] == 0, (seed, result)
        totals = all_audit_totals(run.p)
        assert totals["records_in"] == totals["records_out"] + totals["records_quarantined"], (seed, totals)
