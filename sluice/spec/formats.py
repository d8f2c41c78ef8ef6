"""What each table format can do: the one place where Delta and Parquet differ in kind.

A sink's format decides more than how its files are written: whether a derived pipeline may
rewrite a window's row, whether the table has OPTIMIZE and VACUUM, what a derived pipeline's
lag is counted in, and whether a catalog reads the table's schema from its log at every query
or takes it from files once. The spec, the DAGs, the CLI and the SQL catalog ask a
:class:`TableFormat`; the Spark side writes through one class per format
(:mod:`jobs.tables.sinks`) and reads through another (:mod:`jobs.tables.readers`), and
``sluice`` reads without Spark through a third (:mod:`sluice.records.tables`).

Example::

    table_format("delta").merges        # True
    table_format("kafka")               # None: a topic is not a table
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class TableFormat:
    name: str
    #: A row already written can be replaced (MERGE), so a windowed aggregate may run in
    #: ``output_mode: update``; a file sink can only add files.
    merges: bool
    #: The table has maintenance (OPTIMIZE, VACUUM) and so a maintenance DAG.
    maintained: bool
    #: The table's log names its schema, so a catalog reads it at each query; otherwise the
    #: schema is the files' own, read (and merged over all files) when the table is registered.
    schema_in_log: bool
    #: What a derived pipeline's lag behind this table is counted in: the log's unit of change.
    lag_unit: str


DELTA = TableFormat("delta", merges=True, maintained=True, schema_in_log=True, lag_unit="versions")
PARQUET = TableFormat("parquet", merges=False, maintained=False, schema_in_log=False, lag_unit="files")
FORMATS = {f.name: f for f in (DELTA, PARQUET)}


def table_format(sink_format: str) -> TableFormat | None:
    """The table format of a sink (None for a Kafka sink, which writes a topic)."""
    return FORMATS.get(sink_format)


def for_format(registry: Mapping[str, T], fmt: str) -> T:
    """A side's class for tables of format ``fmt`` (:data:`jobs.tables.sinks.SINKS`,
    :data:`jobs.tables.readers.READERS`, :data:`sluice.records.tables.READERS`); ValueError for
    a sink that is not a table."""
    try:
        return registry[fmt]
    except KeyError:
        raise ValueError(f"{fmt} is not a table format (one of {', '.join(registry)})") from None
