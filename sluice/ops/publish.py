"""Publish a table's new batches: what the Airflow asset event carries downstream.

A marker in the run-state store (``published``) remembers the newest audit file already published,
so each committed batch (the stream's or a backfill's) is announced once.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.errors import NothingToDo
from sluice.records import audit
from sluice.spec import Pipeline
from sluice.state import store


class NothingToPublish(NothingToDo):
    pass


def publish(pipeline: Pipeline, emit: Callable[[dict[str, int]], None]) -> dict[str, int]:
    """Sum the batches committed since the last publication and hand the totals to ``emit``
    (Airflow's asset event); the marker moves only once ``emit`` returned."""
    since = float((store().get("published", pipeline.name) or {}).get("mtime", 0.0))
    new = list(audit.audit_files(audit.folders(pipeline), newer_than=since))
    if not new:
        raise NothingToPublish(f"no batch of {pipeline.name} committed since the last asset event")
    totals, present = audit.Totals(), 0
    for f in new:
        batch = audit.read(f)
        totals.add(batch)
        present += batch.records_already_present
    marker = {"mtime": max(f.mtime() for f in new)}
    if not totals.rows_out and not totals.records_quarantined:  # the tables did not change
        store().put("published", pipeline.name, marker)
        why = f": their {present} records were already in the tables" if present else ""
        batches = "1 batch" if totals.batches == 1 else f"{totals.batches} batches"
        raise NothingToPublish(f"{batches} of {pipeline.name} wrote no row{why}")
    emit(totals.as_dict())
    store().put("published", pipeline.name, marker)
    return totals.as_dict()
