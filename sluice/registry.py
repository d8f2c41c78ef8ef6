"""The schema registry adapter: asks the registry for a spec's subject and keeps it in the cache.

The spec package reads subjects from the cache only (:func:`sluice.spec.registry.cached_file`);
the callers that may reach the network hand the loader one of these instead:

- :func:`schema_file` — the commands, the job and Airflow's tasks. A pinned version is read
  from the cache without asking the registry again; ``latest`` asks at most once per
  ``SLUICE_REGISTRY_TTL`` seconds (60). When the registry cannot be reached, the newest cached
  version is used, with a warning, so an outage neither stops a running stream nor a restart.
- :func:`first_time` — the DAG files: a subject this host has fetched is read from its cache,
  so parsing the DAG folder never waits on the registry; only one never fetched is asked for.

The subject's JSON Schema is fetched with confluent-kafka's ``SchemaRegistryClient``,
converted (:func:`sluice.spec.registry.to_struct`) and written to the cache, one file per version.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

from sluice import config
from sluice.spec.registry import RegistryError, RegistrySchema, cache_dir, cached_file, newest_cached, to_struct

log = logging.getLogger("sluice.registry")

#: How long one registry request may take before the cache is used instead (seconds).
TIMEOUT = 5


def schema_file(ref: RegistrySchema) -> Path:
    """The cached Spark schema file of the subject's version, fetched when the cache is not
    enough (see the module)."""
    folder = cache_dir(ref)
    if ref.version != "latest":
        pinned = folder / f"v{ref.version}.json"
        return pinned if pinned.is_file() else _fetch_or_explain(ref, None)
    pointer = folder / "latest"
    if pointer.is_file() and time.time() - pointer.stat().st_mtime < config.registry_ttl():
        fresh = folder / f"v{pointer.read_text(encoding='utf-8').strip()}.json"
        if fresh.is_file():
            return fresh
    return _fetch_or_explain(ref, newest_cached(ref))


def first_time(ref: RegistrySchema) -> Path:
    """The cached file when this host has one, however old; else fetched (see the module)."""
    try:
        return cached_file(ref)
    except RegistryError:
        return _fetch_or_explain(ref, None)


def _write(target: Path, text: str) -> None:
    """Write whole or not at all: the scheduler and a task may fetch the same version at once."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, target)


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
