"""Schemas from a schema registry: JSON Schema subjects, converted once and cached.

A spec may name a registry subject instead of a file::

    schema: {registry: http://registry:8081, subject: orders-value, version: latest}

The subject's JSON Schema is fetched with confluent-kafka's ``SchemaRegistryClient``,
converted to a Spark schema (:func:`to_struct`) and written to
``$SLUICE_HOME/schema_cache/<registry>/<subject>/v<N>.json`` (``<registry>``: a hash of its URL), so every reader of the spec (the job,
``sluice check``, Airflow's DAG files) works from that file. A pinned version is read from
the cache without asking the registry again. ``latest`` asks the registry at most once per
:data:`LATEST_TTL` seconds; when the registry cannot be reached, the newest cached version
is used, with a warning, so an outage neither stops a running stream nor a restart.

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
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field as PydanticField
from pydantic import field_validator

from sluice import config
from sluice.spec.model import StrictModel
from sluice.spec.schema import Array, Atomic, DataType, Field, Map, SchemaError, Struct, load_schema

log = logging.getLogger("sluice.registry")

#: How long a fetched ``latest`` is trusted before the registry is asked again (seconds).
LATEST_TTL = float(os.environ.get("SLUICE_REGISTRY_TTL", "60"))
#: How long one registry request may take before the cache is used instead (seconds).
TIMEOUT = 5


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


# --- fetching and the cache -------------------------------------------------------------------


def cache_dir(ref: RegistrySchema) -> Path:
    """One folder per registry and subject: two registries may both have ``orders-value``."""
    registry = hashlib.sha256(ref.registry.rstrip("/").encode()).hexdigest()[:12]
    return config.sluice_home() / "schema_cache" / registry / ref.subject


def _write(target: Path, text: str) -> None:
    """Write whole or not at all: the scheduler and a task may fetch the same version at once."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, target)


def _cached_versions(ref: RegistrySchema) -> list[int]:
    folder = cache_dir(ref)
    if not folder.is_dir():
        return []
    return sorted(int(f.stem[1:]) for f in folder.glob("v*.json") if f.stem[1:].isdigit())


def _fetch(ref: RegistrySchema) -> Path:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient({"url": ref.registry, "timeout": TIMEOUT, "max.retries": 1})
    try:
        registered = client.get_version(ref.subject, ref.version)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:  # the registry answered: no such subject or version
            raise RegistryError(f"{ref.registry}: {ref.subject} version {ref.version}: {exc.error_message}") from None
        raise
    schema = registered.schema
    where = f"{ref.registry} subject {ref.subject} version {registered.version}"
    if schema is None or (schema.schema_type or "AVRO") != "JSON":
        kind = schema.schema_type if schema is not None else "none"
        raise RegistryError(f"{where}: a {kind or 'AVRO'} schema; Sluice reads JSON Schema subjects")
    try:
        document = json.loads(schema.schema_str or "")
    except json.JSONDecodeError as exc:
        raise RegistryError(f"{where}: not valid JSON ({exc})") from None
    struct = to_struct(document, where)
    folder = cache_dir(ref)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"v{registered.version}.json"
    _write(target, json.dumps(struct.to_json(), indent=1))
    if ref.version == "latest":
        _write(folder / "latest", str(registered.version))
    return target


def schema_file(ref: RegistrySchema) -> Path:
    """The cached Spark schema file of the subject's version (fetched if needed, see the module)."""
    folder = cache_dir(ref)
    if ref.version != "latest":
        pinned = folder / f"v{ref.version}.json"
        return pinned if pinned.is_file() else _fetch_or_explain(ref, None)
    pointer = folder / "latest"
    if pointer.is_file() and time.time() - pointer.stat().st_mtime < LATEST_TTL:
        fresh = folder / f"v{pointer.read_text(encoding='utf-8').strip()}.json"
        if fresh.is_file():
            return fresh
    cached = _cached_versions(ref)
    return _fetch_or_explain(ref, folder / f"v{cached[-1]}.json" if cached else None)


def _fetch_or_explain(ref: RegistrySchema, fallback: Path | None) -> Path:
    """Fetch; when the registry does not answer, the fallback (with a warning) or a RegistryError."""
    try:
        return _fetch(ref)
    except RegistryError:
        raise
    except Exception as exc:  # the registry is down or slow: any transport or HTTP error
        if fallback is None:
            raise RegistryError(
                f"schema registry {ref.registry} did not answer for {ref.subject} version {ref.version} ({exc}), "
                "and it is not cached"
            ) from None
        log.warning(
            "schema registry %s did not answer for %s (%s); using cached %s",
            ref.registry,
            ref.subject,
            exc,
            fallback.stem,
        )
        return fallback


def load(ref: RegistrySchema) -> tuple[Path, Struct]:
    path = schema_file(ref)
    return path, load_schema(path)
