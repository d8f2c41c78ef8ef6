"""``sluice check``, ``preview`` and ``validate``: is a spec sound, what does it make of real records,
does a table keep its promises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sluice.cli.output import JsonOut, Master, SpecArg, console, errors, load, print_json, say, warn

if TYPE_CHECKING:
    from rich.table import Table

    from sluice.records.validation import Outcome, Report, Selection
    from sluice.spec import Pipeline


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
    from rich.table import Table

    from sluice.ops import check as checks
    from sluice.spec import PipelineSpec

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
    from sluice.ops import validate as validation
    from sluice.ops.target import LocalTarget

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
    from sluice.ops import validate as validation
    from sluice.ops.target import LocalTarget

    report = validation.validate(p, LocalTarget(master), chosen)
    _print_validation(report)
    return report


def _print_validation(report: Report) -> None:
    for table in validation_tables(report):
        console.print(table)
    summary = report.summary()
    say(summary[0])
    say(summary[-1])


def validation_tables(report: Report) -> list[Table]:
    """A table per date partition, titled with its row count: each expectation by the rule's
    name (the GX expectation dimmed under it), its result (a failure is FAIL when critical,
    warning otherwise), how many rows failed, and the evidence. Only the evidence wraps, so
    the table fits an 80-column terminal with no value and no header cut."""
    from rich.table import Table

    rows = {p.date: p.rows for p in report.partitions}
    dates = list(rows) + sorted({o.partition for o in report.outcomes} - rows.keys())
    tables = []
    for day in dates:
        outcomes = [o for o in report.outcomes if o.partition == day]
        if not outcomes:
            continue
        title = f"{report.suite}: {day}" + (f" ({rows[day]} rows)" if day in rows else "")
        table = Table(title=escape(title))
        table.add_column("expectation", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("failed", no_wrap=True)
        table.add_column("evidence", overflow="fold", min_width=len("evidence"))
        for o in outcomes:
            table.add_row(
                f"{escape(o.rule)}\n[dim]{escape(o.expectation.removeprefix('expect_'))}[/]",
                _result(o),
                "" if o.failed is None else f"{o.failed} of {o.checked}",
                escape(_evidence(o)),
            )
        tables.append(table)
    return tables


def _result(o: Outcome) -> str:
    if o.success:
        return "[green]pass[/]"
    return "[bold red]FAIL[/]" if o.severity == "critical" else "[yellow]warning[/]"


def _evidence(o: Outcome) -> str:
    """What GX saw: its error, else the observed value and the first failing values."""
    if o.error:
        return f"error: {o.error}"
    parts = [] if o.observed is None else [o.observed]
    if o.examples:
        parts.append(", ".join(o.examples))
    return "; ".join(parts)


#: Columns every row has that a preview leaves out: its Kafka coordinates head each row instead.
_LINEAGE = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_ingested_at")


def _shown(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def preview(
    spec: SpecArg,
    n: Annotated[int, typer.Option("-n", min=1, help="How many records to read.")] = 20,
    file: Annotated[
        Path | None, typer.Option(help="Read the records from a newline-delimited JSON file instead of the topic.")
    ] = None,
    master: Master = None,
    as_json: JsonOut = False,
) -> None:
    """Show what a spec would make of real records, writing and committing nothing.

    Reads the newest N records of the spec's topics (or the first N lines of --file) and
    runs them through the pipeline's own parsing, rules and flattening in a local Spark
    session: the rows the table would get (with the event time and date partition), each
    quarantined record with its reason, the fields kept in _rescued, and what each row rule
    would do.
    """
    from rich.table import Table

    from sluice.ops import preview as previews

    p = load(spec)
    report = previews.preview(p, n, file, master)
    if as_json:
        print_json(report.as_dict())
        return
    say(f"{p.name}: {report.records_in} records from {report.source}; nothing committed, nothing written")
    say(
        f"{report.records_in} in = {report.records_out} out ({len(report.rows)} rows) "
        f"+ {len(report.quarantined)} quarantined"
    )
    columns = [c for c in report.columns if c not in _LINEAGE]
    # Records side by side, a column per record: a table's many columns fit a terminal as rows.
    per_table = max(1, (console.width - 24) // 22)
    for start in range(0, len(report.rows), per_table):
        chunk = report.rows[start : start + per_table]
        table = Table("column", *[f"{r['_kafka_partition']}:{r['_kafka_offset']}" for r in chunk])
        for c in columns:
            table.add_row(escape(c), *[escape(_shown(r.get(c))) for r in chunk])
        console.print(table)
    if report.quarantined:
        table = Table("record", "reason", "as sent", title="quarantined")
        for r in report.quarantined:
            text = r["raw_text"] or ""
            table.add_row(
                f"{r['_kafka_partition']}:{r['_kafka_offset']}",
                escape(r["reason"]),
                escape(text if len(text) <= 60 else text[:59] + "…"),
            )
        console.print(table)
    if report.rescued:
        say("kept in _rescued: " + ", ".join(f"{path} ({count})" for path, count in report.rescued.items()))
    if report.rules:
        table = Table("row rule", "action", "failed", "in the stream", title="expectations")
        for rule in report.rules:
            table.add_row(escape(rule.name), rule.action, f"{rule.failed} of {rule.checked}", escape(rule.effect()))
        console.print(table)
