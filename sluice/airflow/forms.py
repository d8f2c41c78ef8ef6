"""The trigger forms: what a user may ask of a pipeline's DAGs, checked by JSON Schema
before a run is created, and translated into the arguments of :mod:`sluice.ops`."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from sluice.spec import Pipeline
from sluice.spec.model import duration_ms

ACTIONS = ["supervise", "start", "stop", "restart", "backfill"]
#: The micro-batch intervals the form offers (a list cannot be mistyped; the spec takes any).
INTERVALS = [
    "500 milliseconds",
    "1 second",
    "5 seconds",
    "10 seconds",
    "30 seconds",
    "1 minute",
    "5 minutes",
    "15 minutes",
    "1 hour",
]


def scheduled_runs(pipeline: Pipeline) -> str:
    """What a scheduled run does, said on every form and DAG page: unpausing a DAG queues one."""
    if pipeline.spec.supervision.autostart:
        what = "start the stream if it never ran, restart it if it died"
    else:
        what = "restart a stream someone started if it died, and start none (unpausing starts nothing)"
    return f"Scheduled runs supervise: they {what}; a run triggered meanwhile goes first."


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
                "(at least once: records since the last epoch are read again on start). " + scheduled_runs(pipeline),
            )
        }
    form = _micro_batch_form(pipeline)
    if pipeline.derived:  # it reads a table, not Kafka offsets: nothing to backfill by range
        form = {k: v for k, v in form.items() if not k.startswith(("from_", "to_"))}
        form["action"] = Param(
            "supervise",
            enum=[a for a in ACTIONS if a != "backfill"],
            title="Action",
            description="supervise: start/restart if needed, fail if stalled. stop: after the current batch commits. "
            + scheduled_runs(pipeline),
        )
    return form


def _micro_batch_form(pipeline: Pipeline) -> dict[str, Param]:
    default_interval = pipeline.spec.trigger.processing_time or "10 seconds"
    return {
        "action": Param(
            "supervise",
            enum=ACTIONS,
            title="Action",
            description="supervise: start/restart if needed, fail if stalled. stop: after the current batch commits. "
            "backfill: re-read a range the stream has already committed into the same tables (records they "
            "hold are skipped; later offsets are the stream's own and are refused), so no record lands twice; "
            "give offsets or times below, and a range that holds no record skips the run. " + scheduled_runs(pipeline),
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
        "processing_time": optional(
            "string",
            enum=interval_options(default_interval),
            values_display={"null": f"as the spec says ({default_interval})"},
            title="Micro-batch interval",
            description="Only with trigger mode 'processing_time'.",
        ),
        # A bound inside allOf: the form's number field clamps to a top-level minimum without a
        # word (-5 became 0, a backfill of everything). Nested, the REST API still refuses -5;
        # the form's field cannot hold it and sends it empty, which plan_backfill refuses.
        "from_offset": optional(
            "integer",
            allOf=[{"minimum": 0}],
            title="Backfill from offset",
            description="First offset, on every partition (included).",
            section="Backfill range: offsets or times",
        ),
        "to_offset": optional(
            "integer",
            allOf=[{"minimum": 0}],
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


def interval_options(default_interval: str) -> list[str | None]:
    """The interval list, shortest first, the spec's own among them. Airflow's list keeps the
    options whose label holds what was typed and Enter takes the first, so "as the spec says
    (15 seconds)" comes last: first, it caught "5 sec" and the run took 15 seconds."""
    return [*sorted(dict.fromkeys([*INTERVALS, default_interval]), key=duration_ms), None]


def launch_options(pipeline: Pipeline, params: dict[str, Any]) -> dict[str, Any]:
    """The form's trigger mode as :func:`sluice.ops.stream.start`'s keyword arguments."""
    trigger = params.get("trigger", "spec")
    interval = params.get("processing_time") or pipeline.spec.trigger.processing_time or "10 seconds"
    return {
        "available_now": trigger == "available_now",
        "processing_time": interval if trigger == "processing_time" else None,
    }


def endpoint_params() -> dict[str, Param]:
    """The SQL endpoint's form: what to do, and where a start or restart serves it. Empty
    settings are the worker's (``SLUICE_SQL_*``); scheduled runs keep the endpoint as it was
    last started, so changing its port is a restart from here, not a restart of Airflow."""
    section = "Where it listens (start and restart; empty: the worker's SLUICE_SQL_* settings)"
    return {
        "action": Param(
            "supervise",
            enum=["supervise", "start", "stop", "restart"],
            title="Action",
            description="supervise: start it unless it runs or was stopped on purpose, with the settings it was "
            "last started with. start, restart: with the settings below.",
        ),
        "port": optional(
            "integer",
            # Nested, as the offsets': the form's number field clamps to a top-level bound without a word.
            allOf=[{"minimum": 1, "maximum": 65535}],
            title="Port",
            description="The JDBC/ODBC port clients connect to.",
            section=section,
        ),
        "host": optional(
            "string",
            pattern=r"^[A-Za-z0-9.:-]+$",
            title="Address to bind",
            description="127.0.0.1 for this host only; another address needs password logins.",
            section=section,
        ),
        "auth": optional(
            "string",
            enum=[None, "none", "password"],
            title="Logins",
            description="none, or password (users from `sluice sql passwd USER`).",
            section=section,
        ),
    }
