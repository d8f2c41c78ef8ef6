"""How a nested event becomes flat columns: the naming rule, as a plan Spark applies.

The rule, in order:

1. A struct is flattened into its fields; a field's column name is its path joined with
   the separator (``_`` by default): ``device.location.lat`` -> ``device_location_lat``.
2. ``rename`` maps a dotted path to a name. On a struct it renames the prefix of all its
   fields (``{"device.location": "loc"}`` gives ``loc_lat``).
3. ``keep`` lists structs kept whole as one struct column.
4. Arrays and maps stay as they are, unless ``explode`` lists the array: then each element
   becomes a row (``explode_outer``: an empty or missing array still gives one row), and an
   element struct is flattened under the array's name. Exploded paths form one chain (each
   inside the previous one), because two sibling explodes would multiply rows.
5. Characters other than letters, digits and ``_`` become ``_``.
6. Two sources that end with the same name (compared case-insensitively, as Spark does),
   or a name that collides with a column Sluice adds, is a spec error: nothing is renamed
   silently. Fix it with ``rename``.

The plan is plain data (SQL expressions and names), so it can be checked without Spark.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from sluice.spec.columns import (  # noqa: F401 - the plan's names, as its users read them
    EVENT_TIME,
    INGESTED_AT,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    KAFKA_TIMESTAMP,
    KAFKA_TOPIC,
    METADATA_COLUMNS,
    PARSED,
    RESCUED,
)
from sluice.spec.schema import Array, DataType, Field, Struct

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class FlattenError(ValueError):
    """A flattening rule that cannot be applied, or names that would collide."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Column:
    """One output column: the SQL expression that reads it and the name it gets."""

    source: str  # dotted path in the event, e.g. "payload.commits[].sha"
    expr: str  # Spark SQL expression over the parsed event or an exploded alias
    name: str
    type: DataType
    #: The schema's COMMENT of the field, if any: the table column's comment.
    comment: str = ""

    @property
    def path(self) -> str:
        """The field's dotted path as rules and lineage name it (``payload.commits.sha``)."""
        return _plain(self.source)


@dataclass(frozen=True)
class Explode:
    """An array turned into rows: ``explode_outer(expr) AS alias``."""

    source: str
    expr: str
    alias: str


@dataclass(frozen=True)
class FlattenPlan:
    columns: tuple[Column, ...]
    explodes: tuple[Explode, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def plan_flatten(
    schema: Struct,
    *,
    separator: str = "_",
    rename: dict[str, str] | None = None,
    explode: list[str] | None = None,
    keep: list[str] | None = None,
    reserved: tuple[str, ...] = (),
) -> FlattenPlan:
    """Compute the columns of the flat table, or raise :class:`FlattenError`."""
    rename = dict(rename or {})
    explode_set = list(explode or [])
    keep_set = set(keep or [])
    _check_rule_paths(schema, rename, explode_set, keep_set)
    _check_explode_chain(explode_set)

    columns: list[Column] = []
    explodes: list[Explode] = []

    def walk(struct: Struct, path: str, base_expr: str, prefix: str) -> None:
        for f in struct.fields:
            dotted = f"{path}.{f.name}" if path else f.name
            expr = f"{base_expr}.{quote(f.name)}"
            name = rename.get(_plain(dotted), f"{prefix}{separator}{f.name}" if prefix else f.name)
            if isinstance(f.type, Struct) and _plain(dotted) not in keep_set:
                walk(f.type, dotted, expr, name)
            elif isinstance(f.type, Array) and _plain(dotted) in explode_set:
                alias = f"__x{len(explodes)}"
                explodes.append(Explode(source=_plain(dotted), expr=expr, alias=alias))
                element = f.type.element
                if isinstance(element, Struct) and _plain(dotted) not in keep_set:
                    walk(element, f"{dotted}[]", quote(alias), name)
                else:
                    columns.append(Column(f"{dotted}[]", quote(alias), _safe(name), element, _comment(f)))
            else:
                columns.append(Column(dotted, expr, _safe(name), f.type, _comment(f)))

    walk(schema, "", PARSED, "")
    _check_collisions(columns, reserved)
    unused = set(explode_set) - {e.source for e in explodes}
    if unused:  # an explode under a kept struct is never reached
        raise FlattenError("flatten.explode", f"cannot explode {sorted(unused)}: it sits inside a kept struct")
    return FlattenPlan(tuple(columns), tuple(explodes))


def _comment(f: Field) -> str:
    comment = f.metadata.get("comment")
    return comment if isinstance(comment, str) else ""


def _plain(dotted: str) -> str:
    """``payload.commits[].author`` -> ``payload.commits.author`` (how rules name paths)."""
    return dotted.replace("[]", "")


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name)


def _check_rule_paths(schema: Struct, rename: dict[str, str], explode: list[str], keep: set[str]) -> None:
    for path, new in rename.items():
        if _resolve(schema, path) is None:
            raise FlattenError(f"flatten.rename.{path}", f"no field {path!r} in the schema")
        if not new or _UNSAFE.search(new):
            raise FlattenError(f"flatten.rename.{path}", f"{new!r} is not a column name (letters, digits and _ only)")
    for path in explode:
        target = _resolve(schema, path)
        if target is None:
            raise FlattenError("flatten.explode", f"no field {path!r} in the schema")
        if not isinstance(target, Array):
            raise FlattenError("flatten.explode", f"{path!r} is a {target.sql()}, only arrays can be exploded")
    for path in keep:
        target = _resolve(schema, path)
        if target is None:
            raise FlattenError("flatten.keep", f"no field {path!r} in the schema")
        if not isinstance(target, Struct) and not (isinstance(target, Array) and isinstance(target.element, Struct)):
            raise FlattenError("flatten.keep", f"{path!r} is a {target.sql()}, only structs can be kept whole")


def _resolve(schema: Struct, dotted: str) -> DataType | None:
    """The type at a dotted path, looking through structs and array elements."""
    current: DataType = schema
    for part in dotted.split("."):
        while isinstance(current, Array):
            current = current.element
        if not isinstance(current, Struct):
            return None
        match = [f for f in current.fields if f.name == part]
        if not match:
            return None
        current = match[0].type
    return current


def _check_explode_chain(explode: list[str]) -> None:
    ordered = sorted(explode, key=lambda p: p.count("."))
    for outer, inner in itertools.pairwise(ordered):
        if not inner.startswith(outer + "."):
            raise FlattenError(
                "flatten.explode",
                f"{outer!r} and {inner!r} are not nested: exploding both would multiply rows; "
                "explode one and keep the other as an array",
            )


def _check_collisions(columns: list[Column], reserved: tuple[str, ...]) -> None:
    owners: dict[str, list[str]] = {}
    for name in reserved:
        owners.setdefault(name.lower(), []).append(f"(added by Sluice: {name})")
    for col in columns:
        owners.setdefault(col.name.lower(), []).append(col.source)
    clashes = {name: who for name, who in owners.items() if len(who) > 1}
    if clashes:
        name, who = sorted(clashes.items())[0]
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        raise FlattenError(
            "flatten",
            f"column name {name!r} would come from {' and '.join(who)}{more}; "
            f"add a flatten.rename entry for one of them",
        )
