"""``sluice cluster up|down|status|env``: the production layout on this machine (`make cluster`)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated

import typer

from sluice.cli.output import JsonOut, console, fail, print_json, say
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.dev.layout import Layout

cluster_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The production layout on this machine: PostgreSQL, Redis, three Kafka brokers, a Spark master and "
    "two workers, S3Proxy, and Airflow with two Celery workers as two hosts.",
)


@cluster_app.command("up")
def up() -> None:
    """Start every server of the layout that is not running (its data is kept between runs)."""
    layout = _layout()
    try:
        layout.up(say)
    except (SluiceError, OSError, RuntimeError) as exc:
        fail(f"the cluster did not come up: {exc}")
    _table(layout)
    say(f'environment for a host of this layout: eval "$(sluice cluster env)"  (state in {layout.home})')


@cluster_app.command("down")
def down() -> None:
    """Stop every server of the layout; tables, topics and Airflow's database stay for the next `up`."""
    layout = _layout()
    if not layout.recorded:  # another SLUICE_HOME: its servers, if any, are not this one's to stop
        fail(
            f"found no cluster layout in {layout.home}; `sluice cluster up` records one there (is SLUICE_HOME the one it ran with?)"
        )
    layout.down(say)
    say("the cluster is down")


@cluster_app.command("status")
def status(as_json: JsonOut = False) -> None:
    """Each server, whether it runs, and its memory; exit code 1 if any is down."""
    layout = _layout()
    rows = layout.status()
    if as_json:
        print_json(
            [{"name": s.name, "pid": s.pid, "up": up, "rss_bytes": rss, "address": s.address} for s, up, rss in rows]
        )
    else:
        _table(layout)
    if not rows or not all(up for _, up, _ in rows):
        raise typer.Exit(1)


@cluster_app.command("env")
def env(host: Annotated[str, typer.Option(help="A host of the layout, e.g. worker-1.")] = "") -> None:
    """Shell exports for a host of the layout: `eval "$(sluice cluster env)"`."""
    layout = _layout()
    for key, value in layout.env().items():
        print(f"export {key}={shlex.quote(value)}")
    if host:
        print(f"export SLUICE_HOSTNAME={shlex.quote(host)}")


@cluster_app.command("bucket")
def bucket() -> None:
    """Create the bucket SLUICE_STORE names (s3a://bucket/...), if it does not exist: S3A does not create buckets."""
    from urllib.parse import urlsplit

    from sluice import config, storage

    where = config.store()
    backend = storage.for_uri(where)
    if not isinstance(backend, storage.S3Storage):
        fail(f"SLUICE_STORE ({where}) is not on S3: nothing to create")
        return
    name = urlsplit(where).netloc
    try:
        backend.filesystem(create_buckets=True).create_dir(name)
    except OSError as exc:
        fail(f"could not create the bucket {name}: {exc}")
    say(f"bucket {name} is there")


def _layout() -> Layout:
    from sluice.dev.layout import Layout  # psutil and every server's settings: only these commands need them

    return Layout.load()


def _table(layout: Layout) -> None:
    from rich.table import Table

    table = Table("service", "pid", "state", "memory", "address")
    total = 0
    for s, running, rss in layout.status():
        total += rss
        table.add_row(s.name, str(s.pid), "up" if running else "[red]down[/]", f"{rss / 2**20:,.0f} MiB", s.address)
    table.add_row("all", "", "", f"{total / 2**20:,.0f} MiB", "")
    console.print(table)
