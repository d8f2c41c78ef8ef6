from __future__ import annotations

import json

import pytest

from sluice.spec.schema import Array, Atomic, Map, SchemaError, Struct, load_schema, parse_ddl, parse_json_schema
from tests.conftest import ROOT


def test_ddl_reads_nested_types_required_fields_and_comments() -> None:
    s = parse_ddl(
        "id BIGINT NOT NULL, `$schema` STRING COMMENT 'uri', "
        "device STRUCT<id: STRING NOT NULL, tags: ARRAY<STRING>, attrs: MAP<STRING, DOUBLE>>, amount DECIMAL(12, 2)"
    )
    assert [f.name for f in s.fields] == ["id", "$schema", "device", "amount"]
    assert s.field("id").required and s.field("id").type == Atomic("long")
    assert s.field("$schema").metadata == {"comment": "uri"}
    device = s.field("device").type
    assert isinstance(device, Struct)
    assert device.field("id").required
    assert device.field("tags").type == Array(Atomic("string"))
    assert device.field("attrs").type == Map(Atomic("string"), Atomic("double"))
    assert s.field("amount").type == Atomic("decimal(12,2)")


def test_json_and_ddl_give_the_same_spark_schema() -> None:
    ddl = parse_ddl("a BIGINT NOT NULL, b STRUCT<c: DOUBLE>")
    js = parse_json_schema(json.dumps(ddl.to_json()))
    assert js == ddl
    assert json.loads(js.to_spark_json())["fields"][0] == {
        "name": "a",
        "type": "long",
        "nullable": False,
        "metadata": {},
    }


def test_generator_hints_do_not_reach_spark() -> None:
    s = load_schema(ROOT / "schemas/device_signal/v1.json")
    spark_json = s.to_spark_json()
    assert "sluice.gen" not in spark_json
    assert "signal strength" in spark_json  # comments stay


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a BIGINT,", "expected 'more'"),
        ("a WIBBLE", "unknown DDL type 'wibble'"),
        ("a STRUCT<b: INT", "expected '>'"),
        ("a INT, A STRING", "differ only in case"),
    ],
)
def test_bad_ddl_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        parse_ddl(text, "x.ddl")


def test_bad_json_schema_names_the_place() -> None:
    with pytest.raises(SchemaError, match=r"s.json.dev: unknown type 'strin'"):
        parse_json_schema('{"type": "struct", "fields": [{"name": "dev", "type": "strin"}]}', "s.json")
    with pytest.raises(SchemaError, match="top level of a schema must be a struct"):
        parse_json_schema('{"type": "array", "elementType": "string"}', "s.json")


def test_load_schema_checks_the_extension(tmp_path) -> None:
    f = tmp_path / "s.avsc"
    f.write_text("{}")
    with pytest.raises(SchemaError, match=r"ends in .json .* or .ddl"):
        load_schema(f)


@pytest.mark.parametrize("path", sorted((ROOT / "schemas").glob("*/*.*")), ids=lambda p: p.parent.name)
def test_every_shipped_schema_loads(path) -> None:
    assert load_schema(path).fields


def test_find_walks_structs_only() -> None:
    s = parse_ddl("a STRUCT<b: STRUCT<c: INT>>, l ARRAY<STRUCT<x: INT>>")
    assert s.find("a.b.c").type == Atomic("integer")  # type: ignore[union-attr]
    assert s.find("a.x") is None
    assert s.find("l.x") is None
