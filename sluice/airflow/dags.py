"""Airflow DAGs built from the pipeline specs: imported by ``dags/sluice_pipelines.py`` only.

Per spec ``sluice_<name>``: scheduled, it supervises the stream (start it if it never ran,
restart it from its checkpoint if it died, fail when it is stalled or lagging); triggered
from the UI, a parameter form offers start, stop, restart, supervise and backfill. The
stream itself is launched detached (see :mod:`sluice.ops.stream`), so no worker slot is
held while it runs. The last task publishes the table's Asset when new batches landed.

Per Delta spec ``sluice_<name>_maintenance``: OPTIMIZE recent partitions, then VACUUM.

Per spec with expectations ``sluice_<name>_quality``: Great Expectations on the newest date
partitions, on the table's asset (after new batches landed) or a schedule, or on a date
range from the trigger form. A failed critical expectation fails it; warnings are logged.

Bounded work (backfill, maintenance) runs through the Spark provider's
``SparkSubmitOperator``; the long-lived stream is launched with the command the provider's
``SparkSubmitHook`` builds from the same connection, then left running. Everything here
only builds objects: specs are read, nothing runs at parse time, pyspark is never imported.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from sluice import config
from sluice.airflow.env import CONN_ID
from sluice.ops.submit import (
    check_continuous_slots,
    ingest_submission,
    maintenance_submission,
    submit_env,
    validation_submission,
)
from sluice.records.locks import Claimed
from sluice.records.validation import Selection, new_report_path, quality_home, read_report
from sluice.spec import Pipeline, SpecError, load_pipeline

if TYPE_CHECKING:
    from sluice.ops.stream import Driver

# Task code imports sluice.ops.stream (psutil, confluent-kafka) when it runs, not at parse time.
log = logging.getLogger("sluice.dags")

START_DATE = datetime(2026, 1, 1)
ACTIONS = ["supervise", "start", "stop", "restart", "backfill"]
DURATION_PATTERN = r"^\d+(\.\d+)?\s*(milliseconds?|ms|seconds?|s|minutes?|min|hours?|h)$"


def table_asset(pipeline: Pipeline) -> Asset:
    path = pipeline.sink_path
    return Asset(name=f"sluice.{pipeline.name}", uri=path if "://" in path else f"file://{path}", group="sluice")


def optional(kind: str, **schema: Any) -> Param:
    """A field of a trigger form that may stay empty."""
    return Param(None, type=["null", kind], **schema)


def params(pipeline: Pipeline) -> dict[str, Param]:
    """The trigger form. JSON Schema validates each field before a run is created."""
    if pipeline.spec.mode == "continuous":  # no batches: nothing to backfill, no trigger to pick
        return {
            "action": Param(
                "supervise",
                enum=[a for a in ACTIONS if a != "backfill"],
                title="Action",
                description="supervise: start/restart if needed, fail if stalled. stop: stop the continuous query "
                "(at least once: records since the last epoch are read again on start).",
            )
        }
    default_interval = pipeline.spec.trigger.processing_time or "10 seconds"
    return {
        "action": Param(
            "supervise",
            enum=ACTIONS,
            title="Action",
            description="supervise: start/restart if needed, fail if stalled. stop: after the current batch commits. "
            "backfill: re-read a range the stream has already committed into the same tables (records they "
            "hold are skipped; later offsets are the stream's own and are refused), so no record lands twice.",
        ),
        "trigger": Param(
            "spec",
            enum=["spec", "processing_time", "available_now"],
            values_display={
                "spec": f"as the spec says ({'available now' if pipeline.spec.trigger.available_now else default_interval})",
                "processing_time": "micro-batches every 'processing_time'",
                "available_now": "process what is in Kafka now, then end",
            },
            title="Trigger mode",
            description="For start and restart.",
        ),
        "processing_time": Param(
            default_interval,
            type="string",
            pattern=DURATION_PATTERN,
            title="Micro-batch interval",
            description="Used with trigger mode 'processing_time', e.g. '30 seconds'.",
        ),
        "from_offset": optional(
            "integer",
            minimum=0,
            title="Backfill from offset",
            description="First offset, on every partition (included).",
            section="Backfill range: offsets or times",
        ),
        "to_offset": optional(
            "integer",
            minimum=0,
            title="Backfill to offset",
            description="End offset (excluded); empty: up to the end of the topic.",
            section="Backfill range: offsets or times",
        ),
        "from_time": optional(
            "string",
            format="date-time",
            title="Backfill from time",
            description="First record time (Kafka timestamp, included).",
            section="Backfill range: offsets or times",
        ),
        "to_time": optional(
            "string",
            format="date-time",
            title="Backfill to time",
            description="End time (excluded); empty: up to now.",
            section="Backfill range: offsets or times",
        ),
    }


def _doc(pipeline: Pipeline) -> str:
    s = pipeline.spec
    topics = ", ".join(s.source.topics or []) or f"pattern `{s.source.topic_pattern}`"
    if s.mode == "continuous":
        interval = s.continuous.checkpoint_interval if s.continuous else "1 second"
        output = f"| mode | continuous, checkpoint every {interval} |\n| output | `{pipeline.sink_path}` |\n"
        actions = "**start**, **stop** or **restart**"
    else:
        output = f"| table | {s.sink.format} `{pipeline.sink_path}` (partitioned by `{s.date_partition.column}`) |\n"
        actions = "**start**, **stop**, **restart** or **backfill**"
    return (
        f"### {pipeline.name}\n\n{s.description.strip()}\n\n"
        f"| | |\n|---|---|\n| spec | `{pipeline.spec_path}` |\n| Kafka topics | {topics} |\n{output}"
        f"| quarantine | `{pipeline.quarantine_path}` |\n| checkpoint | `{pipeline.checkpoint_path}` |\n"
        f"| supervision | every `{s.supervision.schedule}`; stalled after {s.supervision.max_stall}; "
        f"max lag {s.supervision.max_lag or 'unbounded'} |\n\n"
        f"Trigger with a config to {actions}; scheduled runs **supervise**."
    )


def _check_spark_runtime() -> None:
    """spark-submit must come from the Spark runtime; `sluice airflow` points Airflow at it."""
    missing = [k for k in ("SPARK_HOME", "SLUICE_SPARK_PYTHON") if not os.environ.get(k)]
    if missing:
        raise AirflowFailException(
            f"{', '.join(missing)} not set: start Airflow with `sluice airflow ...` (make airflow), which points it at "
            "the Spark runtime; Airflow's own environment only has pyspark-client"
        )


def _launch(pipeline: Pipeline, trigger: str, processing_time: str | None, launched_by: str) -> Driver:
    """Launch the stream with the command the Spark provider's hook builds from the connection."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from sluice.ops import stream as supervise

    continuous = pipeline.spec.mode == "continuous"
    available_now = not continuous and (
        trigger == "available_now" or (trigger == "spec" and pipeline.spec.trigger.available_now)
    )
    sub = ingest_submission(
        pipeline.spec_path,
        pipeline_name=pipeline.name,
        available_now=available_now,
        processing_time=processing_time if trigger == "processing_time" else None,
    )
    kwargs = sub.operator_kwargs()
    application = kwargs.pop("application")
    hook = SparkSubmitHook(conn_id=CONN_ID, **kwargs)
    command = hook._build_spark_submit_command(application)  # the provider's own command line
    _check_spark_runtime()
    try:
        check_continuous_slots(pipeline, hook._connection["master"])
    except ValueError as exc:
        raise AirflowFailException(str(exc)) from None
    env = submit_env(hook._connection["master"])
    try:
        driver = supervise.launch(
            pipeline, command, env, launched_by=launched_by, desired="once" if available_now else "running"
        )
    except Claimed as exc:  # another driver holds the checkpoint or a table: a retry cannot help
        raise AirflowFailException(str(exc)) from None
    log.info("launched %s on %s: pid %d, log %s", pipeline.name, hook._connection["master"], driver.pid, driver.log)
    return driver


def control(spec_path: str) -> dict[str, Any] | None:
    """The task behind every action but backfill; for backfill it plans the offset ranges."""
    from sluice.ops import stream as supervise
    from sluice.ops.backfill import BackfillError
    from sluice.ops.backfill import plan as plan_backfill

    ctx = get_current_context()
    p: dict[str, Any] = ctx["params"]
    action = p["action"]
    pipeline = load_pipeline(spec_path)
    who = f"airflow {ctx['dag'].dag_id} {ctx['run_id']}"

    def start() -> Driver:
        return _launch(pipeline, p.get("trigger", "spec"), p.get("processing_time"), who)

    if action == "backfill":
        try:
            bf = plan_backfill(
                pipeline,
                from_offset=p.get("from_offset"),
                to_offset=p.get("to_offset"),
                from_time=p.get("from_time"),
                to_time=p.get("to_time"),
            )
        except BackfillError as exc:
            raise AirflowFailException(f"invalid backfill range: {exc}") from None
        log.info("backfill %s: %s, %d records: %s", bf.id, bf.description, bf.size, bf.range_json())
        if bf.refusal():
            log.warning("%s: %s", pipeline.name, bf.refusal())
        return {"id": bf.id, "range": bf.range_json(), "records": bf.size}
    if action == "stop":
        log.info("%s", supervise.stop(pipeline, stopped_by=who))
        return None
    if action in ("start", "restart"):
        if supervise.driver_process(pipeline) is not None:
            if action == "start":
                log.info("%s is already running; nothing to do (use restart to apply new settings)", pipeline.name)
                return None
            log.info("%s", supervise.stop(pipeline, stopped_by=who))
        status = supervise.wait_running(pipeline, start())
        log.info("%s is %s: Spark app %s, query %s", pipeline.name, status.state, status.app_id, status.query_id)
        return None
    try:
        verdict, obs = supervise.supervise(pipeline, start)
    except supervise.StreamUnhealthy as exc:
        raise AirflowFailException(str(exc)) from None
    except supervise.StartFailed as exc:
        raise RuntimeError(str(exc)) from None
    log.info("%s: %s (observed: %s)", pipeline.name, verdict.reason, obs)
    return None


def publish(pipeline: Pipeline) -> dict[str, int]:
    """Emit the table's asset event when batches committed since the last one (else skip)."""
    from sluice.ops import stream as supervise

    marker = supervise.run_dir(pipeline.name) / "published.json"
    since = (supervise.read_json(marker) or {}).get("mtime", 0.0)
    folders = [Path(pipeline.audit_path), *Path(pipeline.checkpoint_path + "_backfills").glob("*/sluice_audit")]
    new = [f for folder in folders if folder.is_dir() for f in folder.glob("*.json") if f.stat().st_mtime > since]
    if not new:
        raise AirflowSkipException(f"no batch of {pipeline.name} committed since the last asset event")
    totals = {"batches": len(new), "records_in": 0, "records_out": 0, "rows_out": 0, "records_quarantined": 0}
    for f in new:
        audit = json.loads(f.read_text(encoding="utf-8"))
        for key in ("records_in", "records_out", "rows_out", "records_quarantined"):
            totals[key] += int(audit.get(key, 0))
    ctx = get_current_context()
    ctx["outlet_events"][table_asset(pipeline)].extra = totals
    supervise.write_json(marker, {"mtime": max(f.stat().st_mtime for f in new)})
    log.info("%s: %s", pipeline.name, totals)
    return totals


def pipeline_dag(pipeline: Pipeline) -> DAG:
    s = pipeline.spec
    spec_path = str(pipeline.spec_path)
    default_args = {"owner": s.owner, "retries": 1, "retry_delay": timedelta(seconds=30)}
    with DAG(
        dag_id=f"sluice_{pipeline.name}",
        description=(s.description.strip().splitlines() or [f"Sluice pipeline {pipeline.name}"])[0],
        doc_md=_doc(pipeline),
        schedule=s.supervision.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=default_args,
        params=params(pipeline),
        tags=sorted(
            {"sluice", "stream", s.sink.format, *s.tags} | ({"continuous"} if s.mode == "continuous" else set())
        ),
        render_template_as_native_obj=False,
    ) as dag:

        @task.branch(task_id="route")
        def route() -> str:
            return "plan_backfill" if get_current_context()["params"]["action"] == "backfill" else "control"

        @task(task_id="control")
        def control_task() -> dict[str, Any] | None:
            return control(spec_path)

        @task(task_id="plan_backfill")
        def plan_task() -> dict[str, Any] | None:
            return control(spec_path)

        backfill_args = [
            "--spec",
            spec_path,
            "--backfill-id",
            "{{ ti.xcom_pull(task_ids='plan_backfill')['id'] }}",
            "--backfill-range",
            "{{ ti.xcom_pull(task_ids='plan_backfill')['range'] }}",
        ]
        sub = ingest_submission(spec_path, pipeline_name=pipeline.name)
        run_backfill = SparkSubmitOperator(
            task_id="backfill",
            conn_id=CONN_ID,
            **(sub.operator_kwargs() | {"application_args": backfill_args, "name": f"sluice-{pipeline.name}-backfill"}),
        )

        @task(task_id="publish", outlets=[table_asset(pipeline)], trigger_rule="none_failed_min_one_success")
        def publish_task() -> dict[str, int]:
            return publish(load_pipeline(spec_path))

        controlled, planned, published = control_task(), plan_task(), publish_task()
        route() >> [controlled, planned]
        planned >> run_backfill
        [controlled, run_backfill] >> published
    return dag


def maintenance_dag(pipeline: Pipeline) -> DAG:
    s = pipeline.spec
    sub = maintenance_submission(pipeline.spec_path, pipeline_name=pipeline.name)
    with DAG(
        dag_id=f"sluice_{pipeline.name}_maintenance",
        description=f"OPTIMIZE the last {s.maintenance.optimize_days} days and VACUUM the {pipeline.name} Delta tables",
        doc_md=(
            f"### {pipeline.name} maintenance\n\nCompacts the small files streaming leaves in the last "
            f"{s.maintenance.optimize_days} date partitions of `{pipeline.sink_path}` and its quarantine table "
            f"(`OPTIMIZE ... WHERE {s.date_partition.column} >= ...`), then removes files no version younger than "
            f"{s.maintenance.vacuum_retain_hours} hours references (`VACUUM ... RETAIN ... HOURS`)."
        ),
        schedule=s.maintenance.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={"owner": s.owner, "retries": 1, "retry_delay": timedelta(minutes=5)},
        tags=sorted({"sluice", "maintenance", "delta", *s.tags}),
    ) as dag:
        SparkSubmitOperator(task_id="optimize_and_vacuum", conn_id=CONN_ID, **sub.operator_kwargs())
    return dag


def quality_params(pipeline: Pipeline) -> dict[str, Param]:
    return {
        "from_date": optional(
            "string",
            format="date",
            title="From date",
            description="First date partition to validate (included). Empty: the newest partitions.",
        ),
        "to_date": optional(
            "string",
            format="date",
            title="To date",
            description="Last date partition (included); every day between is validated, empty ones too. "
            "Empty: the from date only.",
        ),
        "latest": Param(
            pipeline.spec.expectations.validation.partitions,
            type="integer",
            minimum=1,
            title="Newest partitions",
            description="Without dates: how many of the newest date partitions to validate.",
        ),
    }


def validate_table(spec_path: str) -> dict[str, Any]:
    """Run the validation job through the Spark provider's hook, then judge its report here,
    on the machine that ran the driver and wrote it."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    p: dict[str, Any] = get_current_context()["params"]
    pipeline = load_pipeline(spec_path)
    first, last = p.get("from_date") or p.get("to_date"), p.get("to_date") or p.get("from_date")
    try:
        selection = Selection.parse(f"{first}..{last}") if first else Selection(latest=int(p["latest"]))
    except ValueError as exc:
        raise AirflowFailException(f"invalid dates: {exc}") from None
    report_path = new_report_path(pipeline.name)
    sub = validation_submission(spec_path, pipeline_name=pipeline.name, dates=str(selection), report=report_path)
    kwargs = sub.operator_kwargs()
    application = kwargs.pop("application")
    _check_spark_runtime()
    SparkSubmitHook(conn_id=CONN_ID, **kwargs).submit(application)  # a crash raises, and is retried
    report = read_report(report_path)
    for line in report.summary():
        log.info("%s", line)
    if not report.passed:
        raise AirflowFailException("\n".join(report.summary()))
    return {
        "passed": report.passed,
        "partitions": [part.date for part in report.partitions],
        "warnings": [f"{o.rule} on {o.partition}" for o in report.warnings],
        "data_docs": report.docs,
        "report": str(report_path),
    }


def quality_dag(pipeline: Pipeline) -> DAG:
    s, spec_path = pipeline.spec, str(pipeline.spec_path)
    when = s.expectations.validation.schedule
    schedule: Any = [table_asset(pipeline)] if when == "table_updated" else when
    docs = quality_home() / "uncommitted" / "data_docs" / "local_site" / "index.html"
    with DAG(
        dag_id=f"sluice_{pipeline.name}_quality",
        description=f"Great Expectations on the newest date partitions of the {pipeline.name} table",
        doc_md=(
            f"### {pipeline.name} data quality\n\nValidates the date partitions of `{pipeline.sink_path}` "
            f"against the {len(s.expectations.rows)} row and {len(s.expectations.table)} table expectations "
            f"of `{spec_path}`, one Great Expectations batch per partition. Runs "
            + ("after each update of the table's asset" if when == "table_updated" else f"on `{when}`")
            + ", or from the trigger form for a date range.\n\nA failed **critical** expectation fails the run, "
            f"and its log lists each failed expectation; warnings are logged only. Data Docs: `{docs}`."
        ),
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={"owner": s.owner, "retries": 1, "retry_delay": timedelta(minutes=1)},
        params=quality_params(pipeline),
        tags=sorted({"sluice", "quality", s.sink.format, *s.tags}),
    ) as dag:

        @task(task_id="validate")
        def validate() -> dict[str, Any]:
            return validate_table(spec_path)

        validate()
    return dag


def invalid_spec_dag(spec_file: Path, error: str) -> DAG:
    """A spec that does not validate still shows up, tagged, with its error; its run fails."""
    with DAG(
        dag_id=f"sluice_{spec_file.stem}",
        description=f"INVALID SPEC: {error}"[:200],
        doc_md=f"### Invalid spec `{spec_file}`\n\n```\n{error}\n```\n\nFix the file; this DAG is rebuilt within a minute.",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        default_args={"owner": "sluice", "retries": 0},
        tags=["sluice", "invalid-spec"],
    ) as dag:

        @task(task_id="invalid_spec")
        def invalid() -> None:
            raise AirflowFailException(error)

        invalid()
    return dag


def build_dags() -> dict[str, DAG]:
    """Every spec in the pipelines folder as DAGs, keyed by DAG id."""
    dags: list[DAG] = []
    for spec_file in sorted(config.pipelines_dir().glob("*.yaml")):
        try:
            pipeline = load_pipeline(spec_file)
        except SpecError as exc:
            dags.append(invalid_spec_dag(spec_file, str(exc)))
            continue
        dags.append(pipeline_dag(pipeline))
        if pipeline.spec.sink.format == "delta":
            dags.append(maintenance_dag(pipeline))
        if pipeline.spec.expectations.declared:
            dags.append(quality_dag(pipeline))
    return {d.dag_id: d for d in dags}
