"""The SQL endpoint's report of itself (``$SLUICE_HOME/run/_sql_endpoint/endpoint.json``),
written by ``jobs/sql_endpoint.py`` every few seconds and read by ``sluice sql status``, the
Airflow DAG that keeps it up, and ``sluice sql`` to find it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Self

from sluice.records.run import known_fields, read_json, run_dir, write_json

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
        data = read_json(run_dir(NAME) / "endpoint.json")
        return cls(**known_fields(cls, data)) if data else None

    def save(self) -> None:
        write_json(run_dir(NAME) / "endpoint.json", asdict(self))
