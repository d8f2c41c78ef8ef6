"""The trigger forms: what a user may ask of a pipeline's DAGs, checked by JSON Schema
before a run is created, and translated into the arguments of :mod:`sluice.ops`."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from sluice.spec import Pipeline

ACTIONS = ["supervise", "start", "stop", "restart", "backfill"]
DURATION_PATTERN = r"^\d+(\.\d+)?\s*(milliseconds?|ms|seconds?|s|minutes?|min|hours?|h)$"


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


def launch_options(params: dict[str, Any]) -> dict[str, Any]:
    """The form's trigger mode as :func:`sluice.ops.stream.start`'s keyword arguments."""
    trigger = params.get("trigger", "spec")
    return {
        "available_now": trigger == "available_now",
        "processing_time": params.get("processing_time") if trigger == "processing_time" else None,
    }
