"""Each table format is one unit: what it can do (sluice.spec.formats), how Spark writes it
(jobs.tables.sinks) and reads it (jobs.tables.readers), and how Sluice reads it without Spark
(sluice.records.tables)."""

from __future__ import annotations

from typing import get_args

import pytest

from jobs.tables import readers
from jobs.tables.sinks import SINKS, table_sink
from sluice.records.tables import READERS, table_files
from sluice.spec.formats import DELTA, FORMATS, PARQUET, table_format
from sluice.spec.pipeline import Sink
from sluice.sql.catalog import CatalogTable


def test_every_table_format_the_spec_accepts_has_a_writer_and_a_reader() -> None:
    accepted = set(get_args(Sink.model_fields["format"].annotation))
    assert accepted == {*FORMATS, "kafka"}
    assert set(SINKS) == set(readers.READERS) == set(READERS) == set(FORMATS)
    for name, fmt in FORMATS.items():
        assert table_sink(name).format is fmt and readers.table_reader(name).format is fmt
        assert table_files(name).format is fmt
    assert table_format("kafka") is None


@pytest.mark.parametrize("lookup", [table_sink, readers.table_reader, table_files])
def test_a_topic_is_not_a_table(lookup) -> None:
    with pytest.raises(ValueError, match="kafka is not a table format \\(one of delta, parquet\\)"):
        lookup("kafka")


def test_a_catalog_merges_parquet_schemas_and_reads_deltas_from_its_log() -> None:
    delta, parquet = (CatalogTable("t", f, "/data/t", "c").create() for f in (DELTA, PARQUET))
    assert "USING delta LOCATION" in delta and "mergeSchema" not in delta
    assert "USING parquet OPTIONS (mergeSchema 'true') LOCATION" in parquet
