"""Each table format read without Spark, one class per format: delta-rs for Delta, pyarrow
over the files a Parquet table's log lists; on local disk or S3 (see :func:`sluice.storage.reachable`).

``sluice check`` compares a table's shape with the spec's through :func:`read_shape`, and
``sluice schema suggest`` reads the rescued values through :meth:`TableFiles.values`. The job
reads the same tables through Spark (:mod:`jobs.sinks`), on any file system Hadoop reaches.

Example::

    read_shape("delta", ".sluice/tables/device_signals")     # Shape(columns={...}, partition_by=['date'])
    list(table_files("parquet").values(path, "_rescued"))   # ['{"signal": "n/a"}', ...]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from sluice import storage
from sluice.records import parquet_log
from sluice.spec.compatibility import SPARK_SCHEMA_KEY, Shape, shape_from_spark_schema
from sluice.spec.formats import DELTA, PARQUET, TableFormat


class TableFiles(ABC):
    format: ClassVar[TableFormat]

    @classmethod
    @abstractmethod
    def shape(cls, path: str) -> Shape | None:
        """The table's columns and partitioning (None if it has no data yet)."""

    @classmethod
    @abstractmethod
    def values(cls, path: str, column: str) -> Iterator[Any]:
        """The non-null values of a top-level column, in no set order (none when the table
        or the column is not there yet)."""


class DeltaFiles(TableFiles):
    format = DELTA

    @classmethod
    def shape(cls, path: str) -> Shape | None:
        table = storage.delta_table(path)
        if table is None:
            return None
        return shape_from_spark_schema(table.schema().to_json(), list(table.metadata().partition_columns))

    @classmethod
    def values(cls, path: str, column: str) -> Iterator[Any]:
        import pyarrow.compute as pc

        table = storage.delta_table(path)
        if table is None:
            return
        dataset = table.to_pyarrow_dataset()
        if column in dataset.schema.names:
            yield from dataset.to_table(columns=[column], filter=pc.field(column).is_valid()).column(column).to_pylist()


class ParquetFiles(TableFiles):
    format = PARQUET

    @classmethod
    def shape(cls, path: str) -> Shape | None:
        import pyarrow.parquet as pq

        entries = parquet_log.committed_files(path)
        if not entries:
            return None
        newest = parquet_log.newest(entries).path
        fs, file = parquet_log.location(newest).arrow()
        footer = pq.read_schema(file, filesystem=fs).metadata or {}
        if SPARK_SCHEMA_KEY not in footer:
            raise ValueError(f"{newest} was not written by Spark (no Spark schema in its footer)")
        return shape_from_spark_schema(footer[SPARK_SCHEMA_KEY].decode(), parquet_log.partition_columns(path, entries))

    @classmethod
    def values(cls, path: str, column: str) -> Iterator[Any]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for entry in parquet_log.committed_files(path):
            fs, file = parquet_log.location(entry.path).arrow()
            if column in pq.read_schema(file, filesystem=fs).names:  # older files may lack it
                table = pq.read_table(file, columns=[column], filesystem=fs).filter(pc.field(column).is_valid())
                yield from table.column(column).to_pylist()


READERS: dict[str, type[TableFiles]] = {r.format.name: r for r in (DeltaFiles, ParquetFiles)}


def table_files(fmt: str) -> type[TableFiles]:
    """The reader of tables of format ``fmt`` (``delta`` or ``parquet``)."""
    try:
        return READERS[fmt]
    except KeyError:
        raise ValueError(f"{fmt} is not a table format (one of {', '.join(READERS)})") from None


def read_shape(fmt: str, path: str) -> Shape | None:
    """A table's shape, without Spark; None if it has no data yet (a :data:`compatibility.Reader`)."""
    return table_files(fmt).shape(path)
