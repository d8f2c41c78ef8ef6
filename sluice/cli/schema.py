"""``sluice schema``: diff two versions, check that one can follow another, draft the next."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sluice.cli.output import JsonOut, SpecArg, console, load, print_json, say, warn

if TYPE_CHECKING:
    from sluice.spec import evolution

schema_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Schema versions (schemas/<name>/v<N>.json): diff, compatibility, the next version from rescued data.",
)

SchemaArg = Annotated[str, typer.Argument(help="A schema file, or <name>/v<N> under schemas/.")]


def _changes(changes: list[evolution.Change], title: str) -> None:
    from rich.table import Table

    table = Table("field", "change", "compatible", "rule", title=escape(title))
    for c in changes:
        table.add_row(escape(c.path), escape(c.what), "yes" if c.compatible else "[bold red]no[/]", escape(c.rule))
    console.print(table)


def _as_dicts(changes: list[evolution.Change]) -> list[dict[str, object]]:
    return [
        {"path": c.path, "kind": c.kind, "old": c.old, "new": c.new, "compatible": c.compatible, "rule": c.rule}
        for c in changes
    ]


@schema_app.command()
def diff(old: SchemaArg, new: SchemaArg, as_json: JsonOut = False) -> None:
    """Every field added, removed or changed from OLD to NEW, with the rule that applies."""
    from sluice.ops import schema as schemas

    changes = schemas.diff(old, new)
    if as_json:
        print_json(_as_dicts(changes))
    elif changes:
        _changes(changes, f"{old} -> {new}")
    else:
        say(f"{old} and {new} declare the same fields")


@schema_app.command("check-compat")
def check_compat(old: SchemaArg, new: SchemaArg, as_json: JsonOut = False) -> None:
    """Can a pipeline running on OLD move to NEW on the same checkpoint? Exits 1 if not.

    A widened type is compatible between the schemas, but a table that exists cannot take
    it yet (see `sluice check`): that is a warning here.
    """
    from sluice.ops import schema as schemas
    from sluice.spec import evolution
    from sluice.spec.compatibility import WIDENING_REFUSED

    changes = schemas.diff(old, new)
    refused = evolution.incompatible(changes)
    for c in changes:
        if c.kind == "widened" and not as_json:
            warn(f"{c.path}: {c.what}: a table that exists cannot take it: {WIDENING_REFUSED}")
    if as_json:
        print_json({"compatible": not refused, "changes": _as_dicts(changes)})
    else:
        if changes:
            _changes(changes, f"{old} -> {new}")
        if refused:
            for c in refused:
                warn(f"not compatible: {c.describe()}")
        else:
            say(f"{new} is compatible with {old}")
    if refused:
        raise typer.Exit(1)


@schema_app.command()
def suggest(
    spec: SpecArg,
    write: Annotated[bool, typer.Option("--write", help="Write the draft as the next version's file.")] = False,
    as_json: JsonOut = False,
) -> None:
    """Draft the next schema version from the fields the pipeline's table rescued."""
    from sluice.ops import schema as schemas

    s = schemas.suggest(load(spec))
    if as_json:
        print_json(
            {
                "pipeline": s.pipeline,
                "current": str(s.current),
                "next": str(s.target),
                "records": s.records,
                "changes": _as_dicts(s.changes),
                "mismatched": s.mismatched,
                "unplaced": s.unplaced,
                "schema": s.schema.to_json(),
            }
        )
    elif not s.changes:
        say(f"{s.pipeline}: {s.records} rows with rescued data; no new field to add to {s.current}")
    else:
        _changes(s.changes, f"{s.current} -> {s.target} (from {s.records} rows with rescued data)")
    for path, types in s.mismatched.items():
        warn(f"{path} is declared, but values of type {', '.join(types)} did not fit it; change its type by hand")
    for path, n in s.unplaced.items():
        warn(f"{path} ({n} rows) cannot be placed in the schema")
    if write and s.changes:
        s.target.parent.mkdir(parents=True, exist_ok=True)
        s.target.write_text(s.render(), encoding="utf-8")
        say(f"wrote {s.target}; point the spec's schema: at it, then `sluice check`")
