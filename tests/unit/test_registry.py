"""Schemas from a schema registry, against a local stand-in (tests/registry_standin.py): the
JSON Schema conversion, the cache, an outage, and who may ask the registry."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sluice import registry as adapter
from sluice.spec import Pipeline, SpecError, load_pipeline, registry
from sluice.spec.schema import Array, Atomic, Map, Struct
from tests.registry_standin import RegistryStandIn

ORDER_V1 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["id", "ts"],
    "properties": {
        "id": {"type": "string", "description": "order id"},
        "ts": {"type": "integer"},
        "total": {"type": ["number", "null"]},
        "customer": {"$ref": "#/$defs/customer"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "status": {"enum": ["new", "paid"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "either": {"type": ["string", "integer"]},
    },
    "$defs": {"customer": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}},
}
ORDER_V2 = ORDER_V1 | {"properties": ORDER_V1["properties"] | {"channel": {"type": "string"}}}


def test_json_schema_becomes_a_spark_schema() -> None:
    s = registry.to_struct(ORDER_V1, "orders-value")
    assert [(f.name, f.required) for f in s.fields[:3]] == [("id", True), ("ts", True), ("total", False)]
    assert s.field("id").metadata == {"comment": "order id"} and s.field("ts").type == Atomic("long")
    customer = s.field("customer").type
    assert isinstance(customer, Struct) and customer.field("id").required
    assert s.field("items").type == Array(Struct((registry.Field("sku", Atomic("string")),)))
    assert s.field("attrs").type == Map(Atomic("string"), Atomic("long"))
    assert [s.field(n).type for n in ("status", "note", "either")] == [Atomic("string")] * 3
    with pytest.raises(registry.RegistryError, match="refers to itself"):
        registry.to_struct({"type": "object", "properties": {"a": {"$ref": "#"}}}, "loop")
    with pytest.raises(registry.RegistryError, match="top level must be an object"):
        registry.to_struct({"type": "array"}, "arr")


@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    server = RegistryStandIn()
    yield server
    server.stop()


def spec(home: Path, url: str, version: object = "latest", subject: str = "orders-value") -> Path:
    data = {
        "name": "orders",
        "source": {"topics": ["orders"]},
        "schema": {"registry": url, "subject": subject, "version": version},
        "event_time": {"field": "ts", "format": "epoch_seconds"},
        "sink": {"path": "tables/orders"},
        "checkpoint": "checkpoints/orders",
    }
    path = home / "orders.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(path: Path) -> Pipeline:
    """As the commands and the job load a spec."""
    return load_pipeline(path, schemas=adapter.schema_file)


def test_latest_is_fetched_cached_and_survives_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standin: RegistryStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    monkeypatch.setenv("SLUICE_REGISTRY_TTL", "3600.0")
    standin.register("orders-value", ORDER_V1)
    p = load(spec(tmp_path, standin.url))
    assert p.schema_file.relative_to(tmp_path / "schema_cache").parts[1:] == ("orders-value", "v1.json")
    assert p.schema.find("customer.id") is not None and "customer_id" in p.plan.names
    asked = len(standin.requests)
    load(spec(tmp_path, standin.url))  # within the TTL: the cache, no request
    assert len(standin.requests) == asked

    standin.register("orders-value", ORDER_V2)
    monkeypatch.setenv("SLUICE_REGISTRY_TTL", "0.0")
    assert load(spec(tmp_path, standin.url)).schema_file.name == "v2.json"
    pinned = load(spec(tmp_path, standin.url, version=1))
    assert pinned.schema.find("channel") is None

    standin.stop()
    with caplog.at_level(logging.WARNING, logger="sluice.registry"):
        during = load(spec(tmp_path, standin.url))
    assert during.schema_file.name == "v2.json" and during.schema.find("channel") is not None
    assert "did not answer for orders-value" in caplog.text and "using cached v2" in caplog.text
    assert load(spec(tmp_path, standin.url, version=1)).schema_file.name == "v1.json"  # cached


def test_what_the_registry_refuses_or_cannot_give_is_a_spec_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standin: RegistryStandIn
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    with pytest.raises(SpecError, match="Subject 'orders-value' not found"):
        load(spec(tmp_path, standin.url))
    standin.register("avro-value", '{"type": "record", "name": "x", "fields": []}', kind="AVRO")
    with pytest.raises(SpecError, match="a AVRO schema; Sluice reads JSON Schema subjects"):
        load(spec(tmp_path, standin.url, subject="avro-value"))
    standin.register("orders-value", ORDER_V1)
    with pytest.raises(SpecError, match="Version 7 not found"):
        load(spec(tmp_path, standin.url, version=7))
    standin.stop()
    with pytest.raises(SpecError, match="did not answer for never-value version latest .*it is not cached"):
        load(spec(tmp_path, standin.url, subject="never-value"))
    with pytest.raises(SpecError, match="did not answer for orders-value version 2 .*it is not cached"):
        load(spec(tmp_path, standin.url, version=2))
    with pytest.raises(SpecError, match="schema.subject"):
        load(spec(tmp_path, standin.url, subject=".."))


def test_the_spec_alone_reads_the_cache_and_the_dag_files_ask_only_for_what_they_never_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standin: RegistryStandIn
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    monkeypatch.setenv("SLUICE_REGISTRY_TTL", "0")
    standin.register("orders-value", ORDER_V1)
    with pytest.raises(SpecError, match="has not been fetched on this host; `sluice check` fetches it"):
        load_pipeline(spec(tmp_path, standin.url))  # the spec package opens no connection
    assert standin.requests == []
    first = load_pipeline(spec(tmp_path, standin.url), schemas=adapter.first_time)
    assert first.schema_file.name == "v1.json" and len(standin.requests) > 0

    standin.register("orders-value", ORDER_V2)
    asked = len(standin.requests)
    # Cached, however old: the DAG files and the spec alone do not ask again...
    assert load_pipeline(spec(tmp_path, standin.url), schemas=adapter.first_time).schema_file.name == "v1.json"
    assert load_pipeline(spec(tmp_path, standin.url)).schema_file.name == "v1.json"
    assert len(standin.requests) == asked
    # ...the commands and the job do, and then every reader sees what they fetched.
    assert load(spec(tmp_path, standin.url)).schema_file.name == "v2.json"
    assert load_pipeline(spec(tmp_path, standin.url)).schema_file.name == "v2.json"
    assert load_pipeline(spec(tmp_path, standin.url, version=1)).schema_file.name == "v1.json"
