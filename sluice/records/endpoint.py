"""The SQL endpoint's report of itself (the run-state store's ``endpoint`` record),
written by ``jobs/sql_endpoint.py`` every few seconds and read by ``sluice sql status``, the
Airflow DAG that keeps it up, and ``sluice sql`` to find it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Self

from sluice.records.run import known_fields
from sluice.state import store

#: The run folder's name; it cannot clash with a pipeline's (those start with a letter).
NAME = "_sql_endpoint"


@dataclass
class EndpointStatus:
    state: str  # starting | running | stopped | failed
    pid: int  # the Python driver
    updated_at: float
    host: str
    port: int
    auth: str
    allow_writes: bool
    metastore: str
    tables: list[str] = field(default_factory=list)
    app_id: str | None = None
    ui: str | None = None
    error: str | None = None

    @classmethod
    def read(cls) -> Self | None:
        data = store().get("endpoint", NAME)
        return cls(**known_fields(cls, data)) if data else None

    def save(self) -> None:
        store().put("endpoint", NAME, asdict(self))


def read_requested() -> dict[str, Any] | None:
    """How the endpoint was last asked to be served (host, port, auth, allow_writes): what a
    scheduled supervision starts it with again, on whichever host it runs."""
    return store().get("requested", NAME)


def save_requested(settings: dict[str, Any]) -> None:
    store().put("requested", NAME, settings)
