"""Can a spec write to the table that is already there? Checked before anything is written.

A table keeps the partitioning of its first write, and its columns grow by the rules of
:mod:`sluice.spec.evolution`: a new column is added (Delta merges it into the table's
schema; Parquet's new files carry it, and readers merge their schemas). A spec that
removes a column, changes its type (widening too: see :data:`WIDENING_REFUSED`) or repartitions would
otherwise be found out late: Delta refuses the first write with a stack trace, and Parquet
accepts it, leaving files Spark then cannot read together (``PARQUET_COLUMN_DATA_TYPE_MISMATCH``).

:func:`expected` is what the spec writes, worked out from the spec alone; a table's actual
shape comes from its own log: Delta's schema and partition columns, or for Parquet the
Spark schema Spark stores in each file's footer and the ``name=value`` folders. The job
reads it through Spark (any filesystem), ``sluice check`` through delta-rs and pyarrow
(:func:`sluice.records.tables.read_shape`); both compare with :func:`differences`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from sluice.spec import evolution, flatten
from sluice.spec.pipeline import Pipeline
from sluice.spec.schema import SchemaError, parse_json_schema


@dataclass(frozen=True)
class Shape:
    """A table's columns (name -> Spark SQL type; None where only the name is known, as for
    Parquet's partition folders) and its partition columns."""

    columns: dict[str, str | None]
    partition_by: list[str]


def _lineage() -> dict[str, str | None]:
    return {
        flatten.KAFKA_TOPIC: "string",
        flatten.KAFKA_PARTITION: "int",
        flatten.KAFKA_OFFSET: "bigint",
        flatten.KAFKA_TIMESTAMP: "timestamp",
    }


def plain_columns(pipeline: Pipeline) -> dict[str, str | None]:
    """The columns of a pipeline's events as flattened rows, with Sluice's own columns."""
    date = pipeline.spec.date_partition.column
    out: dict[str, str | None] = {c.name: c.type.sql() for c in pipeline.plan.columns}
    own = {flatten.EVENT_TIME: "timestamp", flatten.INGESTED_AT: "timestamp", flatten.RESCUED: "string", date: "date"}
    return out | _lineage() | own


def expected(pipeline: Pipeline) -> tuple[Shape, Shape]:
    """The output table and the quarantine table this spec writes."""
    date = pipeline.spec.date_partition.column
    out = pipeline.derivation.output_columns(date) if pipeline.derived else plain_columns(pipeline)
    quarantine: dict[str, str | None] = {"raw_key": "binary", "raw_value": "binary", "raw_text": "string"}
    quarantine |= _lineage() | {"reason": "string", flatten.INGESTED_AT: "timestamp", date: "date"}
    return Shape(out, [date]), Shape(quarantine, [date])


def shape_from_spark_schema(schema_json: str, partition_by: list[str]) -> Shape:
    """A shape from Spark's StructType JSON (Delta's schemaString, a Parquet footer, df.schema.json())."""
    try:
        struct = parse_json_schema(schema_json, "the table's schema")
    except SchemaError as exc:
        raise ValueError(str(exc)) from None
    columns: dict[str, str | None] = {f.name: f.type.sql() for f in struct.fields}
    for name in partition_by:  # Parquet keeps partition values in folder names only
        columns.setdefault(name, None)
    return Shape(columns, list(partition_by))


def _type_change(name: str, actual: str, wanted: str) -> evolution.Change | None:
    old, new = evolution.column_type(actual), evolution.column_type(wanted)
    if old is None or new is None:
        return evolution.Change(name, "changed", actual, wanted, False, evolution.CHANGED)
    changes = evolution.compare(old, new, name)
    refused = [c for c in changes if not c.compatible or c.kind == "widened"]
    first = refused[0] if refused else None
    if first is not None and first.kind == "widened":
        return dataclasses.replace(first, compatible=False, rule=WIDENING_REFUSED)
    return first


def growth(want: Shape, found: Shape) -> list[evolution.Change]:
    """The compatible changes the next write makes: columns added, nested fields added, types widened."""
    have = {name.lower(): t for name, t in found.columns.items()}
    out = []
    for name, wanted in want.columns.items():
        if name.lower() in (p.lower() for p in found.partition_by):
            continue
        if name.lower() not in have:
            out.append(evolution.Change(name, "added", None, wanted, True, evolution.ADDED))
            continue
        actual = have[name.lower()]
        old, new = evolution.column_type(actual or ""), evolution.column_type(wanted or "")
        if actual != wanted and old is not None and new is not None:
            out += [c for c in evolution.compare(old, new, name) if c.compatible and c.kind != "widened"]
    return out


def differences(want: Shape, found: Shape) -> list[str]:
    """What the spec would change that the table cannot take, one line per column (names
    compared as Spark does, ignoring case). New columns and nested fields are not here."""
    problems = []
    if [p.lower() for p in want.partition_by] != [p.lower() for p in found.partition_by]:
        problems.append(
            f"partitioning: the table is partitioned by {', '.join(found.partition_by) or 'nothing'}, "
            f"the spec by {', '.join(want.partition_by)}"
        )
    have = {name.lower(): (name, t) for name, t in found.columns.items()}
    for name, wanted in want.columns.items():
        if name.lower() not in have:
            continue  # a new column: the next write adds it
        _, actual = have.pop(name.lower())
        if actual is not None and wanted is not None and actual != wanted:
            change = _type_change(name, actual, wanted)
            if change is not None and change.path == name:  # the column's own type
                problems.append(f"column {name}: the table has {actual}, the spec makes {wanted} ({change.rule})")
            elif change is not None:  # a field inside it
                problems.append(f"column {name}: field {change.describe()}")
    for name, actual in have.values():
        if name.lower() not in (p.lower() for p in want.partition_by + found.partition_by):
            problems.append(
                f"column {name}: the table has it ({actual}); the spec no longer makes it ({evolution.REMOVED})"
            )
    return problems


#: Delta 4 can widen a column in place, but only by setting its ``typeWidening`` reader
#: feature, and delta-rs (1.6) then refuses to open the table: Sluice does not do that to a table.
WIDENING_REFUSED = (
    "widening a type is compatible between schemas, but the table would need Delta's typeWidening "
    "feature, which readers such as delta-rs cannot open yet"
)

#: What a user can do about a change the table cannot take.
OPTIONS = (
    "Either change the spec back, or write to a new table: set a new sink.path and checkpoint "
    "(with starting_offsets: earliest it reads again what Kafka still holds), then backfill "
    "older ranges into it with `sluice backfill`."
)


class IncompatibleTable(ValueError):
    """The spec no longer matches the table it writes to."""


#: The schema a checkpoint last ran with, beside Spark's files in it: a new version is
#: compared with it by the rules of :mod:`sluice.spec.evolution` (a field made required
#: leaves no trace in the table's columns, so the table alone cannot tell).
SCHEMA_FILE = "sluice_schema.json"


def schema_problems(pipeline: Pipeline, recorded: str) -> str | None:
    """Why the spec's schema cannot follow the one the checkpoint recorded (None if it can)."""
    try:
        old = parse_json_schema(recorded, f"{pipeline.checkpoint_path}/{SCHEMA_FILE}")
    except SchemaError:
        return None  # not ours to judge: the table comparison still runs
    refused = evolution.incompatible(evolution.compare(old, pipeline.schema))
    if not refused:
        return None
    lines = "\n".join(f"  - {c.describe()}" for c in refused)
    return (
        f"{pipeline.name}: the schema {pipeline.schema_file.name} cannot follow the one the checkpoint "
        f"{pipeline.checkpoint_path} ran with:\n{lines}\nNothing was written. {OPTIONS}"
    )


Reader = Callable[[str, str], Shape | None]


def check(pipeline: Pipeline, read: Reader) -> None:
    """Raise :class:`IncompatibleTable` naming every column that differs; a table that does
    not exist yet (``read`` returns None) is fine."""
    fmt = pipeline.spec.sink.format
    if pipeline.table_format is None:  # a topic
        return
    out, quarantine = expected(pipeline)
    for want, path in ((out, pipeline.sink_path), (quarantine, pipeline.quarantine_path)):
        found = read(fmt, path)
        problems = differences(want, found) if found is not None else []
        if problems:
            lines = "\n".join(f"  - {p}" for p in problems)
            raise IncompatibleTable(
                f"{pipeline.name}: the spec does not match the {fmt} table that is already at {path}:\n{lines}\n"
                f"Nothing was written. {OPTIONS}"
            )
