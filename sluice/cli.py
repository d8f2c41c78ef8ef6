"""The ``sluice`` command: the embedded broker, topics, producers, jobs and SQL.

Every command has ``--help``. Commands that need Spark (``sql``, ``demo``) import it
only when they run, so the rest start instantly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import sluice
from sluice import config
from sluice.airflow.env import airflow_binary, airflow_env
from sluice.dev.broker import BrokerError, EmbeddedBroker
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import ProduceError, ProduceReport, read_ndjson, send, synthetic
from sluice.errors import NothingToDo, SluiceError
from sluice.ops import backfill as backfills
from sluice.ops import check as checks
from sluice.ops import stream
from sluice.ops import validate as validation
from sluice.ops.submit import ingest_submission
from sluice.ops.target import LocalTarget
from sluice.records import audit as audits
from sluice.records.validation import Report, Selection
from sluice.spec import Pipeline, PipelineSpec, load_pipeline, valid_pipelines
from sluice.topics import create_topics, end_offsets

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)
# Help texts are plain text: "[default: ...]" and "local[2]" must not be read as Rich markup.
app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Sluice: Kafka JSON events to date-partitioned Delta/Parquet tables with Spark.",
)
kafka_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="The embedded Kafka broker (KRaft, localhost only)."
)
topics_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Kafka topics.")
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")

SpecArg = Annotated[str, typer.Argument(help="A spec file, or a pipeline name from pipelines/.")]
Bootstrap = Annotated[
    str | None, typer.Option("--bootstrap", help="Kafka bootstrap servers [default: the embedded broker].")
]


Master = Annotated[str | None, typer.Option(help="Spark master [default: $SLUICE_SPARK_MASTER or local[2]].")]


def _version(value: bool) -> None:
    if value:
        console.print(f"sluice {sluice.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Sluice: Kafka JSON events to date-partitioned Delta/Parquet tables with Spark."""


def warn(message: str) -> None:
    errors.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def say(message: str) -> None:
    """Print text that is not markup (paths, spec values, Spark's messages) as it is."""
    console.print(escape(message), soft_wrap=True)


def _pipeline(spec: str) -> Pipeline:
    return load_pipeline(spec)  # a SpecError reaches main(), which reports it


def main() -> None:
    """The console script: Sluice's errors become one message on stderr and an exit code."""
    try:
        app()
    except NothingToDo as exc:
        say(str(exc))
        sys.exit(0)
    except SluiceError as exc:
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)


# --- kafka -------------------------------------------------------------------------------


@kafka_app.command("up")
def kafka_up(timeout: Annotated[float, typer.Option(help="Seconds to wait until it answers.")] = 90) -> None:
    """Start the broker (formatting its storage the first time) and wait until it answers."""
    broker = EmbeddedBroker.default()
    was_running = broker.pid() is not None
    try:
        with console.status(f"starting Kafka on {broker.bootstrap}"):
            pid = broker.start(timeout)
    except BrokerError as exc:
        fail(str(exc))
    verb = "already running" if was_running else "started"
    console.print(f"Kafka {verb} on [bold]{broker.bootstrap}[/] (pid {pid}, data in {broker.data_dir})")


@kafka_app.command("down")
def kafka_down() -> None:
    """Stop the broker gracefully."""
    stopped = EmbeddedBroker.default().stop()
    console.print("Kafka stopped" if stopped else "Kafka was not running")


@kafka_app.command("status")
def kafka_status() -> None:
    """Show whether the broker runs, where, and how many topics it has. Exit 1 if down."""
    st = EmbeddedBroker.default().status()
    if not st.running:
        console.print(f"Kafka is [red]not running[/] (data dir {st.data_dir})")
        raise typer.Exit(1)
    console.print(
        f"Kafka is [green]running[/] on {st.bootstrap}, pid {st.pid}, {st.topics} topics, data in {st.data_dir}"
    )


# --- topics ------------------------------------------------------------------------------


@topics_app.command("create")
def topics_create(
    names: Annotated[list[str] | None, typer.Argument(help="Topic names.")] = None,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1, help="Partitions per new topic.")] = 2,
    spec: Annotated[str | None, typer.Option(help="Also create the topics this spec reads.")] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Create topics (existing ones are left as they are)."""
    wanted = list(names or [])
    if spec:
        wanted += _pipeline(spec).spec.source.topics or []
    if not wanted:
        fail("name at least one topic, or --spec")
    table = Table("topic", "partitions", "")
    for r in create_topics(bootstrap or config.bootstrap_servers(), wanted, partitions):
        table.add_row(r.name, str(r.partitions), "created" if r.created else "existed")
    console.print(table)


@topics_app.command("offsets")
def topics_offsets(topic: str, bootstrap: Bootstrap = None) -> None:
    """Show a topic's end offset per partition."""
    table = Table("partition", "end offset")
    for part, off in sorted(end_offsets(bootstrap or config.bootstrap_servers(), topic).items()):
        table.add_row(str(part), str(off))
    console.print(table)


# --- producing ---------------------------------------------------------------------------


def _print_report(report: ProduceReport, extra: Counter[str] | None = None) -> None:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.kinds.items()))
    more = "".join(f", {k} {v}" for k, v in (extra or {}).items())
    console.print(
        f"sent [bold]{report.sent}[/] records to [bold]{report.topic}[/] in {report.seconds:.1f}s "
        f"({report.rate:,.0f}/s): {kinds}{more}"
    )


@app.command()
def produce(
    spec: SpecArg,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many records.")] = 1000,
    rate: Annotated[float | None, typer.Option(help="Records per second [default: as fast as possible].")] = None,
    bad_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of bad records (each with a known reason).")
    ] = 0.0,
    topic: Annotated[str | None, typer.Option(help="Topic [default: the spec's first topic].")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed, for repeatable data.")] = None,
    days: Annotated[int, typer.Option(min=1, help="Spread event times over this many past days.")] = 3,
    bootstrap: Bootstrap = None,
) -> None:
    """Produce synthetic events generated from the pipeline's schema."""
    p = _pipeline(spec)
    target = topic or next(iter(p.spec.source.topics or []), None)
    if not target:
        fail(f"{p.name} subscribes by pattern; give --topic")
    gen = EventGenerator(p, seed=seed if seed is not None else time.time_ns() % 2**32, days=days)
    try:
        with console.status(f"producing {count} {p.name} events"):
            report = send(
                bootstrap or p.spec.source.bootstrap_servers,
                str(target),
                synthetic(gen, count, bad_fraction),
                rate,
            )
    except (ProduceError, ValueError) as exc:
        fail(str(exc))
    _print_report(report)


@app.command()
def replay(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Newline-delimited JSON file.")],
    topic: Annotated[str, typer.Option(help="Topic to write to.")],
    rate: Annotated[float | None, typer.Option(help="Records per second [default: as fast as possible].")] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Send each line of a newline-delimited JSON file, unchanged, as one record."""
    stats: Counter[str] = Counter()
    try:
        report = send(bootstrap or config.bootstrap_servers(), topic, read_ndjson(file, stats), rate)
    except ProduceError as exc:
        fail(str(exc))
    _print_report(report, stats)


# --- running -----------------------------------------------------------------------------


@app.command()
def run(
    spec: SpecArg,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Process what is in Kafka now, then stop.")
    ] = False,
    master: Master = None,
    conf: Annotated[list[str] | None, typer.Option(help="Extra Spark setting KEY=VALUE (repeatable).")] = None,
) -> None:
    """Run the ingest job in the foreground with spark-submit, as Airflow submits it, and wait."""
    p = _pipeline(spec)
    target = LocalTarget(master, dict(c.split("=", 1) for c in conf or []))
    stream.check_continuous_slots(p, target.master)
    target.run(ingest_submission(p.spec_path, pipeline_name=p.name, available_now=available_now))


@app.command()
def start(
    spec: SpecArg,
    available_now: Annotated[bool, typer.Option("--available-now", help="Process what is there, then end.")] = False,
    processing_time: Annotated[
        str | None, typer.Option(help="Micro-batch interval instead of the spec's, e.g. '30 seconds'.")
    ] = None,
    master: Master = None,
) -> None:
    """Start the stream detached (as Airflow does) and wait until its query runs."""
    started = stream.start(
        _pipeline(spec),
        LocalTarget(master),
        by="sluice start",
        available_now=available_now,
        processing_time=processing_time,
    )
    say(started.summary())


@app.command()
def stop(
    spec: SpecArg, timeout: Annotated[float, typer.Option(help="Seconds to wait for the batch in progress.")] = 120
) -> None:
    """Stop the stream after the batch in progress commits; supervision will not restart it."""
    say(stream.stop(_pipeline(spec), by="sluice stop", timeout=timeout))


@app.command()
def restart(
    spec: SpecArg,
    processing_time: Annotated[
        str | None, typer.Option(help="Micro-batch interval instead of the spec's, e.g. '30 seconds'.")
    ] = None,
    master: Master = None,
) -> None:
    """Stop the stream after its batch commits, then start it again from its checkpoint."""
    done = stream.restart(_pipeline(spec), LocalTarget(master), by="sluice restart", processing_time=processing_time)
    if done.stopped:
        say(done.stopped)
    say(done.started.summary())


@app.command()
def supervise(spec: SpecArg, master: Master = None) -> None:
    """One supervision pass, as the scheduled DAG run does: start or restart if needed, fail if unhealthy."""
    done = stream.supervise(_pipeline(spec), LocalTarget(master), by="sluice supervise")
    say(done.status.verdict.reason)
    if done.started:
        say(done.started.summary())


@app.command()
def status(spec: SpecArg, as_json: JsonOut = False) -> None:
    """Is the stream running, how far behind Kafka is it, and what would supervision do? Exit 1 if unhealthy."""
    p = _pipeline(spec)
    st = stream.status(p)
    if as_json:
        _json(st.as_dict())
        raise typer.Exit(0 if st.healthy else 1)
    obs = st.observation
    table = Table("", "", show_header=False, title=escape(p.name))
    table.add_row("running", "yes" if obs.alive else "no")
    table.add_row("wanted", obs.desired or "never started here")
    table.add_row("job state", escape(f"{obs.state or '-'}" + (f" ({obs.error})" if obs.error else "")))
    if st.status:
        table.add_row("Spark app", escape(f"{st.status.app_id}  {st.status.ui or ''}"))
    table.add_row("last committed batch", "none" if st.committed.batch_id is None else str(st.committed.batch_id))
    table.add_row("lag (records)", "unknown" if obs.lag is None else str(obs.lag))
    table.add_row("supervision says", escape(f"{st.verdict.action}: {st.verdict.reason}"))
    console.print(table)
    if st.broker_error:
        warn(f"{st.broker_error}; start the embedded one with `sluice kafka up`")
    if not st.healthy:
        raise typer.Exit(1)


@app.command()
def backfill(
    spec: SpecArg,
    from_offset: Annotated[int | None, typer.Option(min=0, help="First offset (every partition).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="End offset, excluded [default: the end].")] = None,
    from_time: Annotated[str | None, typer.Option(help="First record time, ISO 8601.")] = None,
    to_time: Annotated[str | None, typer.Option(help="End time, excluded, ISO 8601.")] = None,
    master: Master = None,
) -> None:
    """Re-read a range of Kafka into the pipeline's tables (available-now, no duplicates)."""
    p = _pipeline(spec)
    plan = backfills.plan(p, from_offset=from_offset, to_offset=to_offset, from_time=from_time, to_time=to_time)
    say(f"backfill {plan.id}: {plan.description}, {plan.records} records")
    if plan.refusal():
        warn(f"{p.name}: {plan.refusal()}")
    backfills.run(p, LocalTarget(master), plan)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def airflow(ctx: typer.Context) -> None:
    """Run Airflow (its own venv) with Sluice's DAGs and Spark runtime, e.g. `sluice airflow standalone`."""
    try:
        binary = airflow_binary()
    except FileNotFoundError as exc:
        fail(str(exc))
    env = os.environ | airflow_env()
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    os.execve(binary, [str(binary), *ctx.args], env)  # noqa: S606 - becomes the airflow process


JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _json(data: Any) -> None:
    print(json.dumps(data, indent=1, default=str))  # plain print: JSON is not markup


@app.command()
def check(
    specs: Annotated[list[str] | None, typer.Argument(help="Specs [default: all in pipelines/].")] = None,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the spec format's JSON Schema (for editors).")
    ] = False,
    as_json: JsonOut = False,
) -> None:
    """Validate specs, show the columns each one writes, and compare them with its tables.

    Every spec is checked and every problem listed. Exits 2 when a spec is invalid, 1 when
    a valid spec no longer matches a table it already wrote (a column's type, the
    partitioning, a column added or removed).
    """
    if schema:
        _json(PipelineSpec.model_json_schema(by_alias=True))
        return
    results = checks.check([Path(s) for s in specs] if specs else None)
    invalid = [r for r in results if not r.valid]
    mismatched = [r for r in results if r.tables == "mismatch"]
    if as_json:
        _json({"specs": [r.as_dict() for r in results], "invalid": len(invalid), "mismatched": len(mismatched)})
    else:
        for r in results:
            if r.pipeline is None:
                for where, message in r.problems:
                    errors.print(
                        f"[bold red]error:[/] {escape(r.file)}: {escape(where + ': ' if where else '')}{escape(message)}",
                        soft_wrap=True,
                    )
                continue
            p = r.pipeline
            table = Table("column", "from", "type", title=escape(f"{p.name}  ({p.spec.sink.format} -> {p.sink_path})"))
            for c in p.plan.columns:
                table.add_row(escape(c.name), escape(c.source), escape(c.type.sql()))
            console.print(table)
            if r.tables == "mismatch":
                errors.print(f"[bold red]error:[/] {escape(r.detail)}", soft_wrap=True)
            elif r.tables == "unreadable":
                warn(f"{p.name}: {r.detail}")
            else:
                say(f"tables: {r.detail}")
    if invalid:
        if not as_json:
            errors.print(f"{len(invalid)} of {len(results)} spec(s) invalid")
        raise typer.Exit(2)
    if mismatched:
        if not as_json:
            errors.print(f"{len(mismatched)} spec(s) do not match their tables")
        raise typer.Exit(1)
    if not as_json:
        console.print(f"[green]{len(results)} spec(s) valid[/]")


@app.command()
def audit(
    spec: SpecArg, last: Annotated[int, typer.Option(help="How many batches.")] = 20, as_json: JsonOut = False
) -> None:
    """Per-batch counts: records in = records out + records quarantined."""
    p = _pipeline(spec)
    files = list(audits.audit_files([Path(p.audit_path)]))[-last:]
    if not files:
        fail(f"no batches recorded yet in {p.audit_path}", 1)
    if as_json:
        _json([dataclasses.asdict(audits.read(f)) for f in files])
        return
    table = Table(
        "batch",
        "in",
        "out",
        "rows out",
        "quarantined",
        "already present",
        "expectations failed",
        "seconds",
        "written at",
    )
    for f in files:
        a = audits.read(f)
        failed = ", ".join(
            f"{name} {c['failed']}/{c['checked']} ({c['action']})" for name, c in a.failed_expectations().items()
        )
        table.add_row(
            *(
                str(v)
                for v in (
                    a.batch_id,
                    a.records_in,
                    a.records_out,
                    a.rows_out,
                    a.records_quarantined,
                    a.records_already_present,
                )
            ),
            escape(failed),
            str(a.seconds),
            a.written_at,
        )
    console.print(table)


@app.command()
def validate(
    spec: SpecArg,
    date: Annotated[
        str | None,
        typer.Option(help="A date (2026-11-20) or a range (2026-11-18..2026-11-20) of date partitions."),
    ] = None,
    latest: Annotated[
        int | None,
        typer.Option(min=1, help="The newest N date partitions [default: expectations.validation.partitions]."),
    ] = None,
    master: Master = None,
    as_json: JsonOut = False,
) -> None:
    """Validate the table with Great Expectations; exit 1 when a critical expectation fails."""
    p = _pipeline(spec)
    chosen = validation.selection(p, dates=date, latest=latest)
    if as_json:
        report = validation.validate(p, LocalTarget(master), chosen)
        print(report.model_dump_json(indent=1))
    else:
        report = _validate(p, chosen, master)
    if not report.passed:
        raise typer.Exit(1)


def _validate(p: Pipeline, chosen: Selection, master: str | None = None) -> Report:
    report = validation.validate(p, LocalTarget(master), chosen)
    _print_validation(report)
    return report


def _print_validation(report: Report) -> None:
    table = Table(
        "partition", "expectation", "GX expectation", "severity", "result", "failed", "observed", title=report.suite
    )
    for o in report.outcomes:
        result = (
            "[green]pass[/]" if o.success else ("[bold red]FAIL[/]" if o.severity == "critical" else "[yellow]warn[/]")
        )
        observed = f"error: {o.error}" if o.error else o.observed or ", ".join(o.examples)
        table.add_row(
            o.partition,
            o.rule,
            o.expectation.removeprefix("expect_"),
            o.severity,
            result,
            "" if o.failed is None else f"{o.failed} of {o.checked}",
            observed if len(observed) <= 40 else observed[:39] + "…",
        )
    console.print(table)
    summary = report.summary()
    console.print(summary[0], soft_wrap=True)
    console.print(summary[-1], soft_wrap=True)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A Spark SQL query over the pipeline tables.")],
    limit: Annotated[int, typer.Option(help="Rows to show at most.")] = 20,
) -> None:
    """Run SQL over the output tables; each pipeline NAME has views NAME and NAME_quarantine."""
    from jobs.session import local_session
    from jobs.sql import register_tables

    pipelines, invalid = valid_pipelines()
    for exc in invalid:
        warn(f"skipping a spec: {exc}")
    with console.status("starting Spark"):
        spark = local_session("sluice-sql")
        views = register_tables(spark, pipelines, warn)
    try:
        _show(spark.sql(query), limit)
    except Exception as exc:  # AnalysisException, ParseException: show Spark's message
        fail(f"{str(exc).splitlines()[0]}\nviews: {', '.join(sorted(views)) or 'none yet'}")
    finally:
        spark.stop()


def _show(df: Any, limit: int, title: str | None = None) -> None:
    rows = df.limit(limit + 1).collect()
    table = Table(*df.columns, title=title)
    for r in rows[:limit]:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)
    if len(rows) > limit:
        console.print(f"(first {limit} rows shown)")


# --- demo --------------------------------------------------------------------------------

DEMO = (("device_signals", 2000), ("payments", 1000))


@app.command()
def demo(
    bad_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of bad records.")] = 0.02,
    keep_broker: Annotated[bool, typer.Option(help="Leave the broker running afterwards.")] = False,
) -> None:
    """End to end on the embedded broker: produce, ingest, report, stop.

    Starts Kafka, creates the topics, produces device signals and payments (with a few bad
    records), runs both ingest pipelines with spark-submit until they have caught up,
    then prints rows per date partition, quarantined records by reason and a query, and
    validates the tables that declare expectations with Great Expectations.
    """
    broker = EmbeddedBroker.default()
    try:
        with console.status(f"starting Kafka on {broker.bootstrap}"):
            broker.start()
        console.print(f"[bold]1.[/] Kafka up on {broker.bootstrap}")
        pipelines = [_pipeline(name) for name, _ in DEMO]
        for p, (_, count) in zip(pipelines, DEMO, strict=True):
            topics = p.spec.source.topics or []
            create_topics(p.spec.source.bootstrap_servers, topics, partitions=2)
            gen = EventGenerator(p, seed=time.time_ns() % 2**32)
            report = send(p.spec.source.bootstrap_servers, topics[0], synthetic(gen, count, bad_fraction))
            console.print(f"[bold]2.[/] {p.name}: ", end="")
            _print_report(report)
        for p in pipelines:
            console.print(f"[bold]3.[/] running {p.name} ({p.spec.sink.format}) with spark-submit, available-now")
            LocalTarget().run(ingest_submission(p.spec_path, pipeline_name=p.name, available_now=True))
        _demo_report(pipelines)
        for p in pipelines:
            if p.spec.expectations.declared:
                console.print(f"[bold]5.[/] sluice validate {p.name}: Great Expectations on the newest partition")
                if not _validate(p, Selection(latest=1)).passed:
                    fail(f"{p.name}: a critical expectation failed", 1)
    except (BrokerError, ProduceError) as exc:
        fail(str(exc))
    finally:
        if not keep_broker:
            broker.stop()
            console.print("Kafka stopped")


def _demo_report(pipelines: list[Pipeline]) -> None:
    from jobs.session import local_session
    from jobs.sql import register_tables

    with console.status("starting Spark for the report"):
        spark = local_session("sluice-demo-report")
        register_tables(spark, pipelines, warn)
    try:
        for p in pipelines:
            col = p.spec.date_partition.column
            per_day = spark.table(p.name).groupBy(col).count().withColumnRenamed("count", "rows").orderBy(col)
            _show(per_day, 50, f"{p.name}: rows per {col} partition")
            if spark.catalog.tableExists(p.quarantine_table):
                by_reason = spark.table(p.quarantine_table).groupBy("reason").count().orderBy("count", ascending=False)
                _show(by_reason, 20, f"{p.quarantine_table}: records by reason")
            else:
                console.print(f"{p.quarantine_table}: nothing quarantined")
        query = (
            "SELECT device_type, count(*) AS readings, round(avg(signal), 1) AS avg_signal_dbm, "
            "min(date) AS first_day, max(date) AS last_day FROM device_signals GROUP BY device_type "
            "ORDER BY readings DESC"
        )
        console.print(f'[bold]4.[/] sluice sql "{query}"')
        _show(spark.sql(query), 10)
    finally:
        spark.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
