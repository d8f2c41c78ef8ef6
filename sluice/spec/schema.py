"""Event schemas as data: Spark's StructType JSON or a DDL string, read without Spark.

A schema file lives in ``schemas/<name>/v<N>.json`` (or ``.ddl``). Reading it here, in
pure Python, lets a spec be checked (fields exist, names flatten without collisions)
before any JVM starts; the Spark side receives the same schema as StructType JSON
(:meth:`Struct.to_spark_json`).

A field that is ``"nullable": false`` (or ``NOT NULL`` in DDL) is *required*: a record
without it goes to quarantine. Field metadata under ``sluice.*`` keys holds hints for the
synthetic event generator and is stripped before the schema reaches Spark.

Example::

    schema = load_schema("schemas/device_signal/v1.json")
    schema.field("device").type          # Struct(...)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.spec import files


class SchemaError(ValueError):
    """A schema file that cannot be read as a Spark schema."""


# Spark's JSON type names and the SQL names people write in DDL and read in messages.
_SQL_NAMES = {
    "long": "bigint",
    "integer": "int",
    "short": "smallint",
    "byte": "tinyint",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "null": "void",
    "variant": "variant",
}
_DDL_TO_JSON = {sql: js for js, sql in _SQL_NAMES.items()} | {
    "long": "long",
    "integer": "integer",
    "short": "short",
    "byte": "byte",
    "real": "float",
    "varchar": "string",
    "char": "string",
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
NUMERIC = frozenset({"long", "integer", "short", "byte", "float", "double"})


@dataclass(frozen=True)
class Atomic:
    """A leaf type by its Spark JSON name: ``long``, ``string``, ``decimal(10,2)``..."""

    name: str

    def sql(self) -> str:
        return _SQL_NAMES.get(self.name, self.name)

    def to_json(self) -> Any:
        return self.name

    @property
    def numeric(self) -> bool:
        return self.name in NUMERIC or self.name.startswith("decimal")


@dataclass(frozen=True)
class Array:
    element: DataType
    contains_null: bool = True

    def sql(self) -> str:
        return f"array<{self.element.sql()}>"

    def to_json(self) -> Any:
        return {"type": "array", "elementType": self.element.to_json(), "containsNull": self.contains_null}


@dataclass(frozen=True)
class Map:
    key: DataType
    value: DataType
    value_contains_null: bool = True

    def sql(self) -> str:
        return f"map<{self.key.sql()},{self.value.sql()}>"

    def to_json(self) -> Any:
        return {
            "type": "map",
            "keyType": self.key.to_json(),
            "valueType": self.value.to_json(),
            "valueContainsNull": self.value_contains_null,
        }


@dataclass(frozen=True)
class Field:
    name: str
    type: DataType
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def required(self) -> bool:
        return not self.nullable

    def to_json(self) -> dict[str, Any]:
        spark_meta = {k: v for k, v in self.metadata.items() if not k.startswith("sluice.")}
        return {
            "name": self.name,
            "type": self.type.to_json(),
            "nullable": self.nullable,
            "metadata": spark_meta,
        }


@dataclass(frozen=True)
class Struct:
    fields: tuple[Field, ...]

    def sql(self) -> str:
        return "struct<" + ",".join(f"{f.name}:{f.type.sql()}" for f in self.fields) + ">"

    def to_json(self) -> dict[str, Any]:
        return {"type": "struct", "fields": [f.to_json() for f in self.fields]}

    def to_spark_json(self) -> str:
        """The schema as Spark's ``StructType.fromJson`` reads it (generator hints removed)."""
        return json.dumps(self.to_json())

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def find(self, dotted: str) -> Field | None:
        """The field at a dotted path (``device.location.lat``), looking through structs only."""
        parts = dotted.split(".")
        current = self
        for i, part in enumerate(parts):
            try:
                found = current.field(part)
            except KeyError:
                return None
            if i == len(parts) - 1:
                return found
            if not isinstance(found.type, Struct):
                return None
            current = found.type
        return None


DataType = Atomic | Array | Map | Struct


# --- StructType JSON -------------------------------------------------------------------


def _from_json(node: Any, where: str) -> DataType:
    if isinstance(node, str):
        name = node.lower().strip()
        if name in _SQL_NAMES or _DECIMAL.match(name) or name == "decimal":
            return Atomic("decimal(10,0)" if name == "decimal" else name.replace(" ", ""))
        raise SchemaError(f"{where}: unknown type {node!r}")
    if not isinstance(node, dict) or "type" not in node:
        raise SchemaError(f"{where}: expected a type name or an object with 'type', got {node!r}")
    kind = node["type"]
    if kind == "struct":
        fields = node.get("fields")
        if not isinstance(fields, list):
            raise SchemaError(f"{where}: a struct needs a 'fields' list")
        out = []
        for i, f in enumerate(fields):
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                raise SchemaError(f"{where}.fields[{i}]: a field needs 'name' and 'type'")
            out.append(
                Field(
                    name=f["name"],
                    type=_from_json(f["type"], f"{where}.{f['name']}"),
                    nullable=bool(f.get("nullable", True)),
                    metadata=dict(f.get("metadata") or {}),
                )
            )
        _check_unique(out, where)
        return Struct(tuple(out))
    if kind == "array":
        return Array(_from_json(node.get("elementType"), f"{where}[]"), bool(node.get("containsNull", True)))
    if kind == "map":
        return Map(
            _from_json(node.get("keyType"), f"{where}{{key}}"),
            _from_json(node.get("valueType"), f"{where}{{value}}"),
            bool(node.get("valueContainsNull", True)),
        )
    raise SchemaError(f"{where}: unknown type {kind!r}")


def _check_unique(fields: list[Field], where: str) -> None:
    seen: dict[str, str] = {}
    for f in fields:
        # Spark resolves names case-insensitively by default.
        key = f.name.lower()
        if key in seen:
            raise SchemaError(f"{where}: fields {seen[key]!r} and {f.name!r} differ only in case")
        seen[key] = f.name


# --- DDL -------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class _DDL:
    """A small recursive-descent reader for Spark DDL column lists.

    ``id BIGINT NOT NULL, device STRUCT<id: STRING, tags: ARRAY<STRING>> COMMENT 'x'``
    """

    def __init__(self, text: str, where: str) -> None:
        self.where = where
        self.tokens: list[str] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise SchemaError(f"{where}: cannot read DDL at {text[pos : pos + 20]!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.lower() != expected):
            raise SchemaError(f"{self.where}: expected {expected or 'more'!r} in DDL, got {tok!r}")
        self.i += 1
        return tok

    def name(self) -> str:
        tok = self.take()
        return tok[1:-1].replace("``", "`") if tok.startswith("`") else tok

    def columns(self, closing: str | None) -> Struct:
        fields: list[Field] = []
        while True:
            name = self.name()
            if closing and self.peek() == ":":
                self.take(":")
            dtype = self.type()
            nullable, metadata = True, {}
            while self.peek() and self.peek().lower() in ("not", "comment"):  # type: ignore[union-attr]
                if self.take().lower() == "not":
                    self.take("null")
                    nullable = False
                else:
                    metadata["comment"] = self.take()[1:-1]
            fields.append(Field(name, dtype, nullable, metadata))
            if self.peek() == ",":
                self.take(",")
                continue
            break
        _check_unique(fields, self.where)
        return Struct(tuple(fields))

    def type(self) -> DataType:
        word = self.take().lower()
        if word == "struct":
            self.take("<")
            inner = self.columns(closing=">")
            self.take(">")
            return inner
        if word == "array":
            self.take("<")
            element = self.type()
            self.take(">")
            return Array(element)
        if word == "map":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            return Map(key, value)
        if word in ("decimal", "dec", "numeric"):
            if self.peek() == "(":
                self.take("(")
                p = self.take()
                s = "0"
                if self.peek() == ",":
                    self.take(",")
                    s = self.take()
                self.take(")")
                return Atomic(f"decimal({p},{s})")
            return Atomic("decimal(10,0)")
        if word in ("varchar", "char") and self.peek() == "(":
            self.take("(")
            self.take()
            self.take(")")
        if word not in _DDL_TO_JSON:
            raise SchemaError(f"{self.where}: unknown DDL type {word!r}")
        return Atomic(_DDL_TO_JSON[word])


def parse_ddl(text: str, where: str = "<ddl>") -> Struct:
    reader = _DDL(text, where)
    struct = reader.columns(closing=None)
    if reader.peek() is not None:
        raise SchemaError(f"{where}: unexpected {reader.peek()!r} after the last column")
    return struct


def parse_json_schema(text: str, where: str = "<json>") -> Struct:
    try:
        node = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{where}: not valid JSON ({exc})") from exc
    result = _from_json(node, where)
    if not isinstance(result, Struct):
        raise SchemaError(f"{where}: the top level of a schema must be a struct")
    return result


def load_schema(path: str | Path) -> Struct:
    """Read ``.json`` (Spark StructType JSON) or ``.ddl`` (Spark DDL) into a :class:`Struct`."""
    p = Path(path)
    try:
        text = files.read_text(p, limit=files.MAX_SPEC_BYTES * 10)
    except files.FileProblem as exc:
        raise SchemaError(f"{p}: {exc.where + ': ' if exc.where else ''}{exc}") from None
    if p.suffix == ".ddl":
        return parse_ddl(text, str(p))
    if p.suffix == ".json":
        return parse_json_schema(text, str(p))
    raise SchemaError(f"{p}: a schema file ends in .json (StructType JSON) or .ddl (Spark DDL)")
