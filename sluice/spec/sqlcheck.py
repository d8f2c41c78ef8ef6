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


#: Functions whose result depends on more than their input rows: a batch replayed after a
#: crash would compute a different value than the one already written, or none Spark allows.
NON_DETERMINISTIC = {
    "rand",
    "randn",
    "random",
    "uuid",
    "shuffle",
    "current_timestamp",
    "current_date",
    "current_time",
    "now",
    "localtimestamp",
    "unix_timestamp",
    "first",
    "first_value",
    "last",
    "last_value",
    "any_value",
    "collect_list",
    "array_agg",
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "try_reflect",
    "reflect",
    "java_method",
}
#: sqlglot's own names for some of the above, when it parses them into typed nodes.
_NON_DETERMINISTIC_NODES = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.First, exp.Last)


def function_names(sql: str) -> tuple[set[str], bool]:
    """Function names in a SQL expression (lower case), and whether any is DISTINCT."""
    tree = sqlglot.parse_one(sql, dialect="spark")
    names = set()
    for node in tree.find_all(exp.Func):
        names.add((node.sql_name() if not isinstance(node, exp.Anonymous) else node.name).lower())
        if isinstance(node, _NON_DETERMINISTIC_NODES):
            names.add(type(node).__name__.lower())
    distinct = any(True for _ in tree.find_all(exp.Distinct))
    return names, distinct


def nondeterministic(expr: str) -> list[str]:
    """The functions in a SQL expression whose result is not a function of its row (sorted)."""
    names, _ = function_names(expr)
    return sorted(n for n in names if n in NON_DETERMINISTIC)
