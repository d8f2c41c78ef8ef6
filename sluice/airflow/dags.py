"""Airflow DAGs built from the pipeline specs: imported by ``dags/sluice_pipelines.py`` only.

Per spec ``sluice_<name>``: scheduled, it supervises the stream (restart it from its checkpoint
if it died, fail when it is stalled or lagging; start it only if the spec says ``autostart``,
and leave it to a run someone triggered meanwhile); triggered
from the UI, a parameter form offers start, stop, restart, supervise and backfill. The
stream itself is launched detached (see :mod:`sluice.ops.drivers`), so no worker slot is
held while it runs. The last task publishes the table's Asset when new batches landed.

Per Delta spec ``sluice_<name>_maintenance``: OPTIMIZE recent partitions, then VACUUM.

``sluice_sql_endpoint`` keeps the SQL endpoint up (see :mod:`sluice.ops.sql`).

Per spec with expectations ``sluice_<name>_quality``: Great Expectations on the newest date
partitions, on the table's asset (after new batches landed) or a schedule, or on a date
range from the trigger form. A failed critical expectation fails it; warnings are logged.

This module only builds DAGs: what a task does is in :mod:`sluice.airflow.tasks`, which
calls the same actions as the CLI. Specs are read, nothing runs at parse time, and pyspark
is never imported.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from sluice import registry
from sluice.airflow import tasks
from sluice.airflow.forms import ACTIONS, endpoint_params, params, quality_params, scheduled_runs
from sluice.airflow.lineage import PipelineOperator
from sluice.airflow.links import ValidateOperator
from sluice.spec import Continuous, Pipeline, SpecError, load_all
from sluice.spec.continuous import ENGINES

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
#: The run types a stream's DAG allows (Airflow 3's DagRunType values, without "backfill").
RUN_TYPES = ["manual", "scheduled", "asset_triggered", "operator_triggered", "asset_materialization"]


def _retried_once(owner: str, delay: timedelta) -> dict[str, Any]:
    """Default arguments of a Sluice task: a transient failure is retried once after ``delay``;
    a refusal (:class:`tasks.Refused`) is not retried at all."""
    return {"owner": owner, "retries": 1, "retry_delay": delay, "retry_policy": tasks.NO_RETRY}


def sluice_dag(dag_id: str, *, tags: Any, **settings: Any) -> DAG:
    """A DAG as every Sluice DAG is: from one start date, no runs for past dates, one run at a
    time, its tags sorted; the rest is each DAG's own."""
    return DAG(dag_id=dag_id, start_date=START_DATE, catchup=False, max_active_runs=1, tags=sorted(tags), **settings)


def table_asset(pipeline: Pipeline) -> Asset:
    path = pipeline.sink_path
    return Asset(name=f"sluice.{pipeline.name}", uri=path if "://" in path else f"file://{path}", group="sluice")


def _doc(pipeline: Pipeline) -> str:
    s = pipeline.spec
    if pipeline.upstream is not None:
        reads = f"| reads | the table of `{pipeline.upstream.name}` |\n"
    else:
        src = pipeline.kafka
        reads = f"| Kafka topics | {', '.join(src.topics or []) or f'pattern `{src.topic_pattern}`'} |\n"
    if s.mode == "continuous":
        c = s.continuous or Continuous()
        output = f"| mode | {ENGINES[c.engine]}, checkpoint every {c.interval} |\n| output | `{pipeline.sink_path}` |\n"
        actions = "**start**, **stop** or **restart**"
    else:
        output = f"| table | {s.sink.format} `{pipeline.sink_path}` (partitioned by `{s.date_partition.column}`) |\n"
        actions = "**start**, **stop**, **restart** or **backfill**"
    return (
        f"### {pipeline.name}\n\n{s.description.strip()}\n\n"
        f"| | |\n|---|---|\n| spec | `{pipeline.spec_path}` |\n{reads}{output}"
        f"| quarantine | `{pipeline.quarantine_path}` |\n| checkpoint | `{pipeline.checkpoint_path}` |\n"
        f"| supervision | every `{s.supervision.schedule}`; stalled after {s.supervision.max_stall}; "
        f"max lag {s.supervision.max_lag or 'unbounded'} |\n\n"
        f"Trigger with a config to {actions}. {scheduled_runs(pipeline)}"
    )


def summary(pipeline: Pipeline, limit: int = 120) -> str:
    """The DAG card's one line: the description's first sentence (the page shows it whole)."""
    text = " ".join(pipeline.spec.description.split()) or f"Sluice pipeline {pipeline.name}"
    first = text.split(". ")[0].rstrip(".") + "."
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def schedule(pipeline: Pipeline) -> Any:
    """The supervision schedule; a derived pipeline's also hangs on its upstream table's
    asset, so a new batch upstream supervises it at once and the lineage graph shows
    raw -> derived."""
    cron = pipeline.spec.supervision.schedule
    if pipeline.upstream is None:
        return cron
    upstream = table_asset(pipeline.upstream)
    if cron is None:
        return [upstream]
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=[upstream])


def pipeline_dag(pipeline: Pipeline) -> DAG:
    s = pipeline.spec
    spec_path = str(pipeline.spec_path)
    asset = table_asset(pipeline)
    default_args = _retried_once(s.owner, timedelta(seconds=30))
    with sluice_dag(
        f"sluice_{pipeline.name}",
        description=summary(pipeline),
        doc_md=_doc(pipeline),
        schedule=schedule(pipeline),
        # Every run type but Airflow's own backfill (a run per past date), which means nothing to
        # a stream; the form's action=backfill re-reads Kafka offsets or times instead.
        allowed_run_types=RUN_TYPES,
        default_args=default_args,
        params=params(pipeline),
        tags={"sluice", "stream", s.sink.format, *s.tags} | ({"continuous"} if s.mode == "continuous" else set()),
        render_template_as_native_obj=False,
    ) as dag:

        @task.branch(task_id="route")
        def route() -> str:
            """The run's action names the task that runs, so the grid shows what each run did."""
            action = get_current_context()["params"]["action"]
            return "plan_backfill" if action == "backfill" else str(action)

        def stream_task(action: str) -> Any:
            if action == "stop":  # touches no data: no lineage to report

                @task(task_id=action)
                def act() -> None:
                    tasks.control(spec_path, action)

                return act()
            return PipelineOperator(
                task_id=action, python_callable=tasks.control, spec_path=spec_path, op_args=[action]
            )

        done = [stream_task(action) for action in ACTIONS if action != "backfill"]
        branches = list(done)
        if s.mode != "continuous" and not pipeline.derived:

            @task(task_id="plan_backfill")
            def plan_backfill() -> str:
                return tasks.plan_backfill(spec_path)

            planned = plan_backfill()
            branches.append(planned)
            done.append(
                PipelineOperator(
                    task_id="backfill",
                    python_callable=tasks.run_backfill,
                    op_args=[planned],
                    spec_path=spec_path,
                )
            )

        @task(task_id="publish", outlets=[asset], trigger_rule="none_failed_min_one_success")
        def publish() -> dict[str, int]:
            return tasks.publish(spec_path, asset)

        route() >> branches
        done >> publish()
    return dag


def maintenance_dag(pipeline: Pipeline) -> DAG:
    s, spec_path = pipeline.spec, str(pipeline.spec_path)
    with sluice_dag(
        f"sluice_{pipeline.name}_maintenance",
        description=f"OPTIMIZE the last {s.maintenance.optimize_days} days and VACUUM the {pipeline.name} "
        f"{s.sink.format} tables",
        doc_md=(
            f"### {pipeline.name} maintenance\n\nCompacts the small files streaming leaves in the last "
            f"{s.maintenance.optimize_days} date partitions of `{pipeline.sink_path}` and its quarantine table "
            f"(`OPTIMIZE ... WHERE {s.date_partition.column} >= ...`), then removes files no version younger than "
            f"{s.maintenance.vacuum_retain_hours} hours references (`VACUUM ... RETAIN ... HOURS`)."
        ),
        schedule=s.maintenance.schedule,
        default_args=_retried_once(s.owner, timedelta(minutes=5)),
        tags={"sluice", "maintenance", s.sink.format, *s.tags},
    ) as dag:
        PipelineOperator(
            task_id="optimize_and_vacuum",
            python_callable=tasks.maintain,
            spec_path=spec_path,
            touches="rewrites_tables",
        )
    return dag


def quality_dag(pipeline: Pipeline) -> DAG:
    s, spec_path = pipeline.spec, str(pipeline.spec_path)
    when = s.expectations.validation.schedule
    schedule: Any = [table_asset(pipeline)] if when == "table_updated" else when
    with sluice_dag(
        f"sluice_{pipeline.name}_quality",
        description=f"Great Expectations on the newest date partitions of the {pipeline.name} table",
        doc_md=(
            f"### {pipeline.name} data quality\n\nValidates the date partitions of `{pipeline.sink_path}` "
            f"against the {len(s.expectations.rows)} row and {len(s.expectations.table)} table expectations "
            f"of `{spec_path}`, one Great Expectations batch per partition. Runs "
            + ("after each update of the table's asset" if when == "table_updated" else f"on `{when}`")
            + ", or from the trigger form for a date range.\n\nA failed **critical** expectation fails the run, "
            "and its log lists each failed expectation; warnings are logged only. The task's **Data Docs** button "
            "opens the pages of what it validated."
        ),
        schedule=schedule,
        default_args=_retried_once(s.owner, timedelta(minutes=1)),
        params=quality_params(pipeline),
        tags={"sluice", "quality", s.sink.format, *s.tags},
    ) as dag:
        ValidateOperator(task_id="validate", python_callable=tasks.validate, spec_path=spec_path)
    return dag


def sql_endpoint_dag() -> DAG:
    """Keeps the SQL endpoint up: every five minutes it is started unless it runs or was
    stopped on purpose; triggered, the form starts, stops or restarts it."""
    with sluice_dag(
        "sluice_sql_endpoint",
        description="Keeps the JDBC/ODBC endpoint (Spark's Thrift server) on the pipelines' tables up.",
        doc_md=(
            "### SQL endpoint\n\nSpark's Thrift JDBC/ODBC server on the catalog of every pipeline's tables "
            "(database `sluice`), read-only. Scheduled runs **supervise**: start it unless it runs or was "
            "stopped on purpose; a hung one is restarted. Trigger with a config to **start**, **stop** or "
            "**restart** it, where the form says: its port, address and logins (empty: the worker's `SLUICE_SQL_*` "
            "settings). Scheduled runs keep it as it was last started. See docs/query.md, Query the tables."
        ),
        schedule="*/5 * * * *",
        default_args=_retried_once("sluice", timedelta(seconds=30)),
        params=endpoint_params(),
        tags={"sluice", "sql"},
    ) as dag:

        @task(task_id="endpoint")
        def endpoint() -> None:
            params = get_current_context()["params"]
            tasks.sql_endpoint(
                str(params["action"]), port=params.get("port"), host=params.get("host"), auth=params.get("auth")
            )

        endpoint()
    return dag


def invalid_spec_dag(spec_file: Path, error: str) -> DAG:
    """A spec that does not validate still shows up, tagged, with its error; its run fails."""
    with sluice_dag(
        f"sluice_{spec_file.stem}",
        description=f"INVALID SPEC: {error}"[:200],
        doc_md=f"### Invalid spec `{spec_file}`\n\n```\n{error}\n```\n\nFix the file; this DAG is rebuilt within a minute.",
        schedule=None,
        default_args={"owner": "sluice", "retries": 0},
        tags={"sluice", "invalid-spec"},
    ) as dag:

        @task(task_id="invalid_spec")
        def invalid() -> None:
            raise AirflowFailException(error)

        invalid()
    return dag


def build_dags() -> dict[str, DAG]:
    """Every spec in the pipelines folder as DAGs, keyed by DAG id."""
    dags: list[DAG] = [sql_endpoint_dag()]
    # A spec clashing with an earlier one is an error here. A registry subject comes from this
    # host's cache: parsing asks the registry only for one it has never fetched.
    for spec_file, pipeline in load_all(schemas=registry.first_time):
        if isinstance(pipeline, SpecError):
            dags.append(invalid_spec_dag(spec_file, str(pipeline)))
            continue
        dags.append(pipeline_dag(pipeline))
        if pipeline.table_format and pipeline.table_format.maintained:
            dags.append(maintenance_dag(pipeline))
        if pipeline.spec.expectations.declared:
            dags.append(quality_dag(pipeline))
    return {d.dag_id: d for d in dags}
