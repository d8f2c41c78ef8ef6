"""Registering Parquet tables in the catalog as their schema evolves (jobs/sql/catalog.py), on a
real broker, Spark and Parquet sink: a field added inside an array's elements must show."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.sql import catalog
from sluice.dev.generate import Record
from sluice.dev.produce import send
from sluice.sql.catalog import field_paths
from tests.fixtures import make_pipeline, new_topic, run_available_now

pytestmark = pytest.mark.integration


def schema(tmp_path: Path, version: str, tag_fields: list[str]) -> str:
    element = {"type": "struct", "fields": [{"name": f, "type": "string", "nullable": True} for f in tag_fields]}
    path = tmp_path / f"tagged_{version}.json"
    path.write_text(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {"name": "id", "type": "string", "nullable": False},
                    {"name": "timestamp", "type": "long", "nullable": False},
                    {"name": "tags", "type": {"type": "array", "elementType": element, "containsNull": True}},
                ],
            }
        )
    )
    return str(path)


def test_a_nested_field_added_by_a_new_schema_version_shows_in_the_catalog(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    topic = new_topic(broker)
    settings: dict[str, Any] = {"name": "tagged", "sink": {"format": "parquet"}}
    v1 = make_pipeline(tmp_path, topic, schema=schema(tmp_path, "v1", ["k"]), **settings)
    now = int(time.time())

    def events(n: int, start: int, with_v: bool) -> list[Record]:
        out = []
        for i in range(start, start + n):
            tag = {"k": f"k{i}"} | ({"v": f"v{i}"} if with_v else {})
            event = {"id": f"e{i}", "timestamp": now, "tags": [tag]}
            out.append(Record(json.dumps(event).encode(), "good", None, event))
        return out

    send(broker.bootstrap, topic, events(5, 0, with_v=False))
    run_available_now(spark, v1)
    warnings: list[str] = []
    assert "tagged" in catalog.sync(spark, [v1], warnings.append) and not warnings
    assert "tags[].v" not in field_paths(spark.table("sluice.tagged").schema.json())

    v2 = make_pipeline(tmp_path, topic, schema=schema(tmp_path, "v2", ["k", "v"]), **settings)
    send(broker.bootstrap, topic, events(5, 5, with_v=True))
    run_available_now(spark, v2)
    catalog.sync(spark, [v2], warnings.append)
    assert not warnings and "tags[].v" in field_paths(spark.table("sluice.tagged").schema.json())
    rows = spark.sql("SELECT id, tags[0].v AS v FROM sluice.tagged").collect()
    assert sorted((r["id"], r["v"]) for r in rows) == sorted(
        [(f"e{i}", None) for i in range(5)] + [(f"e{i}", f"v{i}") for i in range(5, 10)]
    )
    # Registered once more at most: a second pass finds nothing missing and reads no file.
    before = spark.table("sluice.tagged").schema.json()
    catalog.sync(spark, [v2], warnings.append)
    assert spark.table("sluice.tagged").schema.json() == before
