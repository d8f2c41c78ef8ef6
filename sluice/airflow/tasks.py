"""What each Airflow task does: read the form, call :mod:`sluice.ops`, report in the task log.

Sluice's errors become task states in one place (:func:`as_task_state`): nothing to do
skips the task, a transient failure is retried, any other failure fails the task at once.
The actions' modules (psutil, confluent-kafka) are imported when a task runs, not while the
DAG file is parsed (but for a registry subject this host has never fetched: sluice.registry).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow.sdk import get_current_context
from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule
from airflow.sdk.exceptions import AirflowSkipException

from sluice import registry
from sluice.airflow import links
from sluice.errors import AlreadyRunning, NothingToDo, SluiceError
from sluice.spec import Pipeline, load_pipeline

if TYPE_CHECKING:
    from airflow.sdk import Asset

    from sluice.ops.stream import Started

log = logging.getLogger("sluice.airflow")


class Refused(SystemExit):
    """Ends a task that trying again would fail the same way (a refused backfill, a bad form
    value, a failed validation), its reason logged just before. Airflow logs a SystemExit in
    one line, where under an AirflowFailException it logs a traceback of its own frames and
    ours; :data:`NO_RETRY` fails the task at once instead of retrying it."""

    def __init__(self) -> None:
        super().__init__(1)


#: Every Sluice task's retry policy (the DAGs' default_args): a refusal is not retried.
NO_RETRY = ExceptionRetryPolicy(
    rules=[RetryRule(exception=Refused, action=RetryAction.FAIL, reason="refused; the reason is logged above")]
)


@contextmanager
def as_task_state() -> Iterator[None]:
    # The reason is logged here, in the task's own lines: Airflow logs a skip's reason inside
    # the collapsed "Post Execute" group, and a failure's under a traceback of its own frames.
    try:
        yield
    except (NothingToDo, AlreadyRunning) as exc:
        log.info("skipped: %s", exc)
        raise AirflowSkipException(str(exc)) from None
    except SluiceError as exc:
        log.error("%s", exc)
        if exc.transient:
            raise RuntimeError(str(exc)) from None  # Airflow retries it
        raise Refused from None


def _load(spec_path: str) -> Pipeline:
    """The spec as the job will read it: a registry subject asked for again at run time."""
    return load_pipeline(spec_path, schemas=registry.schema_file)


def _who() -> str:
    ctx = get_current_context()
    return f"airflow {ctx['dag'].dag_id} {ctx['run_id']}"


def log_driver_lines(text: str) -> None:
    """The driver's own log in the task log, at its own level: Spark's WARN lines as warnings."""
    for line in text.splitlines():
        level = logging.ERROR if " ERROR " in line else logging.WARNING if " WARN " in line else logging.INFO
        log.log(level, "driver | %s", line)


def _log_started(started: Started, master: str) -> None:
    log.info("launched %s on %s: %s", started.driver.pipeline, master, started.summary())
    log_driver_lines(started.log_tail())


def _run_type() -> str:
    run_type = get_current_context()["dag_run"].run_type
    return str(getattr(run_type, "value", run_type))


def _asked_by_a_person() -> bool:
    """A run someone asked for: the form, the REST API, another DAG's trigger, or the asset's
    Materialize button; not the schedule, nor an upstream table's asset event."""
    return _run_type() in ("manual", "operator_triggered", "asset_materialization")


def _runs_waiting() -> int:
    """Runs of this DAG queued behind this one (one runs at a time): someone's action waits there."""
    ctx = get_current_context()
    return int(ctx["ti"].get_dr_count(dag_id=ctx["dag"].dag_id, states=["queued"]))


def _left_to_a_waiting_run(who: str, what: str) -> bool:
    """Whether this supervising run leaves ``what`` to a run someone triggered meanwhile: one
    the schedule or an asset started, with such a run queued behind it, does (and says so)."""
    waiting = 0 if _asked_by_a_person() else _runs_waiting()
    if waiting:
        log.info(
            "%s: %d run(s) triggered meanwhile wait behind this %s one; supervision leaves the %s to them",
            who,
            waiting,
            _run_type(),
            what,
        )
    return bool(waiting)


def control(spec_path: str, action: str) -> None:
    """supervise, start, stop or restart, as the form (or the schedule: supervise) asks."""
    from sluice.airflow.forms import launch_options
    from sluice.airflow.target import AirflowTarget
    from sluice.ops import stream, supervision

    params: dict[str, Any] = get_current_context()["params"]
    by = _who()
    with as_task_state():
        pipeline, target = _load(spec_path), AirflowTarget()
        if action == "stop":
            log.info("%s", stream.stop(pipeline, by=by))
        elif action == "start":
            _log_started(stream.start(pipeline, target, by=by, **launch_options(pipeline, params)), target.master)
        elif action == "restart":
            restarted = stream.restart(pipeline, target, by=by, **launch_options(pipeline, params))
            log.info("%s", restarted.stopped or f"{pipeline.name} was not running")
            _log_started(restarted.started, target.master)
        else:
            if _left_to_a_waiting_run(pipeline.name, "stream"):
                return
            start_new = _asked_by_a_person() or pipeline.spec.supervision.autostart
            done = supervision.supervise(
                pipeline, target, by=by, start_new=start_new, **launch_options(pipeline, params)
            )
            log.info("%s: %s", pipeline.name, done.note or done.status.verdict.reason)
            if done.started:
                _log_started(done.started, target.master)


def sql_endpoint(action: str, *, port: int | None = None, host: str | None = None, auth: str | None = None) -> None:
    """supervise (start unless running or stopped on purpose, as it was last started), start,
    stop or restart the SQL endpoint; a start takes the form's settings, and this worker's
    environment (``SLUICE_SQL_*``) for those left empty."""
    from sluice.airflow.target import AirflowTarget
    from sluice.ops import sql
    from sluice.ops.processes import log_tail
    from sluice.sql.settings import Endpoint

    by = _who()
    if action == "supervise" and _left_to_a_waiting_run("SQL endpoint", "endpoint"):
        return
    with as_task_state():
        worker = Endpoint.from_env()
        target, endpoint = AirflowTarget(), replace(worker, port=port or worker.port, host=host or worker.host)
        if auth:
            endpoint = replace(endpoint, auth="password" if auth == "password" else "none")
        if action in ("stop", "restart"):
            log.info("%s", sql.stop(by=by))
        if action == "stop":
            return
        served = sql.keep_up(target, endpoint, by=by) if action == "supervise" else sql.serve(target, endpoint, by=by)
    if served is None:
        report = sql.status()
        log.info("the SQL endpoint is %s", "up" if report.up else f"left {report.desired} on purpose")
        return
    log.info("launched the SQL endpoint on %s: %s", target.master, served.summary())
    log_driver_lines(log_tail(served.driver.log))


def plan_backfill(spec_path: str) -> str:
    """The form's range as an exact plan (JSON, for the next task); an empty one skips the run."""
    from sluice.ops import backfill

    params: dict[str, Any] = get_current_context()["params"]
    with as_task_state():
        pipeline = _load(spec_path)
        plan = backfill.plan(
            pipeline,
            from_offset=params.get("from_offset"),
            to_offset=params.get("to_offset"),
            from_time=params.get("from_time"),
            to_time=params.get("to_time"),
        )
    log.info("backfill %s: %s, %d records: %s", plan.id, plan.description, plan.records, plan.to_json())
    if plan.refusal():
        log.warning("%s: %s", pipeline.name, plan.refusal())
    return plan.to_json()


def run_backfill(spec_path: str, plan_json: str) -> None:
    from sluice.airflow.target import AirflowTarget
    from sluice.ops import backfill
    from sluice.records.backfill import BackfillPlan

    with as_task_state():
        backfill.run(_load(spec_path), AirflowTarget(), BackfillPlan.from_json(plan_json))


def maintain(spec_path: str) -> None:
    """OPTIMIZE and VACUUM through the Spark provider. The submission (and the jars' location
    it names) is built here, on the worker, never while the DAG file is parsed."""
    from sluice.airflow.target import AirflowTarget
    from sluice.ops.submit import maintenance_submission

    with as_task_state():
        pipeline = _load(spec_path)
        AirflowTarget().run(maintenance_submission(pipeline.spec_path, pipeline_name=pipeline.name))


def publish(spec_path: str, asset: Asset) -> dict[str, int]:
    """Emit the table's asset event when batches committed since the last one (else skip)."""
    from sluice.ops.publish import publish as publish_batches

    ctx = get_current_context()

    def emit(totals: dict[str, int]) -> None:
        ctx["outlet_events"][asset].extra = totals

    with as_task_state():
        pipeline: Pipeline = _load(spec_path)
        totals = publish_batches(pipeline, emit)
    log.info("%s: %s", pipeline.name, totals)
    return totals


def validate(spec_path: str) -> dict[str, Any]:
    """Great Expectations through the Spark provider; a failed critical expectation fails the task."""
    from sluice.airflow.target import AirflowTarget
    from sluice.ops import validate as validation
    from sluice.records import audit as audits

    params: dict[str, Any] = get_current_context()["params"]
    with as_task_state():
        pipeline = _load(spec_path)
        chosen = validation.selection(
            pipeline,
            from_date=params.get("from_date"),
            to_date=params.get("to_date"),
            latest=None if params.get("from_date") or params.get("to_date") else params.get("latest"),
        )
        report = validation.validate(pipeline, AirflowTarget(), chosen)
    # For the task's Data Docs button (sluice.airflow.links), pushed before a failure ends the task.
    get_current_context()["ti"].xcom_push(key=links.XCOM_KEY, value=report.page())
    for line in report.summary():
        (log.info if report.passed else log.error)("%s", line)
    rescued = audits.rescued(pipeline)
    if rescued is not None:
        log.warning("%s", rescued.warning(pipeline.name))
    if not report.passed:
        raise Refused  # the summary above says why
    return {
        "passed": report.passed,
        "partitions": [part.date for part in report.partitions],
        "warnings": [f"{o.rule} on {o.partition}" for o in report.warnings],
        "data_docs": report.docs,
        "rescued": {"records": rescued.records, "paths": rescued.paths} if rescued else None,
    }
