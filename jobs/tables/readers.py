"""Each table format's reader on the Spark side, one class per format: how a table is found,
its shape, its committed rows, and the table as a stream. The writers are in
:mod:`jobs.tables.sinks`; what a format can do is :class:`sluice.spec.formats.TableFormat`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession

from jobs.tables import hadoopfs
from sluice.records import parquet_log
from sluice.spec import Pipeline, compatibility
from sluice.spec.formats import DELTA, PARQUET, TableFormat, for_format

log = logging.getLogger("sluice.tables")


class TableReader(ABC):
    """What Spark needs to find and read a table a pipeline writes."""

    format: ClassVar[TableFormat]

    @classmethod
    @abstractmethod
    def exists(cls, spark: SparkSession, path: str) -> bool:
        """Has a pipeline committed to the table at ``path`` (its log has entries)?"""

    @classmethod
    @abstractmethod
    def shape(cls, spark: SparkSession, path: str) -> compatibility.Shape | None:
        """The table's columns and partitioning, from its log (None if it has no data yet)."""

    @classmethod
    @abstractmethod
    def read(cls, spark: SparkSession, path: str) -> DataFrame:
        """The table's committed rows: never a file of a batch that did not finish."""

    @classmethod
    @abstractmethod
    def read_stream(cls, spark: SparkSession, path: str, options: dict[str, str], skip_changes: bool) -> DataFrame:
        """The table as a streaming source; ``skip_changes`` passes over commits that rewrite rows."""


class DeltaReader(TableReader):
    format = DELTA

    @classmethod
    def exists(cls, spark: SparkSession, path: str) -> bool:
        return hadoopfs.has_children(spark, f"{path}/_delta_log")

    @classmethod
    def shape(cls, spark: SparkSession, path: str) -> compatibility.Shape | None:
        from delta.tables import DeltaTable

        if not cls.exists(spark, path):
            return None
        detail = DeltaTable.forPath(spark, path).detail().first()
        schema = spark.read.format("delta").load(path).schema.json()
        return compatibility.shape_from_spark_schema(schema, list(detail["partitionColumns"]) if detail else [])

    @classmethod
    def read(cls, spark: SparkSession, path: str) -> DataFrame:
        return spark.read.format("delta").load(path)

    @classmethod
    def read_stream(cls, spark: SparkSession, path: str, options: dict[str, str], skip_changes: bool) -> DataFrame:
        if skip_changes:
            options = {**options, "skipChangeCommits": "true"}
        return spark.readStream.format("delta").options(**options).load(path)


class ParquetReader(TableReader):
    format = PARQUET

    @classmethod
    def exists(cls, spark: SparkSession, path: str) -> bool:
        # A commit, not just a folder: it may hold only a temporary file of a commit that died.
        return parquet_log.latest(hadoopfs.list_names(spark, f"{path}/{parquet_log.LOG_DIR}")) is not None

    @classmethod
    def shape(cls, spark: SparkSession, path: str) -> compatibility.Shape | None:
        entries = committed_files(spark, path)  # none when the log has no commit yet
        if not entries:
            return None
        return compatibility.shape_from_spark_schema(
            newest_file_schema(spark, entries), parquet_log.partition_columns(path, entries)
        )

    @classmethod
    def read(cls, spark: SparkSession, path: str) -> DataFrame:
        """Spark reads the ``_spark_metadata`` log when it is there, so files of an unfinished
        batch are never seen. Schemas are merged: files written after the spec gained a column
        have it, older ones read NULL."""
        return spark.read.option("mergeSchema", "true").parquet(path)

    @classmethod
    def read_stream(cls, spark: SparkSession, path: str, options: dict[str, str], skip_changes: bool) -> DataFrame:
        # The file source lists committed files only, and a Parquet table's commits only add
        # files, so there are no changes to skip.
        schema = cls.read(spark, path).schema  # the table's own, through its log
        return spark.readStream.schema(schema).options(**options).parquet(path)


def read_log(spark: SparkSession, log_dir: str, commits: range) -> list[parquet_log.Entry]:
    entries = []
    for commit in commits:
        path = f"{log_dir}/{parquet_log.file_name(commit)}"
        entries += parquet_log.parse(hadoopfs.read_text(spark, path), path)
    return parquet_log.live(entries)


def committed_files(spark: SparkSession, table: str) -> list[parquet_log.Entry]:
    """The files a Parquet table's log lists (on any filesystem Hadoop reaches)."""
    log_dir = f"{table.rstrip('/')}/{parquet_log.LOG_DIR}"
    names = hadoopfs.list_names(spark, log_dir)
    newest = parquet_log.latest(names)
    if newest is None:
        return []
    parquet_log.check_interval(names)
    return read_log(spark, log_dir, parquet_log.needed(newest))


def newest_file_schema(spark: SparkSession, entries: list[parquet_log.Entry]) -> str:
    """The schema (Spark's JSON) of the newest file a Parquet table's log lists: its footer,
    without the partition columns."""
    return spark.read.parquet(parquet_log.newest(entries).path).schema.json()


def log_growth(pipeline: Pipeline, read: compatibility.Reader) -> None:
    """Log the columns the spec adds to the output table (already checked compatible)."""
    fmt, path = pipeline.spec.sink.format, pipeline.sink_path
    found = read(fmt, path) if pipeline.table_format else None
    for change in compatibility.growth(compatibility.expected(pipeline)[0], found) if found else []:
        log.info("%s: the table at %s evolves: %s", pipeline.name, path, change.describe())


READERS: dict[str, type[TableReader]] = {r.format.name: r for r in (DeltaReader, ParquetReader)}


def table_reader(fmt: str) -> type[TableReader]:
    """The class that finds and reads tables of format ``fmt`` (``delta`` or ``parquet``)."""
    return for_format(READERS, fmt)


def table_exists(spark: SparkSession, fmt: str, path: str) -> bool:
    """Has a pipeline committed to the table at ``path`` (its Delta or Parquet log has entries)?"""
    return table_reader(fmt).exists(spark, path)


def table_shape(spark: SparkSession, fmt: str, path: str) -> compatibility.Shape | None:
    """The columns and partitioning of the table at ``path`` (None if it has no data yet)."""
    return table_reader(fmt).shape(spark, path)


def read_table(spark: SparkSession, fmt: str, path: str) -> DataFrame:
    """Read a table a pipeline wrote: its committed rows only."""
    return table_reader(fmt).read(spark, path)
