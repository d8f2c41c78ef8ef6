"""``sluice sql`` with no query: an interactive shell.

Statements end with ``;`` and may span lines; ``\\d`` lists the tables, ``\\d NAME``
describes one, ``\\f csv|json|table`` switches the output, ``\\q`` (or Ctrl-D) quits. History
is kept in ``$SLUICE_HOME/sql/history`` across sessions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from sluice.sql.client import Format, Result, SqlError, SqlSession
from sluice.sql.settings import DATABASE

HELP = "statements end with ;   \\d [TABLE] tables   \\f table|csv|json output   \\q quit"
PROMPT, MORE = "sluice> ", "     -> "
#: What Ctrl-C sends: the statement being typed is dropped, as psql does.
CANCEL = "\x03"


def statements(lines: Iterable[str]) -> Iterator[str]:
    """Complete statements and meta-commands from lines as typed. A meta-command is a line
    of its own starting with a backslash; anything else runs once a line ends with ``;``."""
    pending: list[str] = []
    for line in lines:
        if line == CANCEL:
            pending = []
            continue
        stripped = line.strip()
        if not pending and stripped.startswith("\\"):
            yield stripped
            continue
        if stripped:
            pending.append(line.rstrip())
        if stripped.endswith(";"):
            yield "\n".join(pending)
            pending = []
    if pending:
        yield "\n".join(pending)


def meta_sql(command: str) -> str | None:
    """The SQL a meta-command stands for (None for those that are not SQL)."""
    name, _, arg = command.partition(" ")
    if name == "\\d":
        return f"DESCRIBE TABLE {arg.strip()}" if arg.strip() else f"SHOW TABLES IN {DATABASE}"
    return None


class Shell:
    def __init__(
        self,
        session: SqlSession,
        show: Callable[[Result, Format], None],
        say: Callable[[str], None],
        fmt: Format = "table",
        limit: int | None = 100,
    ) -> None:
        self.session, self.show, self.say, self.fmt, self.limit = session, show, say, fmt, limit

    def run(self, lines: Iterable[str]) -> None:
        for stmt in statements(lines):
            if stmt in ("\\q", "\\quit"):
                return
            if stmt.startswith("\\f"):
                fmt = stmt[2:].strip()
                if fmt in ("table", "csv", "json"):
                    self.fmt = fmt  # type: ignore[assignment]
                else:
                    self.say("\\f takes table, csv or json")
                continue
            sql = meta_sql(stmt) if stmt.startswith("\\") else stmt
            if sql is None:
                self.say(HELP)
                continue
            try:
                self.show(self.session.run(sql, self.limit), self.fmt)
            except SqlError as exc:
                self.say(f"error: {exc}")

    def interact(self, history: Path) -> None:
        import readline

        history.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # no history yet
            readline.read_history_file(history)
        self.say(f"connected to {self.session.where}; {HELP}")
        try:
            self.run(_typed())
        finally:
            readline.write_history_file(history)


def _typed() -> Iterator[str]:
    prompt = PROMPT
    while True:
        try:
            line = input(prompt)
        except EOFError:
            return
        except KeyboardInterrupt:
            print()
            prompt = PROMPT
            yield CANCEL
            continue
        yield line
        prompt = PROMPT if line.strip().endswith(";") or line.strip().startswith("\\") else MORE
