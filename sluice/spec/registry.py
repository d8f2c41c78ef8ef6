"""Schemas from a schema registry, as the spec sees them: the subject, its conversion, and the
cache it is read from. Nothing here opens a connection.

A spec may name a registry subject instead of a file::

    schema: {registry: http://registry:8081, subject: orders-value, version: latest}

The loader reads the subject's Spark schema from
``$SLUICE_HOME/schema_cache/<registry>/<subject>/v<N>.json`` (``<registry>``: a hash of its
URL) through :func:`cached_file`, unless its caller hands it another source: the commands,
the job and Airflow's tasks pass :func:`sluice.registry.schema_file`, which asks the
registry and fills the cache; the DAG files pass :func:`sluice.registry.first_time`, which
asks only for a subject this host has never fetched. The subject's JSON Schema is converted
to a Spark schema by :func:`to_struct`:

Conversion (JSON Schema draft 7 and 2020-12, the parts that describe data):

==================================  ======================================================
JSON Schema                         Spark
==================================  ======================================================
``object`` with ``properties``      struct; a name in ``required`` is NOT NULL
``object``, ``additionalProperties``  map<string, T> (T from its schema; string if none)
``array`` with ``items``            array<T>
``string`` (any ``format``)         string
``integer`` / ``number``            bigint / double
``boolean``                         boolean
``["T", "null"]``, ``anyOf`` a      T (nullable)
type and ``null``
``$ref`` to ``#/$defs/..`` or       the definition (a recursive one is refused)
``#/definitions/..``
anything else (unions of types)     string: the value's JSON text, nothing is dropped
==================================  ======================================================

``description`` becomes the field's comment (and the table column's).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field as PydanticField
from pydantic import field_validator

from sluice import config
from sluice.spec.model import StrictModel
from sluice.spec.schema import Array, Atomic, DataType, Field, Map, SchemaError, Struct


class RegistrySchema(StrictModel):
    """``schema: {registry: <url>, subject: ..., version: latest|N}``."""

    registry: str = PydanticField(pattern=r"^https?://\S+$")
    """The schema registry's URL."""
    subject: str = PydanticField(min_length=1, pattern=r"^[^/\\]+$")
    """The subject whose JSON Schema is the events' schema."""
    version: Literal["latest"] | int = "latest"
    """``latest`` (asked again at most once a minute) or a pinned version number."""

    @field_validator("subject")
    @classmethod
    def _not_a_folder(cls, subject: str) -> str:
        if subject in (".", ".."):
            raise ValueError(f"{subject!r} is not a subject name")
        return subject


class RegistryError(SchemaError):
    """The subject cannot be read: not in the registry, not JSON Schema, or not convertible."""


# --- JSON Schema -> Spark ---------------------------------------------------------------------

_ATOMIC = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}


def to_struct(document: dict[str, Any], where: str) -> Struct:
    """The Spark schema of a JSON Schema whose top level is an object with properties."""
    converted = _convert(document, document, where, ())
    if not isinstance(converted[0], Struct):
        raise RegistryError(f"{where}: the top level must be an object with properties")
    return converted[0]


def _resolve(
    node: dict[str, Any], root: dict[str, Any], where: str, seen: tuple[str, ...]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    ref = node.get("$ref")
    if ref is None:
        return node, seen
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise RegistryError(f"{where}: only local references (#/$defs/...) are supported, not {ref!r}")
    if ref in seen:
        raise RegistryError(f"{where}: {ref} refers to itself; a Spark schema cannot be recursive")
    target: Any = root
    for part in ref[2:].split("/") if ref != "#" else []:
        if not isinstance(target, dict) or part not in target:
            raise RegistryError(f"{where}: {ref} does not exist")
        target = target[part]
    return _resolve(target, root, where, (*seen, ref))


def _convert(node: Any, root: dict[str, Any], where: str, seen: tuple[str, ...]) -> tuple[DataType, bool]:
    """(type, may be null) of one JSON Schema node."""
    if not isinstance(node, dict):
        return Atomic("string"), True  # `true` / `{}`: anything
    node, seen = _resolve(node, root, where, seen)
    kinds = node.get("type")
    options = node.get("anyOf") or node.get("oneOf")
    if kinds is None and isinstance(options, list):
        concrete = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(concrete) == 1:
            inner, _ = _convert(concrete[0], root, where, seen)
            return inner, True
        return Atomic("string"), True
    if kinds is None and "properties" in node:
        kinds = "object"
    if kinds is None and "enum" in node:
        kinds = "string" if all(isinstance(v, str) for v in node["enum"]) else None
    if isinstance(kinds, list):
        nullable = "null" in kinds
        concrete = [k for k in kinds if k != "null"]
        if len(concrete) != 1:
            return Atomic("string"), True
        kind = concrete[0]
    else:
        nullable, kind = False, kinds
    if kind in _ATOMIC:
        return Atomic(_ATOMIC[kind]), nullable
    if kind == "array":
        element, _ = _convert(node.get("items", {}), root, f"{where}[]", seen)
        return Array(element), nullable
    if kind == "object":
        properties = node.get("properties")
        if not properties:
            extra = node.get("additionalProperties")
            value, _ = _convert(extra if isinstance(extra, dict) else {}, root, f"{where}{{}}", seen)
            return Map(Atomic("string"), value), nullable
        required = set(node.get("required") or [])
        fields = []
        for name, sub in properties.items():
            dtype, may_be_null = _convert(sub, root, f"{where}.{name}", seen)
            meta = {"comment": sub["description"]} if isinstance(sub, dict) and sub.get("description") else {}
            fields.append(Field(name, dtype, nullable=name not in required or may_be_null, metadata=meta))
        return Struct(tuple(fields)), nullable
    return Atomic("string"), True


# --- the cache ---------------------------------------------------------------------------------


def cache_dir(ref: RegistrySchema) -> Path:
    """One folder per registry and subject: two registries may both have ``orders-value``."""
    registry = hashlib.sha256(ref.registry.rstrip("/").encode()).hexdigest()[:12]
    return config.sluice_home() / "schema_cache" / registry / ref.subject


def newest_cached(ref: RegistrySchema) -> Path | None:
    """The file of the highest version of the subject in this host's cache, if any."""
    folder = cache_dir(ref)
    if not folder.is_dir():
        return None
    versions = sorted(int(f.stem[1:]) for f in folder.glob("v*.json") if f.stem[1:].isdigit())
    return folder / f"v{versions[-1]}.json" if versions else None


def cached_file(ref: RegistrySchema) -> Path:
    """The subject's version from this host's cache, without asking the registry: a pinned
    version's file, or for ``latest`` the one last fetched as latest (else the newest)."""
    folder = cache_dir(ref)
    if ref.version != "latest":
        found: Path | None = folder / f"v{ref.version}.json"
    else:
        pointer = folder / "latest"
        found = folder / f"v{pointer.read_text(encoding='utf-8').strip()}.json" if pointer.is_file() else None
        if found is None or not found.is_file():
            found = newest_cached(ref)
    if found is None or not found.is_file():
        raise RegistryError(
            f"{ref.subject} version {ref.version} of schema registry {ref.registry} has not been fetched on this "
            "host; `sluice check` fetches it"
        )
    return found
