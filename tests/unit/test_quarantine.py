from __future__ import annotations

from sluice.spec import quarantine as q
from sluice.spec.eventtime import Bounds, parse_bound
from sluice.spec.schema import parse_ddl

DEFAULT = Bounds(parse_bound("1970-01-01", before=True), parse_bound("1 day", before=False))


def test_reason_texts() -> None:
    assert q.not_object("array") == "not a JSON object: found array"
    assert q.type_mismatch([q.mismatch_item("a.b", "bigint")]) == "type mismatch: a.b (expected bigint)"
    assert q.missing_required(["id", "device.id"]) == "missing required field: id, device.id"
    assert q.bad_event_time("ts", "x", "iso8601") == "bad event time: ts=x is not iso8601"
    assert q.out_of_range("ts", "+99999-01-01T00:00:00Z", DEFAULT.describe()) == (
        "event time out of range: ts=+99999-01-01T00:00:00Z (accepted 1970-01-01T00:00:00Z to 1 day after ingestion)"
    )


def test_sql_literals_escape_quotes_and_backslashes() -> None:
    assert q.lit("it's") == "'it\\'s'"
    assert q.lit("a\\b") == "'a\\\\b'"


def test_json_paths() -> None:
    assert q.json_path("device.location.lat") == "$.device.location.lat"
    assert q.json_path("$schema") == "$['$schema']"
    assert q.json_path("it's") is None


def test_reason_sql_checks_in_order_and_guards_nested_required_fields() -> None:
    s = parse_ddl("ts BIGINT NOT NULL, device STRUCT<id: STRING NOT NULL>, n INT")
    sql = q.reason_sql(s, "ts", "epoch_seconds", DEFAULT)
    order = [
        sql.index(x)
        for x in (
            q.EMPTY_VALUE,
            q.NOT_UTF8,
            q.BLANK,
            q.MALFORMED,
            "not a JSON object",
            "type mismatch: ",
            "missing required field: ",
            "missing event time: ts",
            "bad event time: ts=",
            "event time out of range: ts=",
        )
    ]
    assert order == sorted(order)
    # device.id is required only when device itself is present.
    assert "CASE WHEN __data.`device`.`id` IS NULL AND __data.`device` IS NOT NULL THEN 'device.id' END" in sql
    assert "CASE WHEN __data.`ts` IS NULL THEN 'ts' END" in sql
    # a value is a type mismatch when the parsed field is NULL but the raw JSON has it.
    assert "get_json_object(__json, '$.n') IS NOT NULL THEN 'n (expected int)'" in sql
