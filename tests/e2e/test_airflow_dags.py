"""The DAG folder as Airflow's own DagBag sees it: one DAG per spec, thin, documented."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest
import yaml

from sluice import config
from sluice.spec import all_pipelines
from sluice.spec import registry as spec_registry

pytestmark = pytest.mark.e2e

DAGBAG = """
import json, sys
# Every attempt from Python to reach a host while the DAG files are parsed (imports before this
# line only; librdkafka's own connections are C, unseen here: the factory imports no Kafka client).
reached = []
ASKS = ("socket.connect", "socket.getaddrinfo")
sys.addaudithook(lambda event, args: reached.append(f"{event} {args!r}") if event in ASKS else None)
from airflow.dag_processing.dagbag import DagBag
bag = DagBag()
print("DAGBAG=" + json.dumps({
    "reached": reached,
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "parse_seconds": sum(s.duration.total_seconds() for s in bag.dagbag_stats),
    "pyspark_imported": any(m == "pyspark" or m.startswith("pyspark.") for m in sys.modules),
    "kafka_imported": "confluent_kafka" in sys.modules,
    "dags": {
        d.dag_id: {
            "tags": sorted(d.tags),
            "owner": d.owner,
            "retries": {t.task_id: t.retries for t in d.tasks},
            "doc": d.doc_md or "",
            "description": d.description or "",
            "params": {k: v.schema for k, v in d.params.items()},
            "tasks": sorted(t.task_id for t in d.tasks),
            "outlets": sorted(a.uri for t in d.tasks for a in t.outlets),
            "paused_on_creation": d.is_paused_upon_creation,
            "max_active_runs": d.max_active_runs,
            "run_types": sorted(str(getattr(t, "value", t)) for t in d.allowed_run_types or ()),
            "asset_schedule": sorted(a.name for a in getattr(getattr(d.timetable, "asset_condition", None), "objects", ())),
        }
        for d in bag.dags.values()
    },
}))
"""


def dagbag(airflow, **env) -> dict:
    done = airflow.python(DAGBAG, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("DAGBAG="))
    return json.loads(line.removeprefix("DAGBAG="))


def typed_then_enter(schema: dict, typed: str) -> str | None:
    """What Airflow's list field takes when a user types into it and presses Enter: the first
    option whose label holds the text, ignoring case (its FieldDropdown)."""
    shown = schema.get("values_display", {})
    labels = [(v, shown.get("null" if v is None else str(v), str(v))) for v in schema["enum"]]
    return next(v for v, label in labels if typed.lower() in label.lower())


def test_every_shipped_spec_yields_its_dags(airflow, tmp_path) -> None:
    # A DAG processor on a host without the Spark runtime parses them too: no jars, no SPARK_HOME.
    no_jars = tmp_path / "no-jars"
    no_jars.mkdir()
    bag = dagbag(
        airflow, SLUICE_PIPELINES=str(config.PROJECT_ROOT / "pipelines"), SLUICE_JARS=str(no_jars), SPARK_HOME=""
    )
    assert bag["errors"] == {}
    assert not bag["pyspark_imported"], "parsing dags/ must not import pyspark"
    print(f"\ndags/ parse time (DagBag file stats): {bag['parse_seconds']:.3f}s for {len(bag['dags'])} DAGs")

    pipelines = all_pipelines()
    expected = (
        {f"sluice_{p.name}" for p in pipelines}
        | {f"sluice_{p.name}_maintenance" for p in pipelines if p.spec.sink.format == "delta"}
        | {f"sluice_{p.name}_quality" for p in pipelines if p.spec.expectations.declared}
        | {"sluice_sql_endpoint"}
    )
    assert set(bag["dags"]) == expected
    assert "sluice_payments_quality" in expected
    endpoint = bag["dags"]["sluice_sql_endpoint"]["params"]  # its port is a setting of the DAG's form
    assert endpoint["port"]["allOf"] == [{"minimum": 1, "maximum": 65535}] and "minimum" not in endpoint["port"]
    assert endpoint["auth"]["enum"] == [None, "none", "password"]
    assert {"sluice_github_pushes", "sluice_github_sessions"} <= expected
    for p in pipelines:
        dag = bag["dags"][f"sluice_{p.name}"]
        assert {"sluice", "stream", p.spec.sink.format, *p.spec.tags} <= set(dag["tags"])
        assert ("continuous" in dag["tags"]) == (p.spec.mode == "continuous")
        assert dag["owner"] == p.spec.owner
        assert set(dag["retries"].values()) == {1}
        assert p.spec.description.strip().splitlines()[0] in dag["doc"]
        assert p.sink_path in dag["doc"]
        actions = ["publish", "restart", "route", "start", "stop", "supervise"]  # the grid shows which one ran
        if p.spec.mode == "continuous" or p.derived:
            assert dag["tasks"] == actions
        else:
            assert dag["tasks"] == sorted([*actions, "plan_backfill", "backfill"])
        assert dag["outlets"] == [p.sink_path if p.spec.mode == "continuous" else f"file://{p.sink_path}"]
        assert dag["paused_on_creation"] is not False
        assert dag["max_active_runs"] == 1
        assert "backfill" not in dag["run_types"] and {"manual", "scheduled", "asset_triggered"} <= set(
            dag["run_types"]
        )
        form = dag["params"]
        if p.spec.mode == "continuous":  # no batches: no backfill, no trigger to choose
            assert form == {"action": form["action"]}
            assert form["action"]["enum"] == ["supervise", "start", "stop", "restart"]
            continue
        if p.upstream is not None:  # hangs on its upstream's asset: lineage raw -> derived
            assert dag["asset_schedule"] == [f"sluice.{p.upstream.name}"]
            assert form["action"]["enum"] == ["supervise", "start", "stop", "restart"]
            assert "from_offset" not in form and f"the table of `{p.upstream.name}`" in dag["doc"]
            continue
        assert form["action"]["enum"] == ["supervise", "start", "stop", "restart", "backfill"]
        assert form["trigger"]["enum"] == ["spec", "processing_time", "available_now"]
        # The bound is nested: the form's number field clamps to a top-level minimum (-5 became 0).
        assert form["from_offset"]["allOf"] == [{"minimum": 0}] and "minimum" not in form["from_offset"]
        assert form["from_time"]["format"] == "date-time"
        intervals = form["processing_time"]
        assert intervals["enum"][-1] is None and "1 minute" in intervals["enum"]
        for offered in intervals["enum"][:-1]:  # "5 sec" + Enter takes 5 seconds, whatever the spec's
            number, unit = offered.split()
            assert typed_then_enter(intervals, f"{number} {unit[:3]}") == offered, (p.name, offered)
        if p.spec.expectations.declared:
            quality = bag["dags"][f"sluice_{p.name}_quality"]
            assert {"sluice", "quality", p.spec.sink.format} <= set(quality["tags"])
            assert quality["tasks"] == ["validate"] and quality["max_active_runs"] == 1
            assert quality["asset_schedule"] == [f"sluice.{p.name}"]  # runs when new batches landed
            assert quality["params"]["from_date"]["format"] == "date"
            assert quality["params"]["latest"]["minimum"] == 1
            assert "critical" in quality["doc"] and "**Data Docs** button" in quality["doc"]
    for name, dag in bag["dags"].items():
        assert dag["retries"] and all(r >= 0 for r in dag["retries"].values()), name
        assert dag["doc"] and dag["description"], name


def test_parsing_the_dags_reaches_no_host(airflow, tmp_path, monkeypatch) -> None:
    # The DAG processor parses the folder every few seconds, on a host where the broker, the
    # schema registry and the store may be away: no address is asked. A registry subject this
    # host fetched once is read from its cache (the tasks ask the registry again at run time).
    nowhere = "127.0.0.1:9"
    home, folder = tmp_path / "home", tmp_path / "pipelines"
    folder.mkdir()
    for shipped in (config.PROJECT_ROOT / "pipelines").glob("*.yaml"):
        shutil.copy(shipped, folder / shipped.name)
    monkeypatch.setenv("SLUICE_HOME", str(home))
    ref = spec_registry.RegistrySchema(registry=f"http://{nowhere}", subject="orders-value")
    order = {
        "type": "object",
        "required": ["id", "ts"],
        "properties": {"id": {"type": "string"}, "ts": {"type": "integer"}},
    }
    cache = spec_registry.cache_dir(ref)
    cache.mkdir(parents=True)
    (cache / "v3.json").write_text(json.dumps(spec_registry.to_struct(order, "orders-value").to_json()))
    (folder / "orders.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "orders",
                "source": {"topics": ["orders"]},
                "schema": ref.model_dump(),
                "event_time": {"field": "ts", "format": "epoch_seconds"},
                "sink": {"path": "tables/orders"},
                "checkpoint": "checkpoints/orders",
            }
        )
    )
    bag = dagbag(
        airflow,
        SLUICE_PIPELINES=str(folder),
        SLUICE_HOME=str(home),
        SLUICE_KAFKA_BOOTSTRAP=nowhere,
        SLUICE_STORE=f"s3a://{nowhere}/nowhere",
    )
    assert bag["errors"] == {}
    assert "start" in bag["dags"]["sluice_orders"]["tasks"] and "sluice_payments" in bag["dags"]
    assert bag["reached"] == [] and not bag["kafka_imported"]


def test_an_invalid_spec_shows_up_as_a_failing_tagged_dag(airflow, tmp_path) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    good = (config.PROJECT_ROOT / "pipelines" / "payments.yaml").read_text()
    (folder / "payments.yaml").write_text(good)
    (folder / "broken.yaml").write_text(
        good.replace("name: payments", "name: broken").replace("format: delta", "format: csv")
    )
    (folder / "twin.yaml").write_text(good)  # the same name, table and checkpoint as payments.yaml
    bag = dagbag(airflow, SLUICE_PIPELINES=str(folder))
    assert bag["errors"] == {}
    assert {
        "sluice_payments",
        "sluice_payments_maintenance",
        "sluice_payments_quality",
        "sluice_broken",
        "sluice_twin",
        "sluice_sql_endpoint",
    } == set(bag["dags"])
    broken = bag["dags"]["sluice_broken"]
    assert "invalid-spec" in broken["tags"]
    assert "sink.format" in broken["description"] and "'parquet' or 'kafka'" in broken["doc"]
    twin = bag["dags"]["sluice_twin"]  # refused, naming both files, instead of silently replacing a DAG
    assert "invalid-spec" in twin["tags"] and str(folder / "payments.yaml") in twin["doc"]
    assert str(folder / "twin.yaml") in twin["doc"]


TARGET = """
import json
from sluice.airflow.target import AirflowTarget, check_provider
from sluice.airflow.tasks import NO_RETRY, as_task_state
from sluice.errors import AlreadyRunning, InvalidInput, JobFailed, NothingToDo, StreamUnhealthy
from sluice.ops.submit import ingest_submission
from sluice.ops.target import LocalTarget

check_provider()  # the private members the target relies on are still there
sub = ingest_submission("p.yaml", pipeline_name="p", available_now=True)
command, env = AirflowTarget().launch_command(sub)
local, _ = LocalTarget(AirflowTarget().master).launch_command(sub)
states = {}
for exc in (NothingToDo("n"), AlreadyRunning("a"), InvalidInput("i"), StreamUnhealthy("s"), JobFailed("j")):
    try:
        with as_task_state():
            raise exc
    except BaseException as raised:
        states[type(exc).__name__] = type(raised).__name__
        # What the DAGs' retry policy decides for it.
        states[type(exc).__name__] += "/" + NO_RETRY.evaluate(raised, 1, 2).action.value
print("TARGET=" + json.dumps({"command": command, "local": local, "master": AirflowTarget().master,
                              "env": env, "states": states}))
"""


def test_the_airflow_target_builds_the_local_command_through_the_provider(airflow) -> None:
    """Fails loudly when a provider release changes the private members the target uses."""
    done = airflow.python(
        TARGET, env={"AIRFLOW_CONN_SLUICE_SPARK": json.dumps({"conn_type": "spark", "host": "local[3]"})}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("TARGET=")).removeprefix("TARGET="))
    assert got["master"] == "local[3]"
    assert got["command"][0].endswith("spark-submit") and got["command"][1:3] == ["--master", "local[3]"]
    # The provider orders options its own way; the same options and application must reach spark-submit.
    assert sorted(got["command"][1:]) == sorted(got["local"][1:])
    assert got["command"][-4:] == got["local"][-4:] == [got["local"][-4], "--spec", "p.yaml", "--available-now"]
    assert got["env"]["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert got["states"] == {
        "NothingToDo": "AirflowSkipException/default",
        "AlreadyRunning": "AirflowSkipException/default",
        # A refusal fails at once, in one line; a transient failure is retried.
        "InvalidInput": "Refused/fail",
        "StreamUnhealthy": "Refused/fail",
        "JobFailed": "RuntimeError/default",
    }


# Two Thrift servers and five `airflow dags test` runs; the endpoint's supervision logic is in
# tests/unit/test_sql.py and its serving in tests/integration/test_sql_endpoint.py.
@pytest.mark.drill
def test_the_sql_endpoint_dag_keeps_the_endpoint_up_unless_stopped_on_purpose(airflow, tmp_path) -> None:
    """Started from the form on a port of its own (by a restart, which is a stop, here of
    nothing, then a start), kept up on that port after a crash (not on the worker's
    SLUICE_SQL_PORT), left alone once stopped."""
    from sluice.dev.ports import free_port
    from sluice.ops import sql

    port, workers = free_port(), free_port()
    env = {"SLUICE_PIPELINES": str(tmp_path), "SLUICE_SQL_PORT": str(workers)}
    try:
        up = airflow.dags_test("sluice_sql_endpoint", {"action": "restart", "port": port}, env=env)
        assert up.state == "success", up.log[-3000:]
        # No pipeline here; the event log (sluice_events) is served once any stream has written it.
        assert re.search(r"launched the SQL endpoint on local\[2\]: serving [01] table\(s\)", up.log), up.log[-3000:]
        running = sql.running()
        assert running is not None and running.port == port and not running.allow_writes
        again = airflow.dags_test("sluice_sql_endpoint", {"action": "supervise"}, env=env)
        assert again.state == "success" and "the SQL endpoint is up" in again.log

        proc = sql.endpoint_process()
        assert proc is not None
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)  # a crash, not a stop on purpose
        revived = airflow.dags_test("sluice_sql_endpoint", {"action": "supervise"}, env=env)
        assert revived.state == "success" and "launched the SQL endpoint" in revived.log, revived.log[-3000:]
        running = sql.running()
        assert running is not None and running.port == port  # as last started, not the worker's port

        stopped = airflow.dags_test("sluice_sql_endpoint", {"action": "stop"}, env=env)
        assert stopped.state == "success" and "stopped the SQL endpoint" in stopped.log
        assert sql.running() is None
        left = airflow.dags_test("sluice_sql_endpoint", {"action": "supervise"}, env=env)
        assert left.state == "success" and "left stopped on purpose" in left.log
        assert sql.running() is None
    finally:
        sql.stop(by="test")
