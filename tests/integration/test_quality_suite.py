"""The GX suite compiled from a spec says what the declarations say, expectation by expectation."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from jobs.quality.gx_suite import local_naive, suite, table_columns
from sluice import config
from sluice.spec import load_pipeline

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

DECLARED = {
    "rows": {
        "id_present": {"column": "payment_id", "not_null": True, "action": "fail"},
        "amount_positive": {
            "column": "amount",
            "in_range": {"min": 0.01, "max": 5000, "strict_max": True},
            "action": "drop",
        },
        "card_id_format": {"column": "card_id", "matches": "^card-[0-9]{5}$"},
        "currency_known": {"column": "currency", "in_set": ["EUR", "USD"], "action": "warn"},
        "merchant_named": {"sql": "merchant_id IS NOT NULL OR channel = 'atm'", "action": "drop"},
    },
    "table": {
        "per_date": {"row_count": {"min": 1, "max": 1000}},
        "one_per_payment": {"unique": "payment_id", "severity": "warning"},
        "fresh": {"freshness": "2 hours"},
        "known_columns": {"no_unexpected_columns": True},
    },
}


def test_every_declaration_becomes_its_expectation(tmp_path) -> None:
    spec = yaml.safe_load((config.PROJECT_ROOT / "pipelines" / "payments.yaml").read_text())
    spec["schema"] = str(config.PROJECT_ROOT / "schemas" / "payment" / "v1.json")
    spec["expectations"] = DECLARED
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    pipeline = load_pipeline(path)

    built = suite(pipeline, now=NOW)

    got = sorted(
        (
            (e.expectation_type, e.configuration.kwargs, e.configuration.meta, e.severity.value)
            for e in built.expectations
        ),
        key=lambda x: x[2]["sluice_rule"],
    )
    assert built.name == "sluice.payments"
    assert len(built.expectations) == 9
    assert next(e for e in built.expectations if e.meta["sluice_rule"] == "known_columns").exact_match is True
    assert got == sorted(
        [
            (
                "expect_column_values_to_not_be_null",
                {"column": "payment_id"},
                {"sluice_rule": "id_present", "action": "fail"},
                "critical",
            ),
            (
                "expect_column_values_to_be_between",
                {"column": "amount", "min_value": 0.01, "max_value": 5000.0, "strict_max": True},
                {"sluice_rule": "amount_positive", "action": "drop"},
                "critical",
            ),
            (
                "expect_column_values_to_match_regex",
                {"column": "card_id", "regex": "^card-[0-9]{5}$"},
                {"sluice_rule": "card_id_format", "action": "warn"},
                "warning",
            ),
            (
                "expect_column_values_to_be_in_set",
                {"column": "currency", "value_set": ["EUR", "USD"]},
                {"sluice_rule": "currency_known", "action": "warn"},
                "warning",
            ),
            (
                "unexpected_rows_expectation",
                {
                    "unexpected_rows_query": "SELECT * FROM {batch} WHERE NOT coalesce((merchant_id IS NOT NULL OR channel = 'atm'), false)"
                },
                {"sluice_rule": "merchant_named", "action": "drop"},
                "critical",
            ),
            (
                "expect_table_row_count_to_be_between",
                {"min_value": 1, "max_value": 1000},
                {"sluice_rule": "per_date"},
                "critical",
            ),
            (
                "expect_column_values_to_be_unique",
                {"column": "payment_id"},
                {"sluice_rule": "one_per_payment"},
                "warning",
            ),
            (
                "expect_column_max_to_be_between",
                {"column": "_event_time", "min_value": local_naive(datetime(2026, 11, 21, 10, 0, tzinfo=UTC))},
                {"sluice_rule": "fresh"},
                "critical",
            ),
            (
                "expect_table_columns_to_match_set",
                {"column_set": table_columns(pipeline)},
                {"sluice_rule": "known_columns"},
                "critical",
            ),
        ],
        key=lambda x: x[2]["sluice_rule"],
    )
    assert table_columns(pipeline)[-8:] == [
        "_kafka_topic",
        "_kafka_partition",
        "_kafka_offset",
        "_kafka_timestamp",
        "_event_time",
        "_ingested_at",
        "_rescued",
        "date",
    ]


def test_a_spec_without_expectations_has_an_empty_suite() -> None:
    built = suite(load_pipeline(config.PROJECT_ROOT / "pipelines" / "device_signals.yaml"))
    assert built.name == "sluice.device_signals" and built.expectations == []
