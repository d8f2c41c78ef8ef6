"""Where Sluice keeps things, from the environment with local defaults.

``SLUICE_HOME`` holds everything a run creates (broker data, tables, checkpoints, logs,
the resolved jars); it defaults to ``.sluice`` in the current directory so that the
README's commands, run from a clone, keep their state inside it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository (or installed source tree) that holds pipelines/ and schemas/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_KAFKA_PORT = 19092


def sluice_home() -> Path:
    return Path(os.environ.get("SLUICE_HOME") or Path.cwd() / ".sluice").resolve()


def jars_dir(kind: str) -> Path:
    """The jars `make setup` copied from Maven Central: ``kafka`` or ``spark``."""
    base = os.environ.get("SLUICE_JARS")
    return (Path(base) if base else sluice_home() / "jars") / kind


def store() -> str:
    """Where a spec's relative table and checkpoint paths resolve: ``SLUICE_STORE`` (on a
    cluster, a location every host reaches, such as ``s3a://bucket/sluice``), else
    ``SLUICE_HOME``."""
    return (os.environ.get("SLUICE_STORE") or str(sluice_home())).rstrip("/")


def under_store(path: str) -> str:
    """A relative path under :func:`store` (absolute paths and URIs stay as they are)."""
    if "://" in path or path.startswith("/"):
        return path
    root = store()
    return f"{root}/{path}" if "://" in root else str(Path(root) / path)


def events_table() -> str:
    """The event log every stream's listener appends its batches' progress to (Delta)."""
    return os.environ.get("SLUICE_EVENTS_TABLE") or under_store("tables/_sluice_events")


def pipelines_dir() -> Path:
    return Path(os.environ.get("SLUICE_PIPELINES") or PROJECT_ROOT / "pipelines")


def schemas_dir() -> Path:
    return Path(os.environ.get("SLUICE_SCHEMAS") or PROJECT_ROOT / "schemas")


def kafka_port() -> int:
    return int(os.environ.get("SLUICE_KAFKA_PORT") or DEFAULT_KAFKA_PORT)


def bootstrap_servers() -> str:
    """Bootstrap servers of the broker Sluice talks to (the embedded one by default)."""
    return os.environ.get("SLUICE_KAFKA_BOOTSTRAP") or f"127.0.0.1:{kafka_port()}"


def registry_ttl() -> float:
    """How long a fetched ``latest`` registry subject is trusted before asking again (seconds)."""
    return float(os.environ.get("SLUICE_REGISTRY_TTL") or 60)


def interpolation_env() -> dict[str, str]:
    """Variables a spec may use as ``${NAME}`` besides the process environment."""
    return {
        "SLUICE_HOME": str(sluice_home()),
        "SLUICE_STORE": store(),
        "SLUICE_KAFKA_BOOTSTRAP": bootstrap_servers(),
    }
