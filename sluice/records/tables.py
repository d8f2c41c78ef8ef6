"""Each table format read without Spark, one class per format: delta-rs for Delta, pyarrow
over the files a Parquet table's log lists; on local disk or S3 (see :func:`sluice.storage.reachable`).

``sluice check`` compares a table's shape with the spec's through :func:`read_shape`,
``sluice schema suggest`` reads the rescued values through :meth:`TableFiles.values`, and
``sluice status`` a derived pipeline's lag behind the table it reads through :func:`upstream_lag`. The job
reads the same tables through Spark (:mod:`jobs.tables.readers`), on any file system Hadoop reaches.

Example::

    read_shape("delta", ".sluice/tables/device_signals")     # Shape(columns={...}, partition_by=['date'])
    list(table_files("parquet").values(path, "_rescued"))   # ['{"signal": "n/a"}', ...]
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from sluice import storage
from sluice.records import checkpoint, parquet_log
from sluice.spec.compatibility import Shape, shape_from_spark_schema
from sluice.spec.formats import DELTA, PARQUET, TableFormat, for_format
from sluice.storage import Location

#: Spark keeps the writer's schema in every Parquet file's footer under this key.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


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

    @classmethod
    @abstractmethod
    def lag(cls, checkpoint_root: Location, table: Location) -> int:
        """How far the streaming source of a checkpoint is behind this table, in the
        format's ``lag_unit``: changes the table has that no committed batch has read."""


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

    @classmethod
    def lag(cls, checkpoint_root: Location, table: Location) -> int:
        """Versions that change data after the Delta source's offset (``reservoirVersion``,
        ``index``), which points into the version it reads next; ``index`` -1 means none of
        that version's files is read yet."""
        log = table / "_delta_log"
        stems = [c.name.removesuffix(".json") for c in log.children() if c.name.endswith(".json")]
        newest = max((int(s) for s in stems if s.isdigit()), default=None)
        if newest is None:
            return 0
        offset = checkpoint.committed_offset(checkpoint_root)
        if offset is None:
            first = 0
        else:
            version, index = int(offset["reservoirVersion"]), int(offset.get("index", -1))  # type: ignore[call-overload]
            first = version if index == -1 else version + 1
        return sum(1 for v in range(first, newest + 1) if _changes_data(log / f"{v:020d}.json"))


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

    @classmethod
    def lag(cls, checkpoint_root: Location, table: Location) -> int:
        """Files the log lists that the file source has not listed yet."""
        seen = checkpoint.files_seen(checkpoint_root)
        return sum(1 for e in parquet_log.committed_files(table) if parquet_log.place(e.path) not in seen)


def _changes_data(commit: Location) -> bool:
    """Does a Delta commit add or remove data? (OPTIMIZE's and metadata commits do not, and
    the Delta source skips them without a batch.) A commit no longer there counts as data."""
    try:
        text = commit.read_text()
    except FileNotFoundError:
        return True
    for line in text.splitlines():
        action = json.loads(line)
        for kind in ("add", "remove", "cdc"):
            if kind in action and action[kind].get("dataChange", True):
                return True
    return False


READERS: dict[str, type[TableFiles]] = {r.format.name: r for r in (DeltaFiles, ParquetFiles)}


def table_files(fmt: str) -> type[TableFiles]:
    """The reader of tables of format ``fmt`` (``delta`` or ``parquet``)."""
    return for_format(READERS, fmt)


def upstream_lag(checkpoint_path: str, fmt: str, table: str) -> int | None:
    """How far a derived pipeline's checkpoint is behind the table it reads (see
    :meth:`TableFiles.lag`); None when Sluice cannot read either without Spark."""
    if not (storage.reachable(checkpoint_path) and storage.reachable(table)):
        return None
    return table_files(fmt).lag(Location(checkpoint_path), Location(table))


def read_shape(fmt: str, path: str) -> Shape | None:
    """A table's shape, without Spark; None if it has no data yet (a :data:`compatibility.Reader`)."""
    return table_files(fmt).shape(path)
