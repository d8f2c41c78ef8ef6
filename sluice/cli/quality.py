"""``sluice check`` and ``sluice validate``: is a spec sound, does a table keep its promises."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sluice.cli.output import JsonOut, Master, SpecArg, console, errors, load, print_json, say, warn
from sluice.ops import check as checks
from sluice.ops import validate as validation
from sluice.ops.target import LocalTarget
from sluice.records.validation import Report, Selection
from sluice.spec import Pipeline, PipelineSpec


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
        print_json(PipelineSpec.model_json_schema(by_alias=True))
        return
    results = checks.check([Path(s) for s in specs] if specs else None)
    invalid = [r for r in results if not r.valid]
    mismatched = [r for r in results if r.tables == "mismatch"]
    if as_json:
        print_json({"specs": [r.as_dict() for r in results], "invalid": len(invalid), "mismatched": len(mismatched)})
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
            for name, origin, type_ in checks.columns(p):
                table.add_row(escape(name), escape(origin), escape(type_))
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
    p = load(spec)
    chosen = validation.selection(p, dates=date, latest=latest)
    if as_json:
        report = validation.validate(p, LocalTarget(master), chosen)
        print(report.model_dump_json(indent=1))
    else:
        report = validate_and_show(p, chosen, master)
    if not report.passed:
        raise typer.Exit(1)


def validate_and_show(p: Pipeline, chosen: Selection, master: str | None = None) -> Report:
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
