"""The DAG folder as Airflow's own DagBag sees it: one DAG per spec, thin, documented."""

from __future__ import annotations

import json

import pytest

from sluice import config
from sluice.spec import all_pipelines

pytestmark = pytest.mark.e2e

DAGBAG = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag()
print("DAGBAG=" + json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "parse_seconds": sum(s.duration.total_seconds() for s in bag.dagbag_stats),
    "pyspark_imported": any(m == "pyspark" or m.startswith("pyspark.") for m in sys.modules),
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


def test_every_shipped_spec_yields_its_dags(airflow) -> None:
    bag = dagbag(airflow, SLUICE_PIPELINES=str(config.PROJECT_ROOT / "pipelines"))
    assert bag["errors"] == {}
    assert not bag["pyspark_imported"], "parsing dags/ must not import pyspark"
    print(f"\ndags/ parse time (DagBag file stats): {bag['parse_seconds']:.3f}s for {len(bag['dags'])} DAGs")

    pipelines = all_pipelines()
    expected = (
        {f"sluice_{p.name}" for p in pipelines}
        | {f"sluice_{p.name}_maintenance" for p in pipelines if p.spec.sink.format == "delta"}
        | {f"sluice_{p.name}_quality" for p in pipelines if p.spec.expectations.declared}
    )
    assert set(bag["dags"]) == expected
    assert "sluice_payments_quality" in expected
    for p in pipelines:
        dag = bag["dags"][f"sluice_{p.name}"]
        assert {"sluice", "stream", p.spec.sink.format, *p.spec.tags} <= set(dag["tags"])
        assert ("continuous" in dag["tags"]) == (p.spec.mode == "continuous")
        assert dag["owner"] == p.spec.owner
        assert set(dag["retries"].values()) == {1}
        assert p.spec.description.strip().splitlines()[0] in dag["doc"]
        assert p.sink_path in dag["doc"]
        assert dag["tasks"] == ["backfill", "control", "plan_backfill", "publish", "route"]
        assert dag["outlets"] == [p.sink_path if p.spec.mode == "continuous" else f"file://{p.sink_path}"]
        assert dag["paused_on_creation"] is not False
        assert dag["max_active_runs"] == 1
        form = dag["params"]
        if p.spec.mode == "continuous":  # no batches: no backfill, no trigger to choose
            assert form == {"action": form["action"]}
            assert form["action"]["enum"] == ["supervise", "start", "stop", "restart"]
            continue
        assert form["action"]["enum"] == ["supervise", "start", "stop", "restart", "backfill"]
        assert form["trigger"]["enum"] == ["spec", "processing_time", "available_now"]
        assert form["from_offset"]["minimum"] == 0
        assert form["from_time"]["format"] == "date-time"
        assert "pattern" in form["processing_time"]
        if p.spec.expectations.declared:
            quality = bag["dags"][f"sluice_{p.name}_quality"]
            assert {"sluice", "quality", p.spec.sink.format} <= set(quality["tags"])
            assert quality["tasks"] == ["validate"] and quality["max_active_runs"] == 1
            assert quality["asset_schedule"] == [f"sluice.{p.name}"]  # runs when new batches landed
            assert quality["params"]["from_date"]["format"] == "date"
            assert quality["params"]["latest"]["minimum"] == 1
            assert "critical" in quality["doc"] and "data_docs/local_site/index.html" in quality["doc"]
    for name, dag in bag["dags"].items():
        assert dag["retries"] and all(r >= 0 for r in dag["retries"].values()), name
        assert dag["doc"] and dag["description"], name


def test_an_invalid_spec_shows_up_as_a_failing_tagged_dag(airflow, tmp_path) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    good = (config.PROJECT_ROOT / "pipelines" / "payments.yaml").read_text()
    (folder / "payments.yaml").write_text(good)
    (folder / "broken.yaml").write_text(
        good.replace("name: payments", "name: broken").replace("format: delta", "format: csv")
    )
    bag = dagbag(airflow, SLUICE_PIPELINES=str(folder))
    assert bag["errors"] == {}
    assert {"sluice_payments", "sluice_payments_maintenance", "sluice_payments_quality", "sluice_broken"} == set(
        bag["dags"]
    )
    broken = bag["dags"]["sluice_broken"]
    assert "invalid-spec" in broken["tags"]
    assert "sink.format" in broken["description"] and "'parquet' or 'kafka'" in broken["doc"]
