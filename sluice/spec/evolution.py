"""Which schema changes a running pipeline can take, and which it cannot.

One set of rules, used by ``sluice schema diff`` and ``check-compat``, by ``sluice check``
when a spec points at a new schema version, and by the job before it writes to a table:

=========================================  ============  ==================================
change                                     compatible    why
=========================================  ============  ==================================
a nullable field added                     yes           old rows read NULL; the table
                                                         gains the column
a type widened (int -> bigint,             yes           every old value fits the new type
float -> double, decimal(p,s) ->                         (but a table that exists cannot
decimal(p+k, s+j) with k >= j, date ->                   take it yet: see
timestamp_ntz)                                           compatibility.WIDENING_REFUSED)
a required field made nullable             yes           nothing that was valid stops being
a field removed                            no            the table keeps the column, and
                                                         records that still carry the field
                                                         would lose it
a type narrowed or changed                 no            old values may not fit; the table
                                                         cannot hold both
a field made required, or added required   no            records without it would now go to
                                                         quarantine
=========================================  ============  ==================================

The widenings are the ones Delta 4 applies by itself during schema evolution (with its
typeWidening table feature); widening an integer to a decimal or a double needs a manual
``ALTER TABLE`` there, so it is refused here. Names are compared exactly, as Spark's JSON reader does: a field whose name changes
case is one removed and one added.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.spec.schema import Array, Atomic, DataType, Map, SchemaError, Struct, parse_ddl

_WIDER = {
    "byte": {"short", "integer", "long"},
    "short": {"integer", "long"},
    "integer": {"long"},
    "float": {"double"},
    "date": {"timestamp_ntz"},
}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")

ADDED = "adding a nullable field is compatible"
ADDED_REQUIRED = "adding a required field is not compatible: records without it would be quarantined"
REMOVED = (
    "removing a field is not compatible: the table keeps the column, and records that still carry it would lose it"
)
WIDENED = "widening a type is compatible"
CHANGED = "narrowing or changing a type is not compatible: values already written may not fit the new type"
REQUIRED = "making a field required is not compatible: records without it would be quarantined"
RELAXED = "making a required field nullable is compatible"


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # added, removed, widened, changed, required, relaxed
    old: str | None
    new: str | None
    compatible: bool
    rule: str

    @property
    def what(self) -> str:
        return {
            "added": f"added ({self.new})",
            "removed": f"removed (was {self.old})",
            "widened": f"{self.old} -> {self.new}",
            "changed": f"{self.old} -> {self.new}",
            "required": "nullable -> required",
            "relaxed": "required -> nullable",
        }[self.kind]

    def describe(self) -> str:
        return f"{self.path}: {self.what}: {self.rule}"


def widens(old: str, new: str) -> bool:
    """Is the Spark JSON type name ``new`` a widening of ``old`` that Delta applies by itself?"""
    if new in _WIDER.get(old, set()):
        return True
    a, b = _DECIMAL.match(old), _DECIMAL.match(new)
    if a and b:
        (p1, s1), (p2, s2) = (int(a[1]), int(a[2])), (int(b[1]), int(b[2]))
        return p2 - p1 >= s2 - s1 >= 0 and (p1, s1) != (p2, s2)
    return False


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def compare(old: DataType, new: DataType, path: str = "") -> list[Change]:
    """Every change from ``old`` to ``new``, nested fields by their dotted paths
    (``payload.commits[].sha``; a map's values are ``tags{}``)."""
    if isinstance(old, Struct) and isinstance(new, Struct):
        out: list[Change] = []
        before = {f.name: f for f in old.fields}
        for f in new.fields:
            p = _join(path, f.name)
            was = before.pop(f.name, None)
            if was is None:
                ok = f.nullable
                out.append(Change(p, "added", None, f.type.sql(), ok, ADDED if ok else ADDED_REQUIRED))
                continue
            if was.nullable and not f.nullable:
                out.append(Change(p, "required", None, None, False, REQUIRED))
            elif not was.nullable and f.nullable:
                out.append(Change(p, "relaxed", None, None, True, RELAXED))
            out += compare(was.type, f.type, p)
        out += [Change(_join(path, f.name), "removed", f.type.sql(), None, False, REMOVED) for f in before.values()]
        return out
    if isinstance(old, Array) and isinstance(new, Array):
        return compare(old.element, new.element, path + "[]")
    if isinstance(old, Map) and isinstance(new, Map):
        return compare(old.key, new.key, path + "{key}") + compare(old.value, new.value, path + "{}")
    if isinstance(old, Atomic) and isinstance(new, Atomic):
        if old.name == new.name:
            return []
        if widens(old.name, new.name):
            return [Change(path, "widened", old.sql(), new.sql(), True, WIDENED)]
    return [Change(path, "changed", old.sql(), new.sql(), False, CHANGED)]


def incompatible(changes: list[Change]) -> list[Change]:
    return [c for c in changes if not c.compatible]


def column_type(sql: str) -> DataType | None:
    """A table column's Spark SQL type read back (None if it cannot be, e.g. odd nested names)."""
    try:
        return parse_ddl(f"c {sql}").fields[0].type
    except SchemaError:
        return None
