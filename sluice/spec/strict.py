"""Strict values: a field is written only as it was sent, or the record says why not.

``from_json`` coerces where it could refuse (checked on Spark 4.1, see STACK.md): it rounds a
number to a DECIMAL's scale, fills a DECIMAL from a numeric string, a DOUBLE from ``"NaN"``,
``"Infinity"`` or ``1e400``, a STRING with the JSON text of an object, array, number or
boolean, and a TIMESTAMP or DATE from ``"2021"`` or ``"10:15:00"`` (today's date, read from
the clock). Each of these is a type mismatch here unless the spec opts in, per field, under
``coerce``:

==================  ===========================  ==============================================
type                by default, refused          ``coerce`` opt-in
==================  ===========================  ==============================================
DECIMAL(p,s)        more than s decimal places   ``round: half_up`` (rounded as Spark does)
DECIMAL(p,s)        a numeric string             ``from_string: true``
FLOAT, DOUBLE       NaN, Infinity, ``1e400``     ``allow_non_finite: true``
FLOAT               a number beyond its range    (none: it would be written as Infinity)
STRING              a number, boolean, object    ``json_text: true`` (Spark's JSON text of it:
                    or array                     ``1e2`` is written ``100.0``)
TIMESTAMP           anything but an ISO-8601     (none)
                    date and time
DATE                anything but an ISO-8601     (none)
                    date
==================  ===========================  ==============================================

Integers and booleans need no check: ``from_json`` already refuses ``"42"``, ``42.0`` and
``"true"`` for them. The event-time field is read by its ``event_time.format``
(:mod:`sluice.spec.eventtime`), not here. Arrays are not looked into (as for the other type
mismatches, see :mod:`sluice.spec.quarantine`).

Each check compares what ``from_json`` made of a field with the record's VARIANT (strict
JSON, read once for rescued data): the value's JSON kind and, for a DECIMAL, its exact scale.
A check is NULL when the value is kept as it came, and otherwise the detail of the reason:
``type mismatch: amount (2000.004 has more than 2 decimal places)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from sluice.spec.columns import VARIANT
from sluice.spec.eventtime import ISO_DATE, ISO_DATE_TIME
from sluice.spec.model import StrictModel
from sluice.spec.quarantine import json_path, lit, nodes
from sluice.spec.schema import Atomic, Struct

#: Where a wording function's text takes a value that only Spark knows.
MARK = "\x00"

#: Longest raw value quoted in a reason; a longer one is cut with an ellipsis.
SHOWN = 40


class Coerce(StrictModel):
    """A field's opt-ins (the spec's ``coerce.<field>``), each off by default: then a value
    that does not fit the field's type exactly is a type mismatch."""

    round: Literal["half_up"] | None = None
    """DECIMAL: more decimal places than the scale, rounded half up (as Spark rounds)."""
    from_string: bool = False
    """DECIMAL: a numeric string such as "2500.00"."""
    allow_non_finite: bool = False
    """FLOAT, DOUBLE: NaN and infinities ("NaN", "Infinity", 1e400)."""
    json_text: bool = False
    """STRING: a number, boolean, object or array, kept as Spark's JSON text of it."""


STRICT = Coerce()


#: Which opt-in fits which type (by the Spark JSON name's start).
FITS = {
    "round": ("decimal",),
    "from_string": ("decimal",),
    "allow_non_finite": ("float", "double"),
    "json_text": ("string",),
}


# --- the wording, shared with the synthetic generator ---------------------------------------


def not_a(shown: str, kind: str, dtype: Atomic) -> str:
    return f"{shown} is {kind}, expected {dtype.sql()}"


def too_many_places(shown: str, scale: int) -> str:
    return f"{shown} has more than {scale} decimal places"


def not_finite(shown: str) -> str:
    return f"{shown} is not a finite number"


def out_of_range(shown: str, dtype: Atomic) -> str:
    return f"{shown} is outside the range of {dtype.sql()}"


def not_iso(shown: str, date_only: bool) -> str:
    return f"{shown} is not an ISO-8601 {'date' if date_only else 'date and time'}"


def item(dotted: str, detail: str) -> str:
    return f"{dotted} ({detail})"


def _words(template: str, *values: str) -> str:
    """A wording function's text as SQL, with SQL expressions in place of its :data:`MARK` characters."""
    parts = template.split(MARK)
    out = [lit(parts[0])]
    for value, part in zip(values, parts[1:], strict=True):
        out += [value, lit(part)]
    return f"concat({', '.join(out)})"


def applicable(option: str, dtype: Atomic) -> bool:
    return dtype.name.startswith(FITS[option])


def shown(variant: str) -> str:
    """The raw value of a VARIANT as JSON text, cut to :data:`SHOWN` characters."""
    text = f"to_json({variant})"
    return f"CASE WHEN length({text}) > {SHOWN} THEN concat(substr({text}, 1, {SHOWN - 3}), '...') ELSE {text} END"


def _kind(kind: str) -> str:
    """A JSON value's kind in words, from ``schema_of_variant``."""
    return (
        f"CASE WHEN {kind} LIKE 'OBJECT%' THEN 'an object' WHEN {kind} LIKE 'ARRAY%' THEN 'an array' "
        f"WHEN {kind} = 'STRING' THEN 'a string' WHEN {kind} = 'BOOLEAN' THEN 'a boolean' ELSE 'a number' END"
    )


def _non_finite(x: str) -> str:
    return f"(isnan({x}) OR abs({x}) = double('Infinity'))"


def check_sql(dtype: Atomic, raw: str, parsed: str, options: Coerce = STRICT) -> str | None:
    """SQL that is NULL when ``parsed`` (``from_json``'s value, not NULL) is ``raw`` (the
    VARIANT at the field) as it came, and the reason's detail otherwise; None when the type
    needs no check."""
    name = dtype.name
    kind = f"schema_of_variant({raw})"
    value = shown(raw)
    wrong_kind = _words(not_a(MARK, MARK, dtype), value, _kind(kind))
    if name.startswith("decimal"):
        scale = int(name.rstrip(")").split(",")[1])
        # A numeric string is read as the JSON number it spells, then checked like one.
        number = (
            f"CASE WHEN {kind} = 'STRING' THEN try_parse_json(try_variant_get({raw}, '$', 'string')) ELSE {raw} END"
        )
        number_kind = f"schema_of_variant({number})"
        # parse_json keeps a plain number as an exact DECIMAL (trailing zeros dropped) and one
        # with an exponent as a DOUBLE; either way it must equal what was written.
        inexact = (
            f"(CASE WHEN {number_kind} LIKE 'DECIMAL(%' "
            f"THEN CAST(regexp_extract({number_kind}, ',([0-9]+)', 1) AS INT) > {scale} "
            f"WHEN {number_kind} = 'DOUBLE' THEN CAST({parsed} AS DOUBLE) != try_variant_get({number}, '$', 'double') "
            f"ELSE false END)"
        )
        parts = []
        if not options.from_string:
            parts.append(f"WHEN {kind} = 'STRING' THEN {wrong_kind}")
        if options.round is None:
            places = _words(too_many_places(MARK, scale), value)
            parts.append(f"WHEN {inexact} THEN {places}")
        return f"CASE {' '.join(parts)} END" if parts else None
    if name in ("float", "double"):
        sent = f"try_variant_get({raw}, '$', 'double')"
        # A finite number too large for a FLOAT is written as Infinity: refused even when
        # non-finite values are allowed, since it was not sent as one.
        beyond, infinite = _words(out_of_range(MARK, dtype), value), _words(not_finite(MARK), value)
        overflow = f"WHEN {_non_finite(parsed)} AND {kind} != 'STRING' AND NOT {_non_finite(sent)} THEN {beyond}"
        if options.allow_non_finite:
            return f"CASE {overflow} END"
        return f"CASE {overflow} WHEN {_non_finite(parsed)} THEN {infinite} END"
    if name == "string":
        return None if options.json_text else f"CASE WHEN {kind} != 'STRING' THEN {wrong_kind} END"
    if name in ("timestamp", "timestamp_ntz", "date"):
        pattern = ISO_DATE if name == "date" else ISO_DATE_TIME
        text = f"try_variant_get({raw}, '$', 'string')"
        shape = _words(not_iso(MARK, name == "date"), value)
        return f"CASE WHEN {kind} != 'STRING' THEN {wrong_kind} WHEN NOT {text} RLIKE {lit(pattern)} THEN {shape} END"
    return None


def checks(schema: Struct, event_field: str, coerce: Mapping[str, Coerce]) -> list[tuple[str, str]]:
    """(dotted path, SQL) of the check of each field that needs one, over the columns
    ``__data`` and ``__variant``: NULL when the field is absent, NULL or kept as it came."""
    out = []
    for dotted, parsed, dtype, _required, _parent in nodes(schema):
        if not isinstance(dtype, Atomic):
            continue
        jp = json_path(dotted)
        # The event time is read by its format, unless its type makes from_json read it.
        if jp is None or (dotted == event_field and dtype.name not in ("timestamp", "timestamp_ntz", "date")):
            continue
        raw = f"try_variant_get({VARIANT}, {lit(jp)}, 'variant')"
        sql = check_sql(dtype, raw, parsed, coerce.get(dotted, STRICT))
        if sql is not None:
            out.append((dotted, f"CASE WHEN {parsed} IS NOT NULL THEN {sql} END"))
    return out


def items_sql(found: list[tuple[str, str]]) -> str:
    """The checks' failures as reason items, ``amount (2000.004 has ...)``, joined; '' when none."""
    if not found:
        return "''"
    # concat is NULL when a check is, and concat_ws skips NULLs.
    items = [_words(item(dotted, MARK), sql) for dotted, sql in found]
    return f"concat_ws(', ', {', '.join(items)})"
