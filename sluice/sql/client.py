"""Running SQL and showing what comes back, whether the endpoint or a local Spark session
answers: a :class:`Result`, a session protocol both implement, and the three output formats."""

from __future__ import annotations

import csv
import getpass
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sluice.errors import InvalidInput, SluiceError
from sluice.sql.settings import DATABASE

Format = Literal["table", "csv", "json"]


class SqlError(InvalidInput):
    """The statement was refused or failed: Spark's own message, without the Java around it."""


class EndpointUnreachable(SluiceError):
    transient = True


@dataclass(frozen=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False  # more rows than the limit asked for


class SqlSession(Protocol):
    #: Who answers, for messages: "the endpoint at 127.0.0.1:10000" or "a local Spark session".
    where: str

    def run(self, sql: str, limit: int | None = None) -> Result: ...

    def close(self) -> None: ...


class EndpointSession:
    """A DB-API connection to the endpoint through PyHive (what Superset uses too)."""

    def __init__(self, host: str, port: int, *, auth: str, user: str | None = None, password: str | None = None):
        from pyhive import hive
        from thrift.transport.TTransport import TTransportException

        self.where = f"the endpoint at {host}:{port}"
        try:
            self.conn = hive.connect(
                host=host,
                port=port,
                username=user or getpass.getuser(),
                password=password if auth == "password" else None,
                auth="CUSTOM" if auth == "password" else "NONE",
                database=DATABASE,
            )
        except TTransportException as exc:
            reason = str(exc)
            if "validating the login" in reason:
                raise SqlError(f"{self.where} refused the login: wrong user name or password") from None
            raise EndpointUnreachable(f"{self.where} did not answer: {reason}") from None

    def run(self, sql: str, limit: int | None = None) -> Result:
        from pyhive.exc import Error

        cursor = self.conn.cursor()
        try:
            cursor.execute(sql.strip().rstrip(";"))
            if not cursor.description:
                return Result([], [])
            rows = cursor.fetchall() if limit is None else cursor.fetchmany(limit + 1)
            columns = [d[0].split(".")[-1] for d in cursor.description]
        except Error as exc:
            raise SqlError(server_message(exc)) from None
        finally:
            cursor.close()
        return limited(columns, rows, limit)

    def close(self) -> None:
        self.conn.close()


def server_message(exc: BaseException) -> str:
    """The message of a HiveServer2 error status, without Thrift's and Java's wrapping:
    ``... errorMessage='Error running query: java.lang.SecurityException: sluice: ...'``."""
    status = getattr(exc.args[0], "status", None) if exc.args else None
    text = getattr(status, "errorMessage", None) or str(exc)
    text = re.sub(r"^Error running query:\s*", "", text.strip())
    text = re.sub(r"(?:[a-z]+\.)+[A-Z]\w*(?:Exception|Error):\s*", "", text)  # Java class names
    text = re.sub(r"^(\[[A-Z_.]+\])\s+\1\s*", r"\1 ", text)  # "[CLASS] [CLASS] ..." once
    return text.splitlines()[0] if text else "the endpoint reported an error without a message"


def limited(columns: list[str], rows: Sequence[Sequence[Any]], limit: int | None) -> Result:
    """The rows as a result; one row past ``limit`` (fetched to tell) marks it truncated."""
    kept = [tuple(r) for r in rows]
    if limit is not None and len(kept) > limit:
        return Result(columns, kept[:limit], truncated=True)
    return Result(columns, kept)


def as_csv(result: Result) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows(["" if v is None else v for v in row] for row in result.rows)
    return out.getvalue()


def as_json(result: Result) -> str:
    """One JSON object per row in a list; dates, decimals and timestamps as strings."""
    records = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
    return json.dumps(records, indent=1, default=str)
