"""What every command shares: the two consoles, messages, and the common arguments.

Results go to stdout, messages and errors to stderr. Text that comes from a spec, a path
or Spark is escaped, so ``[bold]`` in a topic name is printed, not read as markup.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from sluice.spec import Pipeline

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

SpecArg = Annotated[str, typer.Argument(help="A spec file, or a pipeline name from pipelines/.")]
Bootstrap = Annotated[
    str | None, typer.Option("--bootstrap", help="Kafka bootstrap servers [default: the embedded broker].")
]
Master = Annotated[str | None, typer.Option(help="Spark master [default: $SLUICE_SPARK_MASTER or local[2]].")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def warn(message: str) -> None:
    errors.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def error(message: str) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    error(message)
    raise typer.Exit(code)


def say(message: str) -> None:
    """Print text that is not markup (paths, spec values, Spark's messages) as it is."""
    console.print(escape(message), soft_wrap=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=1, default=str))  # plain print: JSON is not markup


def load(spec: str) -> Pipeline:
    # Imported here: the spec loader brings pydantic and sqlglot, which cost most of a
    # second that `sluice --version`, `--help` and the SQL client do not need.
    from sluice import registry
    from sluice.spec import load_pipeline

    return load_pipeline(spec, schemas=registry.schema_file)  # a SpecError reaches main(), which reports it
