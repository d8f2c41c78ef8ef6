"""Why a record is quarantined: the reasons, worded once, and the SQL that finds them.

Every Kafka record either lands in the output table or in the quarantine table with one
of these reasons (first match wins):

==========================  ==========================================================
reason starts with          when
==========================  ==========================================================
``empty record``            the Kafka message has no value (a tombstone)
``not UTF-8``               the value has bytes that are not UTF-8 text
``not JSON``                the value is blank
``malformed JSON``          the value does not parse as JSON
``not a JSON object``       it parses, but to an array, string, number, boolean or null
``type mismatch``           a field's value does not fit the schema's type (the fields
                            are named with the type they should have), or fits only
                            changed: rounded, from a string, not finite, a time without
                            its date (:mod:`sluice.spec.strict`; a spec opts in under
                            ``coerce``)
``not strict JSON``         Spark's lenient reader takes it (single quotes, NaN), but not
                            as a VARIANT (strict JSON, at most 16 MiB), so fields the
                            schema does not declare could not be kept
``missing required field``  a non-nullable field of the schema is absent or null
``missing event time``      the event-time field is absent or null
``bad event time``          the event-time field does not parse in the declared format
``event time out of range`` it parses, but outside ``event_time.accept``
==========================  ==========================================================

``raw_value`` keeps the record's bytes as they came; ``raw_text`` is always valid UTF-8
(each invalid byte of a ``not UTF-8`` record becomes U+FFFD there), so every reader can
open the quarantine table.

The texts come from the functions below, which the synthetic generator also uses to
predict the reason of each bad record it makes, so tests compare reason for reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sluice.spec.columns import CORRUPT, EVENT_TS, JSON, VALUE, VARIANT
from sluice.spec.eventtime import Bounds
from sluice.spec.flatten import PARSED, quote
from sluice.spec.schema import Array, DataType, Map, Struct

EMPTY_VALUE = "empty record: the Kafka message has no value"
NOT_UTF8 = "not UTF-8: the value has bytes that are not UTF-8 text (raw_value keeps them)"
BLANK = "not JSON: the value is blank"
MALFORMED = "malformed JSON"
UNFIT = "type mismatch: a value does not fit the schema"
UNCHECKABLE = (
    "not strict JSON: it cannot be read as a VARIANT (strict JSON, at most 16 MiB; single quotes, NaN "
    "and Infinity are not), so fields the schema does not declare could not be kept in _rescued"
)


def not_object(kind: str) -> str:
    return f"not a JSON object: found {kind}"


def mismatch_item(path: str, sql_type: str) -> str:
    return f"{path} (expected {sql_type})"


def type_mismatch(items: list[str]) -> str:
    return "type mismatch: " + ", ".join(items)


def missing_required(paths: list[str]) -> str:
    return "missing required field: " + ", ".join(paths)


def missing_event_time(field: str) -> str:
    return f"missing event time: {field}"


def bad_event_time(field: str, raw: str, fmt: str) -> str:
    return f"bad event time: {field}={raw} is not {fmt}"


def out_of_range(field: str, raw: str, accepted: str) -> str:
    return f"event time out of range: {field}={raw} (accepted {accepted})"


# --- SQL -------------------------------------------------------------------------------


def lit(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_SIMPLE = re.compile(r"^[A-Za-z0-9_]+$")


def json_path(dotted: str) -> str | None:
    """The ``get_json_object`` path of a dotted field path (None if it cannot be written)."""
    parts = []
    for part in dotted.split("."):
        if _SIMPLE.match(part):
            parts.append(f".{part}")
        elif "'" not in part and "]" not in part:
            parts.append(f"['{part}']")
        else:
            return None
    return "$" + "".join(parts)


def parsed_sql(dotted: str) -> str:
    """What ``from_json`` read for the field at ``dotted`` (outside arrays)."""
    return f"{PARSED}." + ".".join(quote(p) for p in dotted.split("."))


def nodes(struct: Struct, path: str = "", expr: str = PARSED) -> list[tuple[str, str, DataType, bool, str]]:
    """(dotted path, expr, type, required, parent expr) for every field outside arrays."""
    out = []
    for f in struct.fields:
        dotted = f"{path}.{f.name}" if path else f.name
        child = f"{expr}.{quote(f.name)}"
        out.append((dotted, child, f.type, f.required, expr))
        if isinstance(f.type, Struct):
            out.extend(nodes(f.type, dotted, child))
    return out


def raw_text_sql() -> str:
    """The record's value as text that is always valid UTF-8 (``raw_value`` keeps the bytes)."""
    return f"make_valid_utf8(CAST({VALUE} AS STRING))"


def _ddl(t: DataType, rescue: set[str], path: str = "") -> str:
    """``t`` as a DDL type with every field of ``rescue`` read as STRING (which takes any
    JSON value), and names quoted."""
    if isinstance(t, Struct):
        fields = []
        for f in t.fields:
            p = f"{path}.{f.name}" if path else f.name
            inner = "string" if p in rescue else _ddl(f.type, rescue, p)
            fields.append(f"{quote(f.name)}: {inner}")
        return f"struct<{', '.join(fields)}>"
    if isinstance(t, Array):
        return f"array<{_ddl(t.element, rescue, path + '[]')}>"
    if isinstance(t, Map):
        return f"map<{_ddl(t.key, rescue)}, {_ddl(t.value, rescue, path + '{}')}>"
    return t.sql()


def fits_but_for_sql(schema: Struct, rescue: list[str], json: str, corrupt: str) -> str:
    """True when the record fits the schema except in the fields of ``rescue``: it is read
    again with those fields as strings, and nothing else must fail (a value that does not
    fit inside an array element, say, leaves only a NULL there)."""
    relaxed = _ddl(schema, set(rescue))[:-1] + f", {quote(corrupt)}: string>"
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {lit(corrupt)})"
    return f"(from_json({json}, {lit(relaxed)}, {options}).{quote(corrupt)} IS NULL)"


def reason_sql(
    schema: Struct,
    event_field: str,
    event_format: str,
    accepted: Bounds,
    rescue: Sequence[str] = (),
    inexact: str = "''",
) -> str:
    """A Spark SQL expression that is NULL for a good record and the reason otherwise.

    It reads the columns ``__value`` (Kafka value), ``__json`` (value as string),
    ``__data`` (``from_json`` with a ``__corrupt`` column), ``__variant`` (the value as a
    VARIANT, NULL when it is not JSON) and ``__event_ts``. A type mismatch in a field of
    ``rescue`` is not a reason: its value is kept in ``_rescued`` (:mod:`sluice.spec.rescue`).
    ``inexact`` lists the values ``from_json`` took but changed (:func:`sluice.spec.strict.items_sql`).
    """
    variant = VARIANT
    kind = f"schema_of_variant({variant})"
    found = (
        f"CASE WHEN {kind} LIKE 'ARRAY%' THEN 'array' WHEN {kind} = 'STRING' THEN 'string' "
        f"WHEN {kind} = 'VOID' THEN 'null' WHEN {kind} = 'BOOLEAN' THEN 'boolean' ELSE 'number' END"
    )
    fields = nodes(schema)

    mismatches = []
    for dotted, expr, dtype, _req, _parent in fields:
        jp = json_path(dotted)
        if jp is None or dotted in rescue:
            continue
        item = lit(mismatch_item(dotted, "struct" if isinstance(dtype, Struct) else dtype.sql()))
        mismatches.append(
            f"CASE WHEN {expr} IS NULL AND get_json_object({JSON}, {lit(jp)}) IS NOT NULL THEN {item} END"
        )
    mismatch_list = f"concat_ws(', ', {', '.join(mismatches)})" if mismatches else "''"
    # Only rescued fields did not fit: the record goes on to the other checks.
    only_rescued = (
        f"({kind} LIKE 'OBJECT%' AND {fits_but_for_sql(schema, list(rescue), JSON, CORRUPT)})" if rescue else "false"
    )

    missing = []
    for dotted, expr, _dtype, required, parent in fields:
        if required:
            guard = "" if parent == PARSED else f" AND {parent} IS NOT NULL"
            missing.append(f"CASE WHEN {expr} IS NULL{guard} THEN {lit(dotted)} END")
    missing_list = f"concat_ws(', ', {', '.join(missing)})" if missing else "''"

    return f"""CASE
  WHEN {VALUE} IS NULL THEN {lit(EMPTY_VALUE)}
  WHEN NOT is_valid_utf8({JSON}) THEN {lit(NOT_UTF8)}
  WHEN {PARSED} IS NULL THEN {lit(BLANK)}
  WHEN {PARSED}.{CORRUPT} IS NOT NULL AND NOT coalesce({only_rescued}, false) THEN CASE
    WHEN {variant} IS NULL THEN {lit(MALFORMED)}
    WHEN {kind} NOT LIKE 'OBJECT%' THEN concat({lit(not_object(""))}, {found})
    WHEN {mismatch_list} != '' THEN concat({lit(type_mismatch([]))}, {mismatch_list})
    ELSE {lit(UNFIT)} END
  WHEN {inexact} != '' THEN concat({lit(type_mismatch([]))}, {inexact})
  WHEN {VARIANT} IS NULL THEN {lit(UNCHECKABLE)}
  WHEN {missing_list} != '' THEN concat({lit(missing_required([]))}, {missing_list})
  {_event_time_whens(event_field, event_format, accepted)}
END"""


def event_time_reason_sql(event_field: str, event_format: str, accepted: Bounds) -> str:
    """The reason of a record read exactly (jobs.stream.one_pass): only its event time can be wrong.
    The same conditions as the end of :func:`reason_sql`, over ``__data`` and ``__event_ts``."""
    return f"CASE {_event_time_whens(event_field, event_format, accepted)} END"


def _event_time_whens(event_field: str, event_format: str, accepted: Bounds) -> str:
    event_expr = parsed_sql(event_field)
    event_jp = json_path(event_field) or "$"
    raw_event = f"coalesce(get_json_object({JSON}, {lit(event_jp)}), '?')"
    prefix_bad, suffix_bad = bad_event_time(event_field, "\x00", event_format).split("\x00")
    prefix_range, suffix_range = out_of_range(event_field, "\x00", accepted.describe()).split("\x00")
    return f"""WHEN {EVENT_TS} IS NULL AND {event_expr} IS NULL THEN {lit(missing_event_time(event_field))}
  WHEN {EVENT_TS} IS NULL THEN concat({lit(prefix_bad)}, {raw_event}, {lit(suffix_bad)})
  WHEN {accepted.outside_sql(EVENT_TS)} THEN concat({lit(prefix_range)}, {raw_event}, {lit(suffix_range)})"""
