"""SQL in a spec (a row rule's ``sql``, a continuous rule or filter), checked when it loads.

Parsed with sqlglot's Spark dialect, so a syntax error or a column the flattened plan does
not have is refused with the field's name, not found by Spark mid-stream.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError


def problem(expr: str, columns: Iterable[str]) -> str | None:
    """What is wrong with a boolean SQL expression over ``columns``, or None."""
    try:
        tree = sqlglot.parse_one(expr, dialect="spark")
    except (ParseError, TokenError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not valid Spark SQL: {first}"
    if tree is None:
        return "not valid Spark SQL: empty"
    if isinstance(tree, (exp.Select, exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Command)):
        return "an expression is expected (a condition such as amount > 0), not a statement"
    known = {c.lower() for c in columns}
    known |= {v.name.lower() for lam in tree.find_all(exp.Lambda) for v in lam.expressions}  # x in x -> x > 1
    unknown = sorted({c.name for c in tree.find_all(exp.Column) if c.name and c.name.lower() not in known})
    if unknown:
        return f"no column {', '.join(map(repr, unknown))} (columns: {', '.join(sorted(columns))})"
    return None
