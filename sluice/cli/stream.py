"""The stream's commands: run, start, stop, restart, supervise, status, backfill and audit."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from sluice.cli.output import JsonOut, Master, SpecArg, console, fail, load, print_json, say, warn

if TYPE_CHECKING:
    from rich.table import Table

    from sluice.records import audit as audits


def run(
    spec: SpecArg,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Process what is in Kafka now, then stop.")
    ] = False,
    master: Master = None,
    conf: Annotated[list[str] | None, typer.Option(help="Extra Spark setting KEY=VALUE (repeatable).")] = None,
) -> None:
    """Run the ingest job in the foreground with spark-submit, as Airflow submits it, and wait."""
    from sluice.ops import stream
    from sluice.ops.submit import ingest_submission
    from sluice.ops.target import LocalTarget

    p = load(spec)
    target = LocalTarget(master, dict(c.split("=", 1) for c in conf or []))
    slots = stream.continuous_conf(p, target.master)
    target.run(ingest_submission(p.spec_path, pipeline_name=p.name, available_now=available_now, conf=slots))


def start(
    spec: SpecArg,
    available_now: Annotated[bool, typer.Option("--available-now", help="Process what is there, then end.")] = False,
    processing_time: Annotated[
        str | None, typer.Option(help="Micro-batch interval instead of the spec's, e.g. '30 seconds'.")
    ] = None,
    master: Master = None,
) -> None:
    """Start the stream detached (as Airflow does) and wait until its query runs."""
    from sluice.ops import stream
    from sluice.ops.target import LocalTarget

    started = stream.start(
        load(spec),
        LocalTarget(master),
        by="sluice start",
        available_now=available_now,
        processing_time=processing_time,
    )
    say(started.summary())


def stop(
    spec: SpecArg, timeout: Annotated[float, typer.Option(help="Seconds to wait for the batch in progress.")] = 120
) -> None:
    """Stop the stream after the batch in progress commits; supervision will not restart it."""
    from sluice.ops import stream

    say(stream.stop(load(spec), by="sluice stop", timeout=timeout))


def restart(
    spec: SpecArg,
    processing_time: Annotated[
        str | None, typer.Option(help="Micro-batch interval instead of the spec's, e.g. '30 seconds'.")
    ] = None,
    master: Master = None,
) -> None:
    """Stop the stream after its batch commits, then start it again from its checkpoint."""
    from sluice.ops import stream
    from sluice.ops.target import LocalTarget

    done = stream.restart(load(spec), LocalTarget(master), by="sluice restart", processing_time=processing_time)
    if done.stopped:
        say(done.stopped)
    say(done.started.summary())


def rebuild(
    spec: SpecArg,
    available_now: Annotated[bool, typer.Option("--available-now", help="Process what is there, then end.")] = False,
    master: Master = None,
) -> None:
    """Recompute a derived pipeline from its upstream table as it is now (after rows were deleted there)."""
    from sluice.ops import stream
    from sluice.ops.target import LocalTarget

    done = stream.rebuild(load(spec), LocalTarget(master), by="sluice rebuild", available_now=available_now)
    if done.stopped:
        say(done.stopped)
    say(done.started.summary())


def supervise(spec: SpecArg, master: Master = None) -> None:
    """One supervision pass: start (even a stream that never ran) or restart if needed, fail if unhealthy."""
    from sluice.ops import supervision
    from sluice.ops.target import LocalTarget

    done = supervision.supervise(load(spec), LocalTarget(master), by="sluice supervise")
    say(done.note or done.status.verdict.reason)
    if done.started:
        say(done.started.summary())


def status(spec: SpecArg, as_json: JsonOut = False) -> None:
    """Is the stream running, how far behind Kafka is it, and what would scheduled supervision do? Exit 1 if unhealthy."""
    from rich.table import Table

    from sluice.ops import supervision

    p = load(spec)
    st = supervision.status(p, start_new=p.spec.supervision.autostart)
    if as_json:
        print_json(st.as_dict())
        raise typer.Exit(0 if st.healthy else 1)
    obs = st.observation
    table = Table("", "", show_header=False, title=escape(p.name))
    held = st.holder
    table.add_row("running", f"yes, on {held.host} (lease epoch {held.epoch})" if held else "no")
    table.add_row("wanted", obs.desired or "never started here")
    table.add_row("job state", escape(f"{obs.state or '-'}" + (f" ({obs.error})" if obs.error else "")))
    if st.status:
        table.add_row("Spark app", escape(f"{st.status.app_id}  {st.status.ui or ''}"))
    table.add_row("last committed batch", "none" if st.committed.batch_id is None else str(st.committed.batch_id))
    if p.upstream is not None:
        table.add_row("reads", escape(f"the table of {p.upstream.name}"))
        table.add_row(f"lag ({obs.lag_unit})", "unknown" if obs.lag is None else str(obs.lag))
    else:
        table.add_row("lag (records)", "unknown" if obs.lag is None else str(obs.lag))
    for label, value in last_batch_rows(st.status.last_progress if st.status else {}):
        table.add_row(label, escape(value))
    table.add_row("supervised", escape(st.supervision))
    table.add_row("supervision says", escape(f"{st.verdict.action}: {st.verdict.reason}"))
    console.print(table)
    if st.broker_error:
        warn(f"{st.broker_error}; start the embedded one with `sluice kafka up`")
    if st.rescued is not None:
        warn(st.rescued.warning(p.name))
    if not st.healthy:
        raise typer.Exit(1)


def last_batch_rows(progress: dict[str, Any]) -> list[tuple[str, str]]:
    """The last batch as the job's listener saw it: rows, rate, and for stateful pipelines
    the watermark, state and late rows."""
    if not progress or progress.get("batch_id") is None:
        return []
    rate = progress.get("rows_per_second") or 0
    rows = [("last batch", f"{progress['batch_id']}: {progress.get('input_rows') or 0} rows in, {rate:,.0f} rows/s")]
    if "watermark" in progress:
        rows.append(("watermark", str(progress.get("watermark") or "none yet")))
        memory = int(progress.get("state_memory_bytes") or 0)
        rows.append(("state", f"{progress.get('state_rows') or 0} rows, {memory / 1_048_576:.1f} MiB"))
        rows.append(("late rows (last batch)", str(progress.get("late_rows") or 0)))
    return rows


def backfill(
    spec: SpecArg,
    from_offset: Annotated[int | None, typer.Option(min=0, help="First offset (every partition).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="End offset, excluded [default: the end].")] = None,
    from_time: Annotated[str | None, typer.Option(help="First record time, ISO 8601.")] = None,
    to_time: Annotated[str | None, typer.Option(help="End time, excluded, ISO 8601.")] = None,
    master: Master = None,
) -> None:
    """Re-read a range of Kafka into the pipeline's tables (available-now, no duplicates)."""
    from sluice.ops import backfill as backfills
    from sluice.ops.target import LocalTarget

    p = load(spec)
    plan = backfills.plan(p, from_offset=from_offset, to_offset=to_offset, from_time=from_time, to_time=to_time)
    say(f"backfill {plan.id}: {plan.description}, {plan.records} records")
    if plan.refusal():
        warn(f"{p.name}: {plan.refusal()}")
    backfills.run(p, LocalTarget(master), plan)


def audit(
    spec: SpecArg, last: Annotated[int, typer.Option(help="How many batches.")] = 20, as_json: JsonOut = False
) -> None:
    """Per-batch counts: records in = records out + records quarantined (+ late + filtered, derived)."""
    from sluice.records import audit as audits

    p = load(spec)
    files = list(audits.audit_files([p.audit_path]))[-last:]
    if not files:
        fail(f"no batches recorded yet in {p.audit_path}", 1)
    if as_json:
        print_json([dataclasses.asdict(audits.read(f)) for f in files])
        return
    console.print(audit_table([audits.read(f) for f in files]))


def audit_table(batches: list[audits.BatchAudit]) -> Table:
    """The batches' counts, with a column for what only some pipelines have (rows of exploded
    arrays, late, filtered, rescued, already present, failed rules) only when one of these
    batches has it, so the table fits an 80-column terminal whole."""
    from rich.table import Table

    cells: dict[str, list[str]] = {
        "batch": [str(a.batch_id) for a in batches],
        "in": [str(a.records_in) for a in batches],
        "out": [str(a.records_out) for a in batches],
        "rows out": [str(a.rows_out) for a in batches],
        "quarantined": [str(a.records_quarantined) for a in batches],
        "late": [str(a.records_late) for a in batches],
        "filtered": [str(a.records_filtered) for a in batches],
        "rescued": [str(a.records_rescued) for a in batches],
        "already present": [str(a.records_already_present) for a in batches],
        "rules failed": [
            escape(
                ", ".join(
                    f"{n} {c['failed']}/{c['checked']} ({c['action']})" for n, c in a.failed_expectations().items()
                )
            )
            for a in batches
        ],
        "seconds": [f"{a.seconds:.1f}" for a in batches],
        "written at (UTC)": [a.written_at[:19].replace("T", " ") for a in batches],
    }
    always = {"batch", "in", "out", "quarantined", "seconds", "written at (UTC)"}
    shown = {
        k: v
        for k, v in cells.items()
        if k in always
        or (k == "rows out" and v != cells["out"])
        or (k != "rows out" and any(x not in ("0", "") for x in v))
    }
    table = Table(*shown)
    for row in zip(*shown.values(), strict=True):
        table.add_row(*row)
    return table
