"""Publish a table's new batches: what the Airflow asset event carries downstream.

A marker in the pipeline's run folder remembers the newest audit file already published,
so each committed batch (the stream's or a backfill's) is announced once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sluice.errors import NothingToDo
from sluice.records import audit
from sluice.records.run import read_json, run_dir, write_json
from sluice.spec import Pipeline


class NothingToPublish(NothingToDo):
    pass


def _marker(pipeline: Pipeline) -> Path:
    return run_dir(pipeline.name) / "published.json"


def publish(pipeline: Pipeline, emit: Callable[[dict[str, int]], None]) -> dict[str, int]:
    """Sum the batches committed since the last publication and hand the totals to ``emit``
    (Airflow's asset event); the marker moves only once ``emit`` returned."""
    since = float((read_json(_marker(pipeline)) or {}).get("mtime", 0.0))
    new = list(audit.audit_files(audit.folders(pipeline), newer_than=since))
    if not new:
        raise NothingToPublish(f"no batch of {pipeline.name} committed since the last asset event")
    totals = audit.Totals()
    for f in new:
        totals.add(audit.read(f))
    emit(totals.as_dict())
    write_json(_marker(pipeline), {"mtime": max(f.stat().st_mtime for f in new)})
    return totals.as_dict()
