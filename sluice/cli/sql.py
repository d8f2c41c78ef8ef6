"""``sluice sql``: queries, the interactive shell, and the SQL endpoint (serve, status, stop,
passwd). ``sluice sql "SELECT ..."`` and ``sluice sql`` alone are queries; a first word that
names a subcommand is that subcommand."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from sluice import config
from sluice.cli.output import JsonOut, Master, console, errors, print_json, say, warn
from sluice.errors import InvalidInput

# Light modules; typer needs Format and Auth, the options' types, when it builds the commands.
from sluice.sql.client import Format, Result, SqlError, as_csv, as_json
from sluice.sql.settings import DATABASE, Auth, Endpoint, password_file


class QueryFirst(TyperGroup):
    """Reads ``sluice sql SELECT ...`` as ``sluice sql query SELECT ...``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["query", *args]
        return super().parse_args(ctx, args)


sql_app = typer.Typer(
    cls=QueryFirst,
    rich_markup_mode=None,
    help="SQL on the pipelines' tables: sluice sql [QUERY], or serve/status/stop the JDBC endpoint.",
)

FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="How to print the rows.")]
User = Annotated[str | None, typer.Option(help="User name for the endpoint [default: $SLUICE_SQL_USER or yours].")]


@sql_app.command("query")
def query(
    statement: Annotated[
        str | None, typer.Argument(metavar="QUERY", help="Spark SQL; none starts an interactive shell.")
    ] = None,
    fmt: FormatOpt = "table",
    limit: Annotated[int | None, typer.Option(help="Rows at most [default: 20 for a table, all for csv/json].")] = None,
    user: User = None,
) -> None:
    """Run SQL on the output tables (database sluice: NAME and NAME_quarantine per pipeline).

    Goes through the SQL endpoint when it runs; otherwise starts a local Spark session on
    the same catalog. With no QUERY, an interactive shell. The password, when the endpoint
    asks for one, comes from $SLUICE_SQL_PASSWORD or a prompt.
    """
    from sluice.ops import sql as ops
    from sluice.sql.shell import Shell

    session = ops.open_session(user=user or os.environ.get("SLUICE_SQL_USER"), password=_password(), warn=warn)
    try:
        if statement is None:
            Shell(session, _show, say, fmt, limit or 100).interact(config.sluice_home() / "sql" / "history")
            return
        if limit is None and fmt == "table":
            limit = 20
        try:
            result = session.run(statement, limit)
        except SqlError as exc:
            if "NOT_FOUND" in str(exc) or "UNRESOLVED" in str(exc):
                tables = session.run(f"SHOW TABLES IN {DATABASE}")
                raise SqlError(
                    f"{exc}\ntables in {DATABASE}: {', '.join(r[1] for r in tables.rows) or 'none yet'}"
                ) from None
            raise
        _show(result, fmt)
    finally:
        session.close()


def _password() -> str | None:
    from sluice.ops import sql as ops

    st = ops.running()
    if st is None or st.auth != "password":
        return None
    if os.environ.get("SLUICE_SQL_PASSWORD"):
        return os.environ["SLUICE_SQL_PASSWORD"]
    if not sys.stdin.isatty():
        raise InvalidInput("the endpoint asks for a password: set SLUICE_SQL_PASSWORD")
    return str(typer.prompt("password", hide_input=True))


def _show(result: Result, fmt: Format) -> None:
    if fmt == "csv":
        sys.stdout.write(as_csv(result))
    elif fmt == "json":
        sys.stdout.write(as_json(result) + "\n")
    elif result.columns:
        from rich.table import Table

        table = Table(*result.columns)
        for row in result.rows:
            table.add_row(*("" if v is None else str(v) for v in row), style=None)
        console.print(table)
    if result.truncated:
        errors.print(f"(first {len(result.rows)} rows; --limit shows more)")


@sql_app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind [default: $SLUICE_SQL_HOST or 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [default: $SLUICE_SQL_PORT or 10000].")] = None,
    auth: Annotated[Auth | None, typer.Option(help="none, or password [default: $SLUICE_SQL_AUTH or none].")] = None,
    allow_writes: Annotated[
        bool, typer.Option(help="Let clients change tables (INSERT, DELETE, DROP, ...): administrators only.")
    ] = False,
    master: Master = None,
) -> None:
    """Start the JDBC/ODBC endpoint (Spark's Thrift server) detached, read-only by default."""
    from sluice.ops import sql as ops
    from sluice.ops.target import LocalTarget

    env = Endpoint.from_env()
    endpoint = Endpoint(host or env.host, port or env.port, auth or env.auth, allow_writes)
    with console.status("starting the SQL endpoint"):
        served = ops.serve(LocalTarget(master), endpoint, by="cli")
    say(served.summary())


@sql_app.command()
def status(json_out: JsonOut = False) -> None:
    """Is the endpoint up, where, and which tables it serves."""
    from sluice.ops import sql as ops

    report = ops.status()
    if json_out:
        print_json(report.as_dict())
        return
    s = report.status
    if not report.up or s is None:
        said = f" (last: {s.state}{', ' + s.error if s and s.error else ''})" if s else ""
        say(f"the SQL endpoint is not running{said}; `sluice sql serve` starts it")
        return
    endpoint = Endpoint(s.host, s.port, s.auth)  # type: ignore[arg-type]
    say(f"up: {endpoint.jdbc_url()} (auth {s.auth}, {'writes allowed' if s.allow_writes else 'read-only'})")
    say(f"SQLAlchemy/Superset: {endpoint.sqlalchemy_url()}")
    say(f"metastore: {s.metastore}; Spark UI: {s.ui}")
    say(f"tables: {', '.join(s.tables) or 'none yet'}")


@sql_app.command()
def stop() -> None:
    """Stop the endpoint."""
    from sluice.ops import sql as ops

    say(ops.stop(by="cli"))


@sql_app.command()
def passwd(
    user: Annotated[str, typer.Argument(help="The user to add, or whose password to change.")],
    remove: Annotated[bool, typer.Option(help="Remove the user instead.")] = False,
) -> None:
    """Set a user's password for `serve --auth password` (hashed, in $SLUICE_SQL_PASSWORD_FILE).

    The password is read from $SLUICE_SQL_NEW_PASSWORD, or asked for twice.
    """
    from sluice.sql import passwords

    path = password_file()
    if remove:
        say(f"removed {user} from {path}" if passwords.remove_user(path, user) else f"{user} is not in {path}")
        return
    secret: Any = os.environ.get("SLUICE_SQL_NEW_PASSWORD") or typer.prompt(
        "new password", hide_input=True, confirmation_prompt=True
    )
    passwords.set_password(path, user, str(secret))
    say(f"{user} can log in with that password ({path}); the endpoint reads the file on every login")
