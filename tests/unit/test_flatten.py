from __future__ import annotations

import pytest

from sluice.spec.flatten import METADATA_COLUMNS, FlattenError, plan_flatten
from sluice.spec.schema import Array, Atomic, parse_ddl


def test_nested_structs_join_their_path() -> None:
    s = parse_ddl("device STRUCT<id: STRING, location: STRUCT<lat: DOUBLE, lon: DOUBLE>>, signal DOUBLE")
    plan = plan_flatten(s)
    assert plan.names == ["device_id", "device_location_lat", "device_location_lon", "signal"]
    lat = plan.columns[1]
    assert lat.source == "device.location.lat"
    assert lat.expr == "__data.`device`.`location`.`lat`"


def test_deep_nesting() -> None:
    s = parse_ddl("a STRUCT<b: STRUCT<c: STRUCT<d: STRUCT<e: STRUCT<f: INT>>>>>")
    assert plan_flatten(s).names == ["a_b_c_d_e_f"]


def test_collision_is_an_error_that_names_both_sources() -> None:
    s = parse_ddl("a STRUCT<b_c: INT>, a_b STRUCT<c: INT>")
    with pytest.raises(FlattenError, match=r"'a_b_c' would come from a\.b_c and a_b\.c.*flatten\.rename"):
        plan_flatten(s)


def test_collision_is_case_insensitive_like_spark() -> None:
    s = parse_ddl("a STRUCT<B: INT>, A_b INT")
    with pytest.raises(FlattenError, match="a_b"):
        plan_flatten(s)


def test_collision_with_columns_sluice_adds() -> None:
    s = parse_ddl("_kafka STRUCT<offset: BIGINT>")
    with pytest.raises(FlattenError, match="added by Sluice"):
        plan_flatten(s, reserved=METADATA_COLUMNS)


def test_rename_resolves_a_collision_and_renames_a_prefix() -> None:
    s = parse_ddl("a STRUCT<b_c: INT>, a_b STRUCT<c: INT>, device STRUCT<location: STRUCT<lat: DOUBLE>>")
    plan = plan_flatten(s, rename={"a_b.c": "other", "device.location": "loc"})
    assert plan.names == ["a_b_c", "other", "loc_lat"]


def test_arrays_and_maps_stay_whole_by_default() -> None:
    s = parse_ddl("tags ARRAY<STRING>, items ARRAY<STRUCT<sku: STRING>>, attrs MAP<STRING, STRING>")
    plan = plan_flatten(s)
    assert plan.names == ["tags", "items", "attrs"]
    assert plan.explodes == ()
    assert isinstance(plan.columns[1].type, Array)


def test_explode_flattens_the_element_under_the_array_name() -> None:
    s = parse_ddl("id STRING, payload STRUCT<commits: ARRAY<STRUCT<sha: STRING, author: STRUCT<name: STRING>>>>")
    plan = plan_flatten(s, explode=["payload.commits"])
    assert [e.source for e in plan.explodes] == ["payload.commits"]
    assert plan.explodes[0].expr == "__data.`payload`.`commits`"
    assert plan.names == ["id", "payload_commits_sha", "payload_commits_author_name"]
    assert plan.columns[1].expr == "`__x0`.`sha`"


def test_explode_of_atomic_array_and_chain() -> None:
    s = parse_ddl("orders ARRAY<STRUCT<id: STRING, lines: ARRAY<STRUCT<sku: STRING>>, tags: ARRAY<STRING>>>")
    plan = plan_flatten(s, explode=["orders", "orders.lines"])
    assert plan.names == ["orders_id", "orders_lines_sku", "orders_tags"]
    assert [e.expr for e in plan.explodes] == ["__data.`orders`", "`__x0`.`lines`"]
    only_tags = plan_flatten(parse_ddl("tags ARRAY<STRING>"), explode=["tags"])
    assert only_tags.columns[0].expr == "`__x0`" and only_tags.columns[0].type == Atomic("string")


def test_sibling_explodes_are_refused() -> None:
    s = parse_ddl("a ARRAY<INT>, b ARRAY<INT>")
    with pytest.raises(FlattenError, match="not nested: exploding both would multiply rows"):
        plan_flatten(s, explode=["a", "b"])


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"explode": ["nope"]}, "no field 'nope'"),
        ({"explode": ["s"]}, "only arrays can be exploded"),
        ({"keep": ["n"]}, "only structs can be kept whole"),
        ({"rename": {"n": "bad name"}}, "not a column name"),
        ({"rename": {"x.y": "z"}}, "no field 'x.y'"),
    ],
)
def test_rules_are_checked_against_the_schema(rules: dict, message: str) -> None:
    s = parse_ddl("n INT, s STRUCT<a: INT>")
    with pytest.raises(FlattenError, match=message):
        plan_flatten(s, **rules)


def test_keep_leaves_a_struct_whole_and_unsafe_characters_become_underscores() -> None:
    s = parse_ddl("`$schema` STRING, meta STRUCT<`dt-iso`: STRING>, geo STRUCT<lat: DOUBLE>")
    plan = plan_flatten(s, keep=["geo"])
    assert plan.names == ["_schema", "meta_dt_iso", "geo"]


def test_a_fields_comment_becomes_its_columns_comment() -> None:
    s = parse_ddl("device STRUCT<id: STRING COMMENT 'the device', tags: ARRAY<STRING>>, signal DOUBLE COMMENT 'dBm'")
    plan = plan_flatten(s, explode=["device.tags"])
    assert {c.name: c.comment for c in plan.columns} == {"device_id": "the device", "device_tags": "", "signal": "dBm"}
