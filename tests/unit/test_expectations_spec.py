"""Expectations declared in a spec: the model, the SQL a row rule becomes, and what is refused."""

from __future__ import annotations

import pytest
import yaml

from sluice import config
from sluice.spec import SpecError, load_pipeline
from sluice.spec.expectations import Expectations, RowRule, describe, failing_sql, sql_literal

PAYMENTS = config.PROJECT_ROOT / "pipelines" / "payments.yaml"


def with_expectations(tmp_path, expectations: dict, **changes) -> str:
    spec = yaml.safe_load(PAYMENTS.read_text())
    spec["schema"] = str(config.PROJECT_ROOT / "schemas" / "payment" / "v1.json")
    spec["expectations"] = expectations
    spec.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize(
    ("rule", "sql"),
    [
        ({"column": "payment_id", "not_null": True}, "`payment_id` IS NULL"),
        ({"column": "amount", "in_range": {"min": 0.01}}, "`amount` IS NOT NULL AND NOT (`amount` >= 0.01)"),
        (
            {"column": "amount", "in_range": {"min": 0, "max": 10000, "strict_min": True}},
            "`amount` IS NOT NULL AND NOT (`amount` > 0.0 AND `amount` <= 10000.0)",
        ),
        (
            {"column": "card_id", "matches": r"^c\d+'s$"},
            r"`card_id` IS NOT NULL AND NOT (`card_id` RLIKE '^c\\d+\'s$')",
        ),
        (
            {"column": "currency", "in_set": ["EUR", "USD", 3]},
            "`currency` IS NOT NULL AND NOT (`currency` IN ('EUR', 'USD', 3))",
        ),
        ({"sql": "amount < 5000 OR channel = 'pos'"}, "NOT coalesce((amount < 5000 OR channel = 'pos'), false)"),
    ],
)
def test_each_row_rule_becomes_a_failing_condition(rule, sql) -> None:
    assert failing_sql(RowRule.model_validate(rule)) == sql


def test_string_literals_survive_sparks_unescaping() -> None:
    assert sql_literal("it's") == r"'it\'s'"
    assert sql_literal(r"a\b") == r"'a\\b'"
    assert (sql_literal(True), sql_literal(2), sql_literal(2.5)) == ("true", "2", "2.5")


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ({"column": "amount"}, "exactly one of not_null, in_range, matches, in_set, sql (found: none)"),
        ({"column": "amount", "not_null": True, "matches": "x"}, "(found: not_null, matches)"),
        ({"not_null": True}, "a not_null rule needs a column"),
        ({"column": "amount", "sql": "amount > 0"}, "drop 'column'"),
        ({"column": "amount", "in_range": {}}, "give min, max or both"),
        ({"column": "amount", "in_range": {"min": 5, "max": 1}}, "min 5.0 is above max 1.0"),
        ({"column": "card_id", "matches": "("}, "is not a regular expression"),
        ({"column": "amount", "not_null": True, "action": "explode"}, "'warn', 'drop' or 'fail'"),
    ],
)
def test_a_malformed_rule_is_refused_with_its_name(tmp_path, rule, words) -> None:
    with pytest.raises(SpecError) as err:
        load_pipeline(with_expectations(tmp_path, {"rows": {"my_rule": rule}}))
    assert "expectations.rows.my_rule" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize(
    ("expectations", "field", "words"),
    [
        ({"rows": {"r": {"column": "amout", "not_null": True}}}, "expectations.rows.r", "no column 'amout'"),
        ({"table": {"t": {"unique": "paymentid"}}}, "expectations.table.t", "no column 'paymentid'"),
        ({"table": {"t": {}}}, "expectations.table.t", "exactly one of row_count, unique"),
        ({"table": {"t": {"freshness": "soon"}}}, "expectations.table.t.freshness", "not a duration"),
        (
            {"rows": {"x": {"column": "amount", "not_null": True}}, "table": {"x": {"unique": "payment_id"}}},
            "expectations",
            "used by a row rule and a table rule: x",
        ),
    ],
)
def test_rules_must_name_real_columns(tmp_path, expectations, field, words) -> None:
    with pytest.raises(SpecError) as err:
        load_pipeline(with_expectations(tmp_path, expectations))
    assert f": {field}:" in str(err.value) and words in str(err.value)


def test_a_continuous_branch_takes_rules_not_expectations(tmp_path) -> None:
    fraud = yaml.safe_load((config.PROJECT_ROOT / "pipelines" / "payments_fraud.yaml").read_text())
    fraud["schema"] = str(config.PROJECT_ROOT / "schemas" / "payment" / "v1.json")
    fraud["expectations"] = {"rows": {"r": {"column": "amount", "not_null": True}}}
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(fraud))
    with pytest.raises(SpecError, match="continuous branch writes no table"):
        load_pipeline(path)


def test_declarations_read_back_by_action() -> None:
    e = Expectations.model_validate(
        {
            "rows": {
                "a": {"column": "x", "not_null": True, "action": "fail"},
                "b": {"column": "y", "in_set": [1, 2], "action": "drop"},
                "c": {"sql": "x > y"},
            },
            "table": {"fresh": {"freshness": "2 hours", "severity": "warning"}},
        }
    )
    assert (e.by_action("fail"), e.by_action("drop"), e.by_action("warn")) == (["a"], ["b"], ["c"])
    assert e.row_columns() == {"a": "x", "b": "y"}
    assert e.table["fresh"].kind == "freshness" and e.rows["b"].kind == "in_set"
    assert describe(e.rows["b"]) == "y in [1, 2]" and describe(e.rows["c"]) == "x > y"


def test_validation_runs_when_the_table_updates_unless_told_otherwise(tmp_path) -> None:
    rows = {"rows": {"has_currency": {"column": "currency", "not_null": True}}}
    default = load_pipeline(with_expectations(tmp_path, rows)).spec.expectations.validation
    assert (default.schedule, default.partitions) == ("table_updated", 1)
    daily = load_pipeline(with_expectations(tmp_path, rows | {"validation": {"schedule": "@daily", "partitions": 3}}))
    assert daily.spec.expectations.validation.schedule == "@daily"
    assert not Expectations().declared and daily.spec.expectations.declared
    for bad, message in (({"schedule": "when new data"}, "not a cron expression"), ({"partitions": 0}, "greater than")):
        with pytest.raises(SpecError, match=f"expectations.validation.*{message}"):
            load_pipeline(with_expectations(tmp_path, rows | {"validation": bad}))


@pytest.mark.parametrize("sql", ["rand() < 0.5", "created_at > current_timestamp() - INTERVAL 1 DAY", "uuid() > 'm'"])
def test_a_drop_rule_must_split_a_batch_the_same_way_each_time_it_is_read(tmp_path, sql) -> None:
    with pytest.raises(SpecError) as err:
        load_pipeline(with_expectations(tmp_path, {"rows": {"fresh": {"sql": sql, "action": "drop"}}}))
    assert "expectations.rows.fresh.sql" in str(err.value) and "is not deterministic" in str(err.value)
    # Counting is all a warn rule does, so a rule of the moment may warn.
    warn = load_pipeline(with_expectations(tmp_path, {"rows": {"fresh": {"sql": sql, "action": "warn"}}}))
    assert warn.spec.expectations.by_action("warn") == ["fresh"]
