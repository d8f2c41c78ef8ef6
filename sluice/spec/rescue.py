"""Rescued data: the fields of a record the schema does not declare, kept instead of dropped.

``from_json`` reads the fields a schema declares and ignores the rest, so a field a producer
adds would vanish without a trace. Every record is therefore also read once as a VARIANT,
and each object in it, at any depth, is compared with the struct the schema declares
there. What the schema does not declare is kept by its path:

=====================================  =============================================
the record                             ``_rescued``
=====================================  =============================================
``{"actor": {"id": 1, "pronouns": "they"}}``   ``{"actor.pronouns": "they"}``
``{"commits": [{"sha": "a", "verified": true}]}``  ``{"commits[0].verified": true}``
``{"tags": {"x": 1}, "new": [1, 2]}``  ``{"tags": {"x": 1}, "new": [1, 2]}`` (undeclared
                                       at the top: the whole value, as it came)
=====================================  =============================================

Values keep their JSON type. A field the spec lists under ``on_type_mismatch`` with
``rescue`` whose value does not fit its type is kept the same way (the column is NULL and
the row is written), where by default the record goes to quarantine.

Names are compared as Spark's JSON reader compares them: exactly, so ``ID`` beside a
declared ``id`` is rescued. A name of other characters than letters, digits and ``_`` is
written in backticks in a path (``{"a.b": 1}`` gives ```a.b```). A declared field whose name
cannot be written as a JSON path (it holds both ``'`` and ``]``) is not looked into. Map
values are looked into too (``tags[x].new``, the key as it is).

The expressions are built here, from the schema alone, and Spark runs them
(:func:`rescued_sql`); they use only built-in functions, so they run wherever the job does.
"""

from __future__ import annotations

import re

from sluice.spec.columns import VARIANT
from sluice.spec.quarantine import json_path, lit, parsed_sql
from sluice.spec.schema import Array, Atomic, DataType, Map, Struct

#: A MAP<STRING, VARIANT> with nothing in it.
EMPTY = "map_filter(map('', parse_json('null')), (k, v) -> false)"

#: An array index or map key in a rescued path (Java and Python read it alike).
INDEX = r"\[[^\]]*\]"


def normalize(path: str) -> str:
    """A rescued path without its array indexes and map keys: ``commits[3].x`` -> ``commits[].x``.
    Paths are counted this way when the most common ones are reported."""
    return re.sub(INDEX, "[]", path)


def _contains_struct(t: DataType) -> bool:
    if isinstance(t, Struct):
        return True
    if isinstance(t, Array):
        return _contains_struct(t.element)
    if isinstance(t, Map):
        return _contains_struct(t.value)
    return False


_PLAIN = re.compile(r"[A-Za-z0-9_]+")


def display(name: str) -> str:
    """A field's name in a rescued path: as it is, or in backticks unless it is only letters,
    digits and ``_`` (so a top-level ``"a.b"`` is never mistaken for ``b`` inside ``a``)."""
    return name if _PLAIN.fullmatch(name) else "`" + name.replace("`", "``") + "`"


def _display_sql(name_sql: str) -> str:
    """:func:`display`, in Spark SQL, of a name known only when the record is read."""
    quoted = f"concat('`', replace({name_sql}, '`', '``'), '`')"
    return f"CASE WHEN {name_sql} RLIKE '^[A-Za-z0-9_]+$' THEN {name_sql} ELSE {quoted} END"


def _child_path(path: str | None, name_sql: str) -> str:
    return name_sql if path is None else f"concat({path}, '.', {name_sql})"


def _walk(t: DataType, v: str, path: str | None, depth: int) -> list[str]:
    """MAP<STRING, VARIANT> expressions (never NULL) of what ``t`` does not declare in the
    variant ``v``, keyed by path; ``path`` is the SQL of ``v``'s own path (None at the top)."""
    k, x, e, i = f"k{depth}", f"x{depth}", f"e{depth}", f"i{depth}"
    if isinstance(t, Struct):
        names = ", ".join(lit(f.name) for f in t.fields)
        members = f"try_variant_get({v}, '$', 'map<string,variant>')"
        undeclared = f"map_filter({members}, ({k}, {x}) -> NOT array_contains(array({names}), {k}))"
        keyed = f"transform_keys({undeclared}, ({k}, {x}) -> {_child_path(path, _display_sql(k))})"
        out = [f"coalesce({keyed}, {EMPTY})"]
        for f in t.fields:
            path_to = json_path(f.name)
            if path_to is None or not _contains_struct(f.type):
                continue
            child = f"try_variant_get({v}, {lit(path_to)}, 'variant')"
            out += _walk(f.type, child, _child_path(path, lit(display(f.name))), depth + 1)
        return out
    if isinstance(t, Array) and _contains_struct(t.element):
        element = _merge(_walk(t.element, e, f"concat({path or lit('')}, '[', {i}, ']')", depth + 1))
        elements = f"transform(try_variant_get({v}, '$', 'array<variant>'), ({e}, {i}) -> {element})"
        return [
            f"coalesce(aggregate({elements}, {EMPTY}, (a{depth}, m{depth}) -> map_concat(a{depth}, m{depth})), {EMPTY})"
        ]
    if isinstance(t, Map) and _contains_struct(t.value):
        entries = f"map_entries(try_variant_get({v}, '$', 'map<string,variant>'))"
        value = _merge(_walk(t.value, f"{e}.value", f"concat({path or lit('')}, '[', {e}.key, ']')", depth + 1))
        merged = f"transform({entries}, {e} -> {value})"
        return [
            f"coalesce(aggregate({merged}, {EMPTY}, (a{depth}, m{depth}) -> map_concat(a{depth}, m{depth})), {EMPTY})"
        ]
    return []


def _merge(maps: list[str]) -> str:
    return maps[0] if len(maps) == 1 else f"map_concat({', '.join(maps)})"


def _raw(dotted: str) -> str:
    return f"try_variant_get({VARIANT}, {lit(json_path(dotted) or '$')}, 'variant')"


def mismatch_sql(dotted: str) -> str:
    """True when the field at ``dotted`` is in the record but ``from_json`` could not read it."""
    parsed = parsed_sql(dotted)
    raw = _raw(dotted)
    return f"({parsed} IS NULL AND {raw} IS NOT NULL AND NOT is_variant_null({raw}))"


def rescued_sql(schema: Struct, rescue: list[str]) -> str:
    """A MAP<STRING, VARIANT> expression over the columns ``__variant`` (the record) and
    ``__data`` (what ``from_json`` read): every undeclared field, and every field of
    ``rescue`` whose value did not fit, by path. Empty when there is nothing to rescue."""
    kept = [
        f"CASE WHEN {mismatch_sql(f)} THEN map({lit('.'.join(map(display, f.split('.'))))}, {_raw(f)}) ELSE {EMPTY} END"
        for f in rescue
    ]
    return _merge(_walk(schema, VARIANT, None, 0) + kept)


def rescuable(schema: Struct, dotted: str) -> str | None:
    """Why the field at ``dotted`` cannot be marked ``rescue`` (None when it can)."""
    found = schema.find(dotted)
    if found is None:
        return f"no field {dotted!r} in the schema (outside arrays)"
    if found.required:
        return f"{dotted!r} is required (not nullable): a value that does not fit cannot leave it empty"
    if not isinstance(found.type, Atomic):
        # Spark keeps what it can read inside a struct, array or map (partial results), so
        # a bad value in there leaves a NULL rather than an empty field: nothing to rescue by.
        return f"{dotted!r} has type {found.type.sql()}: only a field of a simple type can be rescued; mark its fields"
    if json_path(dotted) is None:
        return f"{dotted!r} has a name that cannot be written as a JSON path"
    return None
