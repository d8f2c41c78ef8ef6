"""An OpenLineage receiver for the tests: a real HTTP server taking what the clients send
(``POST /api/v1/lineage``) and checking each event against the OpenLineage spec.

The published JSON Schemas (openlineage.io/spec) are not in any package registry this
project installs from, so the check uses openlineage-python's classes, which OpenLineage
generates from those schemas: each event is rebuilt through them, recursively, so that every
required field must be there, every field must be one the spec defines, every value must
have the spec's type, and the classes' own checks run (runId a UUID, eventTime an ISO 8601
date-time, URIs). A facet the classes know must carry its own ``_schemaURL``; any other facet
must carry ``_producer`` and ``_schemaURL``, as the spec's BaseFacet asks.
"""

from __future__ import annotations

import json
import threading
import types
import typing
import uuid
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import attr
from openlineage.client.event_v2 import RunEvent
from openlineage.client.facet_v2 import (
    DatasetFacet,
    InputDatasetFacet,
    JobFacet,
    OutputDatasetFacet,
    RunFacet,
    column_lineage_dataset,
    documentation_job,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
)

#: Facets by where they sit and the key the spec gives them, checked field by field.
KNOWN_FACETS: dict[tuple[str, str], type] = {
    ("Run", "processing_engine"): processing_engine_run.ProcessingEngineRunFacet,
    ("Run", "errorMessage"): error_message_run.ErrorMessageRunFacet,
    ("Run", "parent"): parent_run.ParentRunFacet,
    ("Run", "nominalTime"): nominal_time_run.NominalTimeRunFacet,
    ("Job", "jobType"): job_type_job.JobTypeJobFacet,
    ("Job", "documentation"): documentation_job.DocumentationJobFacet,
    ("Dataset", "schema"): schema_dataset.SchemaDatasetFacet,
    ("Dataset", "columnLineage"): column_lineage_dataset.ColumnLineageDatasetFacet,
    ("InputDataset", "inputStatistics"): input_statistics_input_dataset.InputStatisticsInputDatasetFacet,
    ("OutputDataset", "outputStatistics"): output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet,
}
#: Which facets may sit where, by the facet type a field holds (a parent run's too).
PLACES = {
    RunFacet: "Run",
    JobFacet: "Job",
    DatasetFacet: "Dataset",
    InputDatasetFacet: "InputDataset",
    OutputDatasetFacet: "OutputDataset",
}


class Invalid(ValueError):
    pass


def check(event: dict[str, Any]) -> None:
    """Raise :class:`Invalid` with the path of the first thing the spec does not allow."""
    for key in ("producer", "schemaURL"):  # required by the spec; the class would fill them in
        if not isinstance(event.get(key), str) or not urlparse(event[key]).scheme:
            raise Invalid(f"$.{key}: required, as a URI")
    _build(RunEvent, event, "$")
    try:
        uuid.UUID(event["run"]["runId"])  # the spec's format: uuid
    except ValueError as exc:
        raise Invalid(f"$.run.runId: {exc}") from exc


def _build(cls: type, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise Invalid(f"{path}: an object ({cls.__name__}) expected, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attr.fields(cls)}  # the JSON keys: `_producer` stays `_producer`
    unknown = set(value) - set(fields)
    if unknown:
        raise Invalid(f"{path}: {sorted(unknown)} not in the spec's {cls.__name__}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in value:
            if f.default is attr.NOTHING and f.init:
                raise Invalid(f"{path}.{name}: required by the spec's {cls.__name__}, missing")
            continue
        built = _value(hints[name], value[name], f"{path}.{name}")
        if not f.init:  # schemaURL: fixed by the class
            want = cls._get_schema()  # type: ignore[attr-defined]
            if value[name] != want:
                raise Invalid(f"{path}.{name}: {value[name]!r}, the spec's {cls.__name__} is {want!r}")
            continue
        kwargs[f.alias or name] = built
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise Invalid(f"{path}: {exc}") from exc


def _value(hint: Any, value: Any, path: str) -> Any:
    if value is None:  # the spec's optional fields are left out, never null
        raise Invalid(f"{path}: null")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        if not isinstance(value, list):
            raise Invalid(f"{path}: a list expected, got {value!r}")
        return [_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid(f"{path}: an object expected, got {value!r}")
        if args[1] in PLACES:  # facets: by their place and key, or as the spec's BaseFacet
            return {k: _facet(PLACES[args[1]], k, v, f"{path}.{k}") for k, v in value.items()}
        return {k: _value(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError as exc:
            raise Invalid(f"{path}: {value!r} is not one of {[e.value for e in hint]}") from exc
    if attr.has(hint):
        return _build(hint, value, path)
    if hint is Any:
        return value
    want = {str: str, int: int, bool: bool, float: (int, float)}.get(hint)
    if want is None:
        raise Invalid(f"{path}: the check does not know the type {hint!r}")
    if not isinstance(value, want) or (hint is int and isinstance(value, bool)):
        raise Invalid(f"{path}: a {hint.__name__} expected, got {value!r}")
    return value


def _facet(place: str, key: str, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise Invalid(f"{path}: a facet is an object, got {value!r}")
    for base in ("_producer", "_schemaURL"):
        if not isinstance(value.get(base), str) or not urlparse(value[base]).scheme:
            raise Invalid(f"{path}.{base}: required of every facet, as a URI")
    cls = KNOWN_FACETS.get((place, key))
    elsewhere = [p for p, k in KNOWN_FACETS if k == key]
    if cls is None and elsewhere and key != "documentation":  # a dataset's is another facet
        raise Invalid(f"{path}: a {elsewhere[0]} facet, out of place here")
    if cls is None:
        return value
    return _build(cls, value, path)


class Receiver:
    """Collects every event POSTed to it; the ones that fail :func:`check` are kept apart."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.invalid: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    event = json.loads(body)
                    check(event)
                except Exception as exc:  # anything the check raises is the event's fault here
                    with receiver.lock:
                        receiver.invalid.append((str(exc), json.loads(body) if body.startswith(b"{") else {}))
                    self.send_response(400)
                else:
                    with receiver.lock:
                        receiver.events.append(event)
                    self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_job(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["job"]["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
