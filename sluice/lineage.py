"""What a pipeline reads and writes, as OpenLineage datasets with column lineage.

Sluice knows from the spec alone which topics or table a pipeline reads, which tables or
topics it writes, and where each output column comes from: the flattening plan maps each
column to the event field it reads, and a derived pipeline's window, aggregates, keys and
filter map its columns to the upstream table's. Both sides report it:

- Airflow's OpenLineage provider asks each Sluice task (:mod:`sluice.airflow.lineage`);
- a stream's driver sends its run's own events (:mod:`jobs.stream.lineage`): START, RUNNING while it
  runs, then COMPLETE or FAIL, because Spark's OpenLineage listener loses a micro-batch
  stream's Delta output and a long-running job sends it no RUNNING events.

Datasets are named as OpenLineage's naming conventions say: ``kafka://host:port`` and the
topic; ``file`` and the path; ``s3://bucket`` and the key (``s3a://`` as ``s3://``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import sqlglot
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    DatasetFacet,
    JobFacet,
    RunFacet,
    column_lineage_dataset,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    schema_dataset,
)
from sqlglot import exp

from sluice import __version__
from sluice.spec import compatibility
from sluice.spec.columns import EVENT_TIME
from sluice.spec.derived import SESSION_END, SESSION_EVENTS, SESSION_START, WINDOW_END, WINDOW_START
from sluice.spec.pipeline import Continuous, Pipeline
from sluice.spec.schema import Array, DataType, Map, Struct

#: Who made the events: OpenLineage asks for a URI naming the producing software.
PRODUCER = f"urn:sluice:{__version__}"

_DIRECT, _INDIRECT = "DIRECT", "INDIRECT"


def namespace() -> str:
    """The jobs' namespace: OpenLineage's own setting, as its clients read it."""
    return os.environ.get("OPENLINEAGE_NAMESPACE") or "default"


def dataset_name(location: str) -> tuple[str, str]:
    """A table path or ``kafka://brokers/topic`` as OpenLineage's (namespace, name)."""
    if "://" not in location:
        return "file", os.path.abspath(location)
    parts = urlsplit(location)
    scheme = {"s3a": "s3", "s3n": "s3"}.get(parts.scheme, parts.scheme)
    if scheme == "file":
        return "file", parts.path
    if scheme == "kafka":
        return f"kafka://{parts.netloc.split(',')[0]}", parts.path.lstrip("/")
    return f"{scheme}://{parts.netloc}", parts.path.lstrip("/")


@dataclass(frozen=True)
class Lineage:
    """A pipeline's inputs and outputs, for any event about it."""

    inputs: list[InputDataset]
    outputs: list[OutputDataset]

    def with_input_rows(self, rows: int) -> Lineage:
        """The same datasets, the input saying how many records the run read (not said for
        several topics: the count is of them all)."""
        if len(self.inputs) != 1:
            return self
        facet = input_statistics_input_dataset.InputStatisticsInputDatasetFacet(rowCount=rows)
        inputs = [
            InputDataset(
                d.namespace, d.name, facets=d.facets, inputFacets={**(d.inputFacets or {}), "inputStatistics": facet}
            )
            for d in self.inputs
        ]
        return Lineage(inputs, self.outputs)


def of(pipeline: Pipeline) -> Lineage:
    """What the pipeline reads and writes, with schemas and column lineage."""
    if pipeline.upstream is not None:
        upstream = pipeline.upstream
        source = dataset_name(upstream.sink_path)
        inputs = [InputDataset(*source, facets={"schema": _table_schema(compatibility.expected(upstream)[0].columns)})]
        table = _derived_lineage(pipeline, source)
    else:
        kafka = pipeline.kafka
        topics = kafka.topics or [kafka.topic_pattern or ""]
        sources = [dataset_name(f"kafka://{kafka.bootstrap_servers}/{t}") for t in topics]
        event_schema: dict[str, DatasetFacet] = {"schema": _event_schema(pipeline.schema)}
        inputs = [InputDataset(*s, facets=event_schema) for s in sources]
        if pipeline.spec.sink.format == "kafka":
            return Lineage(inputs, _verdict_outputs(pipeline, sources))
        table = _flatten_lineage(pipeline, sources)
    out, quarantine = compatibility.expected(pipeline)
    outputs = [
        OutputDataset(
            *dataset_name(pipeline.sink_path),
            facets={"schema": _table_schema(out.columns), **({"columnLineage": table} if table else {})},
        ),
        OutputDataset(*dataset_name(pipeline.quarantine_path), facets={"schema": _table_schema(quarantine.columns)}),
    ]
    return Lineage(inputs, outputs)


def event(
    pipeline: Pipeline,
    state: RunState,
    run_id: str,
    lineage: Lineage | None = None,
    *,
    error: str | None = None,
    run_facets: dict[str, RunFacet] | None = None,
) -> RunEvent:
    """One run event of a pipeline's stream (its job is named after the pipeline)."""
    facets: dict[str, RunFacet] = dict(run_facets or {})
    if error is not None:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(message=error, programmingLanguage="python")
    lineage = lineage or of(pipeline)
    job_facets: dict[str, JobFacet] = {
        "jobType": job_type_job.JobTypeJobFacet(processingType="STREAMING", integration="SPARK", jobType="JOB")
    }
    return RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=run_id, facets=facets),
        job=Job(namespace=namespace(), name=f"sluice.{pipeline.name}", facets=job_facets),
        producer=PRODUCER,
        inputs=lineage.inputs,
        outputs=lineage.outputs,
    )


def _event_schema(struct: Struct) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(fields=_fields(struct))


def _fields(struct: Struct) -> list[schema_dataset.SchemaDatasetFacetFields]:
    out = []
    for f in struct.fields:
        inner = _element(f.type)
        out.append(
            schema_dataset.SchemaDatasetFacetFields(
                name=f.name,
                type=f.type.sql(),
                fields=_fields(inner) if isinstance(inner, Struct) else [],
            )
        )
    return out


def _element(t: DataType) -> DataType:
    """What nested fields a type has: an array's or a map's values are looked through."""
    while isinstance(t, Array | Map):
        t = t.element if isinstance(t, Array) else t.value
    return t


def _table_schema(columns: Mapping[str, str | None]) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in columns.items()]
    )


def _field(
    source: tuple[str, str], path: str, kind: str, subtype: str, description: str | None = None
) -> column_lineage_dataset.InputField:
    return column_lineage_dataset.InputField(
        namespace=source[0],
        name=source[1],
        field=path,
        transformations=[column_lineage_dataset.Transformation(type=kind, subtype=subtype, description=description)],
    )


def _flatten_lineage(
    pipeline: Pipeline, sources: list[tuple[str, str]]
) -> column_lineage_dataset.ColumnLineageDatasetFacet:
    """Each flattened column reads one event field as it is (an exploded array's, one element
    per row); the event time and the date partition are computed from the event-time field."""
    fields: dict[str, column_lineage_dataset.Fields] = {}
    for column in pipeline.plan.columns:
        if "[]" in column.source:  # an exploded array's element, one row each
            read = [_field(s, column.path, _DIRECT, "TRANSFORMATION", "one row per array element") for s in sources]
        else:
            read = [_field(s, column.path, _DIRECT, "IDENTITY") for s in sources]
        fields[column.name] = column_lineage_dataset.Fields(inputFields=read)
    time = pipeline.event_time
    how = f"the event time, read as {time.format}"
    fields[EVENT_TIME] = column_lineage_dataset.Fields(
        inputFields=[_field(s, time.field, _DIRECT, "TRANSFORMATION", how) for s in sources]
    )
    date = pipeline.spec.date_partition
    fields[date.column] = column_lineage_dataset.Fields(
        inputFields=[
            _field(s, time.field, _DIRECT, "TRANSFORMATION", f"the event time's date in {date.timezone}")
            for s in sources
        ]
    )
    return column_lineage_dataset.ColumnLineageDatasetFacet(fields=fields)


_SOURCE = "struct<topic:string,partition:int,offset:bigint,timestamp:timestamp>"


def _verdict_outputs(pipeline: Pipeline, sources: list[tuple[str, str]]) -> list[OutputDataset]:
    """A continuous branch's verdict records (see jobs.stream.continuous): the chosen columns, the
    event time, where the record came from, and which rules fired, with the fields each
    rule reads; and its quarantine topic."""
    c = pipeline.spec.continuous or Continuous()
    plan = {col.name: col for col in pipeline.plan.columns}
    chosen = c.columns or list(plan)
    schema = {n: plan[n].type.sql() for n in chosen} | {
        "event_time": "timestamp",
        "source": _SOURCE,
        "flagged": "boolean",
        "rules": "array<string>",
    }
    time = pipeline.event_time.field
    fields = {n: [_field(s, plan[n].path, _DIRECT, "IDENTITY") for s in sources] for n in chosen}
    fields["event_time"] = [_field(s, time, _DIRECT, "TRANSFORMATION", "the event time") for s in sources]
    read = [plan[n].path for sql in c.rules.values() for n in _columns_read(sql) if n in plan]
    fields["flagged"] = fields["rules"] = [
        _field(s, path, _DIRECT, "TRANSFORMATION", "the rules that fired")
        for path in dict.fromkeys(read)
        for s in sources
    ]
    verdicts = column_lineage_dataset.ColumnLineageDatasetFacet(
        fields={n: column_lineage_dataset.Fields(inputFields=f) for n, f in fields.items()}
    )
    rejected = {"raw_text": "string", "reason": "string", "source": _SOURCE}
    return [
        OutputDataset(
            *dataset_name(pipeline.sink_path), facets={"schema": _table_schema(schema), "columnLineage": verdicts}
        ),
        OutputDataset(*dataset_name(pipeline.quarantine_path), facets={"schema": _table_schema(rejected)}),
    ]


def _derived_lineage(
    pipeline: Pipeline, source: tuple[str, str]
) -> column_lineage_dataset.ColumnLineageDatasetFacet | None:
    """A derived table's columns from the upstream table's: keys as they are, windows and
    sessions from the event time, aggregates from the columns their SQL reads; the filter,
    the keys and the window shape every row (OpenLineage's indirect lineage)."""
    d = pipeline.derivation
    date_column = pipeline.spec.date_partition.column
    time = d.time
    fields: dict[str, list[column_lineage_dataset.InputField]] = {}
    if d.window is not None:
        fields[WINDOW_START] = fields[WINDOW_END] = [_field(source, time, _DIRECT, "TRANSFORMATION", "window")]
        fields |= {g: [_field(source, g, _DIRECT, "IDENTITY")] for g in d.group_by}
        for name, sql in d.aggregate.items():
            fields[name] = [_field(source, c, _DIRECT, "AGGREGATION", sql) for c in _columns_read(sql)]
    elif d.state is not None and d.state.kind == "session":
        fields |= {k: [_field(source, k, _DIRECT, "IDENTITY")] for k in d.state.keys}
        fields[SESSION_START] = fields[SESSION_END] = [_field(source, time, _DIRECT, "AGGREGATION", "session")]
        fields[SESSION_EVENTS] = []
    elif d.state is None:
        fields |= {
            c: [_field(source, c, _DIRECT, "IDENTITY")] for c in d.output_columns(date_column) if c != date_column
        }
    date_from = d.date_source()
    if date_from is not None:
        fields[date_column] = [_field(source, time, _DIRECT, "TRANSFORMATION", f"the date of {date_from}")]
    shaping: list[column_lineage_dataset.InputField] = []
    if d.filter:
        shaping += [_field(source, c, _INDIRECT, "FILTER", d.filter) for c in _columns_read(d.filter)]
    if d.deduplicate is not None:
        shaping += [_field(source, k, _INDIRECT, "FILTER", "deduplicate") for k in d.deduplicate.keys]
    shaping += [_field(source, g, _INDIRECT, "GROUP_BY") for g in d.group_by]
    if d.state is not None:
        shaping += [_field(source, k, _INDIRECT, "GROUP_BY", f"{d.state.kind} state") for k in d.state.keys]
    if d.window is not None:
        shaping.append(_field(source, time, _INDIRECT, "WINDOW", d.window.type))
    if not fields and not shaping:
        return None
    return column_lineage_dataset.ColumnLineageDatasetFacet(
        fields={n: column_lineage_dataset.Fields(inputFields=f) for n, f in fields.items()}, dataset=shaping
    )


def _columns_read(sql: str) -> list[str]:
    """The columns a SQL expression reads, in order, once each (``count(*)`` reads none)."""
    seen: dict[str, None] = {}
    for column in sqlglot.parse_one(sql, read="spark").find_all(exp.Column):
        seen.setdefault(column.name, None)
    return list(seen)
