"""``sluice kafka``, ``topics``, ``produce`` and ``replay``: the embedded broker and what goes into it."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sluice import config
from sluice.cli.output import Bootstrap, SpecArg, console, fail, load

if TYPE_CHECKING:
    from sluice.dev.produce import ProduceReport

kafka_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="The embedded Kafka broker (KRaft, localhost only)."
)
topics_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Kafka topics.")


@kafka_app.command("up")
def kafka_up(timeout: Annotated[float, typer.Option(help="Seconds to wait until it answers.")] = 90) -> None:
    """Start the broker (formatting its storage the first time) and wait until it answers."""
    from sluice.dev.broker import BrokerError, EmbeddedBroker

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
    from sluice.dev.broker import EmbeddedBroker

    stopped = EmbeddedBroker.default().stop()
    console.print("Kafka stopped" if stopped else "Kafka was not running")


@kafka_app.command("status")
def kafka_status() -> None:
    """Show whether the broker runs, where, and how many topics it has. Exit 1 if down."""
    from sluice.dev.broker import EmbeddedBroker

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
    from rich.table import Table

    from sluice.topics import create_topics

    wanted = list(names or [])
    if spec:
        wanted += load(spec).kafka.topics or []
    if not wanted:
        fail("name at least one topic, or --spec")
    table = Table("topic", "partitions", "")
    for r in create_topics(bootstrap or config.bootstrap_servers(), wanted, partitions):
        table.add_row(r.name, str(r.partitions), "created" if r.created else "existed")
    console.print(table)


@topics_app.command("offsets")
def topics_offsets(topic: str, bootstrap: Bootstrap = None) -> None:
    """Show a topic's end offset per partition."""
    from rich.table import Table

    from sluice.topics import end_offsets

    table = Table("partition", "end offset")
    for part, off in sorted(end_offsets(bootstrap or config.bootstrap_servers(), topic).items()):
        table.add_row(str(part), str(off))
    console.print(table)


# --- producing ---------------------------------------------------------------------------


def print_report(report: ProduceReport, extra: Counter[str] | None = None) -> None:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.kinds.items()))
    more = "".join(f", {k} {v}" for k, v in (extra or {}).items())
    console.print(
        f"sent [bold]{report.sent}[/] records to [bold]{report.topic}[/] in {report.seconds:.1f}s "
        f"({report.rate:,.0f}/s): {kinds}{more}"
    )


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
    from sluice.dev.generate import EventGenerator
    from sluice.dev.produce import ProduceError, send, synthetic

    p = load(spec)
    target = topic or next(iter(p.kafka.topics or []), None)
    if not target:
        fail(f"{p.name} subscribes by pattern; give --topic")
    gen = EventGenerator(p, seed=seed if seed is not None else time.time_ns() % 2**32, days=days)
    try:
        with console.status(f"producing {count} {p.name} events"):
            report = send(
                bootstrap or p.kafka.bootstrap_servers,
                str(target),
                synthetic(gen, count, bad_fraction),
                rate,
            )
    except (ProduceError, ValueError) as exc:
        fail(str(exc))
    print_report(report)


def replay(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Newline-delimited JSON file.")],
    topic: Annotated[str, typer.Option(help="Topic to write to.")],
    rate: Annotated[float | None, typer.Option(help="Records per second [default: as fast as possible].")] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Send each line of a newline-delimited JSON file, unchanged, as one record."""
    from sluice.dev.produce import ProduceError, read_ndjson, send

    stats: Counter[str] = Counter()
    try:
        report = send(bootstrap or config.bootstrap_servers(), topic, read_ndjson(file, stats), rate)
    except ProduceError as exc:
        fail(str(exc))
    print_report(report, stats)
