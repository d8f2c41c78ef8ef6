"""The ``sluice`` command: the embedded broker, topics, producers, streams, checks and SQL.

Each command translates its arguments into a call of :mod:`sluice.ops` (or the embedded
broker's), and Sluice's errors into one line on stderr and an exit code (:func:`main`).
Every command has ``--help``. Commands that need Spark (``sql``, ``demo``) import it
only when they run, so the rest start instantly.

Registering the commands happens on every run, ``--version`` and ``--help`` included, so
the modules of this package import at their top only what that needs: typer, Rich's console
and Sluice's light modules. The spec loader (pydantic, sqlglot), :mod:`sluice.ops`,
:mod:`sluice.dev` and confluent_kafka are imported in the command bodies that use them, and
``tests/unit/test_cli_imports.py`` keeps it so. Typer evaluates the commands' annotations
when it builds them, so the types of their parameters must come from light modules too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import sluice
from sluice.cli import broker, cluster, quality, schema, sql, stream, tables
from sluice.cli.output import console, error, fail, say
from sluice.errors import NothingToDo, SluiceError

if TYPE_CHECKING:
    from confluent_kafka import KafkaException

# Help texts are plain text: "[default: ...]" and "local[2]" must not be read as Rich markup.
app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Sluice: Kafka JSON events to date-partitioned Delta/Parquet tables with Spark.",
)
app.add_typer(broker.kafka_app, name="kafka")
app.add_typer(broker.topics_app, name="topics")
app.add_typer(sql.sql_app, name="sql")
app.add_typer(schema.schema_app, name="schema")
app.add_typer(cluster.cluster_app, name="cluster")


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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def airflow(ctx: typer.Context) -> None:
    """Run Airflow (its own venv) with Sluice's DAGs and Spark runtime, e.g. `sluice airflow standalone`."""
    from sluice.airflow.env import airflow_binary, airflow_env, run_standalone

    try:
        binary = airflow_binary()
    except FileNotFoundError as exc:
        fail(str(exc))
    env = os.environ | airflow_env()
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    if ctx.args[:1] == ["standalone"]:  # a SIGTERM must stop its components too
        sys.exit(run_standalone(binary, ctx.args, env))
    os.execve(binary, [str(binary), *ctx.args], env)  # noqa: S606 - becomes the airflow process


for command in (
    broker.produce,
    broker.replay,
    stream.run,
    stream.start,
    stream.stop,
    stream.restart,
    stream.rebuild,
    stream.supervise,
    stream.status,
    stream.backfill,
    quality.check,
    quality.preview,
    stream.audit,
    quality.validate,
    tables.demo,
):
    app.command()(command)


def main() -> None:
    """The console script: Sluice's errors become one message on stderr and an exit code."""
    try:
        app()
    except NothingToDo as exc:
        say(str(exc))
        sys.exit(0)
    except SluiceError as exc:
        error(str(exc))
        sys.exit(exc.exit_code)
    except _kafka_exception() as exc:  # a topics or producer command with the broker away
        from sluice.topics import kafka_reason

        error(f"Kafka: {kafka_reason(exc)} (the embedded broker starts with `sluice kafka up`)")
        sys.exit(1)


def _kafka_exception() -> tuple[type[KafkaException], ...]:
    """confluent_kafka's KafkaException if a command imported confluent_kafka; none can be raised otherwise.

    An except clause's expression is evaluated only when an exception reaches it, so this
    keeps confluent_kafka out of the commands that never talk to Kafka.
    """
    kafka = sys.modules.get("confluent_kafka")
    return (kafka.KafkaException,) if kafka is not None else ()
