"""What a spec writes, and how a change to it compares with a table already written."""

from __future__ import annotations

import json

import pytest

from sluice.spec import compatibility as c
from sluice.spec import load_pipeline


def test_the_shapes_a_spec_writes() -> None:
    out, quarantine = c.expected(load_pipeline("device_signals"))
    assert out.partition_by == quarantine.partition_by == ["date"]
    assert list(out.columns.items())[:3] == [
        ("timestamp", "bigint"),
        ("device_id", "string"),
        ("device_type", "string"),
    ]
    assert out.columns["tags"] == "array<string>" and out.columns["battery"] == "int"
    assert {k: out.columns[k] for k in ("_kafka_partition", "_kafka_offset", "_event_time", "date")} == {
        "_kafka_partition": "int",
        "_kafka_offset": "bigint",
        "_event_time": "timestamp",
        "date": "date",
    }
    assert quarantine.columns["raw_value"] == "binary" and quarantine.columns["reason"] == "string"


def shape(columns: dict[str, str | None], partition_by=("date",)) -> c.Shape:
    return c.Shape(columns, list(partition_by))


def test_an_unchanged_table_has_no_differences_whatever_the_case_of_its_names() -> None:
    want = shape({"amount": "double", "date": "date"})
    assert c.differences(want, shape({"AMOUNT": "double", "date": "date"})) == []
    assert c.differences(want, shape({"amount": "double", "date": None})) == []  # Parquet: type in folder names only


def test_every_change_the_table_cannot_take_is_named_with_its_rule() -> None:
    want = shape({"amount": "string", "merchant": "string", "n": "int", "s": "struct<x:int>", "day": "date"}, ["day"])
    found = shape({"amount": "double", "card": "string", "n": "bigint", "s": "struct<x:int,y:int>", "date": None})
    assert c.differences(want, found) == [
        "partitioning: the table is partitioned by date, the spec by day",
        "column amount: the table has double, the spec makes string (narrowing or changing a type is not "
        "compatible: values already written may not fit the new type)",
        "column n: the table has bigint, the spec makes int (narrowing or changing a type is not compatible: "
        "values already written may not fit the new type)",
        "column s: field s.y: removed (was int): removing a field is not compatible: "
        "the table keeps the column, and records that still carry it would lose it",
        "column card: the table has it (string); the spec no longer makes it (removing a field is not "
        "compatible: the table keeps the column, and records that still carry it would lose it)",
    ]


def test_new_columns_and_nested_fields_are_growth_not_differences() -> None:
    want = shape({"a": "int", "s": "struct<x:int,y:string>", "new": "string", "date": "date"})
    found = shape({"a": "int", "s": "struct<x:int>", "date": None})
    assert c.differences(want, found) == []
    assert [ch.describe() for ch in c.growth(want, found)] == [
        "s.y: added (string): adding a nullable field is compatible",
        "new: added (string): adding a nullable field is compatible",
    ]


def test_a_widened_column_is_refused_with_the_reason() -> None:
    # Delta would need its typeWidening reader feature, which delta-rs cannot open.
    want, found = shape({"a": "bigint", "date": "date"}), shape({"a": "int", "date": None})
    assert c.differences(want, found) == [f"column a: the table has int, the spec makes bigint ({c.WIDENING_REFUSED})"]
    assert c.growth(want, found) == []


def test_shapes_from_spark_schemas_keep_nested_types() -> None:
    schema = {
        "type": "struct",
        "fields": [
            {"name": "n", "type": "long", "nullable": True, "metadata": {}},
            {
                "name": "s",
                "type": {
                    "type": "struct",
                    "fields": [{"name": "x", "type": "integer", "nullable": True, "metadata": {}}],
                },
                "nullable": True,
                "metadata": {},
            },
        ],
    }
    got = c.shape_from_spark_schema(json.dumps(schema), ["date"])
    assert got.columns == {"n": "bigint", "s": "struct<x:int>", "date": None}
    with pytest.raises(ValueError, match="unknown type"):
        c.shape_from_spark_schema('{"type": "struct", "fields": [{"name": "a", "type": "strange"}]}', [])


def test_check_names_the_table_and_the_way_out() -> None:
    p = load_pipeline("device_signals")
    out, _ = c.expected(p)
    changed = dict(out.columns) | {"signal": "string"}

    def read(fmt: str, path: str) -> c.Shape | None:
        return shape(changed) if path == p.sink_path else None

    with pytest.raises(c.IncompatibleTable) as refused:
        c.check(p, read)
    message = str(refused.value)
    assert message.startswith(
        f"device_signals: the spec does not match the delta table that is already at {p.sink_path}"
    )
    assert "  - column signal: the table has string, the spec makes double" in message
    assert "Nothing was written." in message and "set a new sink.path and checkpoint" in message
    assert "sluice backfill" in message
    c.check(p, lambda fmt, path: None)  # no table yet: nothing to compare
