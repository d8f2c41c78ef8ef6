"""``sluice schema``: compare schema versions, and draft the next one from rescued data.

Schemas are versioned files, ``schemas/<name>/v1.json``, ``v2.json``, ... A schema is named
on the command line by its path or as ``<name>/v<N>`` (``order/v2``).

:func:`suggest` reads the ``_rescued`` column of a pipeline's table (delta-rs or pyarrow,
no Spark), infers each rescued path's type from the values seen, and adds the fields to
the pipeline's current schema as nullable fields: the draft of the next version, which is
compatible by construction. Values rescued because they did not fit a declared field's
type are reported beside it, not added: changing that field's type is a decision, not a
draft.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice import config
from sluice.errors import InvalidInput
from sluice.spec import Pipeline, evolution
from sluice.spec.columns import RESCUED
from sluice.spec.registry import RegistrySchema
from sluice.spec.rescue import normalize
from sluice.spec.schema import Array, Atomic, DataType, Field, Map, SchemaError, Struct, load_schema

_VERSION = re.compile(r"^v(\d+)\.(json|ddl)$")
_STEP = re.compile(r"(`(?:[^`]|``)+`|[^.\[`]+)((?:\[[^\]]*\])*)")


def resolve(ref: str) -> Path:
    """A schema file from a path or ``<name>/v<N>`` under ``schemas/`` (here, or the project's)."""
    p = Path(ref)
    if p.is_file():
        return p
    for root in (Path("schemas"), config.schemas_dir()):
        for candidate in (root / ref, root / f"{ref}.json", root / f"{ref}.ddl"):
            if candidate.is_file():
                return candidate
    raise InvalidInput(f"no schema {ref!r}: give a file, or <name>/v<N> under {config.schemas_dir()}")


def read(ref: str) -> tuple[Path, Struct]:
    path = resolve(ref)
    try:
        return path, load_schema(path)
    except SchemaError as exc:
        raise InvalidInput(str(exc)) from None


def diff(old: str, new: str) -> list[evolution.Change]:
    """Every change from the schema ``old`` to ``new``, each with its rule."""
    return evolution.compare(read(old)[1], read(new)[1])


def next_version(current: Path) -> Path:
    """``.../v2.json`` after ``.../v1.json`` (or ``v1.ddl``); the folder's highest version + 1."""
    numbers = [int(m[1]) for f in current.parent.iterdir() if (m := _VERSION.match(f.name))]
    return current.parent / f"v{max(numbers, default=0) + 1}.json"


# --- inferring types from the rescued values ------------------------------------------------


def infer(value: Any) -> DataType | None:
    """The Spark type of a JSON value (None for null: no evidence)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return Atomic("boolean")
    if isinstance(value, int):
        return Atomic("long")
    if isinstance(value, float):
        return Atomic("double")
    if isinstance(value, str):
        return Atomic("string")
    if isinstance(value, list):
        element: DataType | None = None
        for item in value:
            element = merge(element, infer(item))
        return Array(element or Atomic("string"))
    if isinstance(value, dict):
        return Struct(tuple(Field(k, infer(v) or Atomic("string")) for k, v in value.items()))
    return Atomic("string")


def merge(a: DataType | None, b: DataType | None) -> DataType | None:
    """One type that holds values of both (string when nothing narrower does)."""
    if a is None or b is None or a == b:
        return a or b
    if isinstance(a, Atomic) and isinstance(b, Atomic) and {a.name, b.name} == {"long", "double"}:
        return Atomic("double")
    if isinstance(a, Array) and isinstance(b, Array):
        return Array(merge(a.element, b.element) or Atomic("string"))
    if isinstance(a, Struct) and isinstance(b, Struct):
        fields = {f.name: f.type for f in a.fields}
        for f in b.fields:
            fields[f.name] = merge(fields.get(f.name), f.type) or Atomic("string")
        return Struct(tuple(Field(n, t) for n, t in fields.items()))
    return Atomic("string")


# --- placing rescued paths in the schema ----------------------------------------------------


def steps(path: str) -> list[tuple[str, int]]:
    """``items[0].discount`` -> [("items", 1), ("discount", 0)]: each name (backticks removed)
    with the number of ``[...]`` (array element or map value) steps after it."""
    out, pos = [], 0
    while True:
        m = _STEP.match(path, pos)
        if m is None:
            raise ValueError(path)
        name = m[1][1:-1].replace("``", "`") if m[1].startswith("`") else m[1]
        out.append((name, m[2].count("[")))
        pos = m.end()
        if pos == len(path):
            return out
        if path[pos] != ".":
            raise ValueError(path)
        pos += 1


def _inside(t: DataType, hops: int) -> DataType | None:
    for _ in range(hops):
        if isinstance(t, Array):
            t = t.element
        elif isinstance(t, Map):
            t = t.value
        else:
            return None
    return t


def locate(schema: Struct, path: str) -> tuple[list[tuple[str, int]], str] | None:
    """Where a rescued path goes: the steps to its parent struct and the new field's name;
    None when the schema declares it already (a rescued type mismatch) or it cannot be placed."""
    try:
        parts = steps(path)
    except ValueError:
        return None
    node: DataType = schema
    for name, hops in parts[:-1]:
        if not isinstance(node, Struct):
            return None
        found = next((f for f in node.fields if f.name == name), None)
        inner = _inside(found.type, hops) if found else None
        if inner is None:
            return None
        node = inner
    name, hops = parts[-1]
    if not isinstance(node, Struct) or hops or any(f.name == name for f in node.fields):
        return None
    return parts[:-1], name


def _with_field(t: DataType, parent: list[tuple[str, int]], new: Field) -> DataType:
    if not parent:
        assert isinstance(t, Struct)
        return Struct((*t.fields, new))
    (name, hops), rest = parent[0], parent[1:]
    assert isinstance(t, Struct)

    def down(inner: DataType, hops: int) -> DataType:
        if hops == 0:
            return _with_field(inner, rest, new)
        if isinstance(inner, Array):
            return Array(down(inner.element, hops - 1), inner.contains_null)
        assert isinstance(inner, Map)
        return Map(inner.key, down(inner.value, hops - 1), inner.value_contains_null)

    return Struct(
        tuple(Field(f.name, down(f.type, hops), f.nullable, f.metadata) if f.name == name else f for f in t.fields)
    )


@dataclass
class Suggestion:
    pipeline: str
    current: Path
    target: Path
    schema: Struct
    changes: list[evolution.Change]
    records: int  # rows with rescued data that were read
    #: Declared fields whose values were rescued because they did not fit: path -> types seen.
    mismatched: dict[str, list[str]] = field(default_factory=dict)
    #: Paths that could not be placed in the schema (and how often they were seen).
    unplaced: dict[str, int] = field(default_factory=dict)

    def render(self) -> str:
        return json.dumps(self.schema.to_json(), indent=1) + "\n"


def draft(
    current: Struct, rescued: Iterable[dict[str, Any]]
) -> tuple[Struct, int, dict[str, list[str]], dict[str, int]]:
    """The schema with every placeable rescued path added (types merged over all values)."""
    types: dict[tuple[tuple[tuple[str, int], ...], str], DataType | None] = {}
    order: list[tuple[tuple[tuple[str, int], ...], str]] = []
    mismatched: dict[str, set[str]] = {}
    unplaced: Counter[str] = Counter()
    records = 0
    for row in rescued:
        records += 1
        for path, value in row.items():
            where = locate(current, path)
            if where is None:
                declared = current.find(path)
                if declared is not None:
                    seen = infer(value)
                    mismatched.setdefault(path, set()).add(seen.sql() if seen else "null")
                else:
                    unplaced[normalize(path)] += 1
                continue
            key = (tuple(where[0]), where[1])
            if key not in types:
                order.append(key)
            types[key] = merge(types.get(key), infer(value))
    schema: DataType = current
    for key in order:
        schema = _with_field(schema, list(key[0]), Field(key[1], types[key] or Atomic("string")))
    assert isinstance(schema, Struct)
    return schema, records, {p: sorted(t) for p, t in mismatched.items()}, dict(unplaced)


def rescued_rows(pipeline: Pipeline) -> Iterator[dict[str, Any]]:
    """The ``_rescued`` objects of a table (delta-rs or pyarrow; local or S3), without Spark."""
    from sluice import storage
    from sluice.records.tables import table_files

    path = pipeline.sink_path
    if not storage.reachable(path):
        raise InvalidInput(f"{pipeline.name}: Sluice cannot read the table {path} without Spark")
    for text in table_files(pipeline.spec.sink.format).values(path, RESCUED):
        yield json.loads(text)


def suggest(pipeline: Pipeline) -> Suggestion:
    """Draft the next schema version from what the pipeline's table rescued."""
    if pipeline.upstream is not None or pipeline.table_format is None:
        raise InvalidInput(f"{pipeline.name} parses no Kafka records into a table: nothing is rescued there")
    schema, records, mismatched, unplaced = draft(pipeline.schema, rescued_rows(pipeline))
    target = next_version(pipeline.schema_file)
    if isinstance(pipeline.spec.schema_path, RegistrySchema):
        # The cache is the registry's copy: the draft goes to the project, to be registered.
        target = config.schemas_dir() / pipeline.spec.schema_path.subject / target.name
    return Suggestion(
        pipeline.name,
        pipeline.schema_file,
        target,
        schema,
        evolution.compare(pipeline.schema, schema),
        records,
        mismatched,
        unplaced,
    )
