from __future__ import annotations

import re

import pytest

from sluice.spec import eventtime
from sluice.spec.schema import Atomic, Struct

LONG, STRING, DOUBLE = Atomic("long"), Atomic("string"), Atomic("double")


def test_epoch_seconds_is_guarded_against_overflow() -> None:
    sql = eventtime.event_time_sql("e.ts", "epoch_seconds", LONG)
    assert sql == "CASE WHEN e.ts BETWEEN -253402300799 AND 253402300799 THEN timestamp_seconds(e.ts) END"


def test_epoch_millis_from_a_string_field_casts_safely() -> None:
    sql = eventtime.event_time_sql("e.ts", "epoch_millis", STRING)
    assert "try_cast(e.ts AS DOUBLE)" in sql
    assert "timestamp_millis(CAST(try_cast(e.ts AS DOUBLE) AS BIGINT))" in sql


def test_iso_and_patterns_never_raise_in_ansi_mode() -> None:
    iso = eventtime.event_time_sql("e.ts", "iso8601", STRING)
    assert iso.startswith("CASE WHEN e.ts RLIKE ") and iso.endswith(" THEN try_cast(e.ts AS TIMESTAMP) END")
    assert eventtime.event_time_sql("e.ts", "yyyy-MM-dd HH:mm", STRING) == "try_to_timestamp(e.ts, 'yyyy-MM-dd HH:mm')"
    assert eventtime.event_time_sql("e.ts", "iso8601", Atomic("timestamp")) == "CAST(e.ts AS TIMESTAMP)"


def test_date_in_a_timezone() -> None:
    assert eventtime.date_sql("ts", "UTC") == "to_date(ts)"
    assert eventtime.date_sql("ts", "Europe/Berlin") == "to_date(from_utc_timestamp(ts, 'Europe/Berlin'))"


@pytest.mark.parametrize("fmt", ["iso8601", "epoch_seconds", "epoch_millis", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"])
def test_known_formats(fmt: str) -> None:
    eventtime.check_format(fmt)


@pytest.mark.parametrize("fmt", ["", "tomorrow", "%Y-%m-%d"])
def test_unknown_formats(fmt: str) -> None:
    with pytest.raises(ValueError, match="neither one of"):
        eventtime.check_format(fmt)


def test_types_must_fit_the_format() -> None:
    eventtime.check_type("epoch_seconds", DOUBLE)
    eventtime.check_type("epoch_seconds", STRING)
    eventtime.check_type("iso8601", STRING)
    with pytest.raises(ValueError, match="needs a string field"):
        eventtime.check_type("iso8601", LONG)
    with pytest.raises(ValueError, match="needs a number"):
        eventtime.check_type("epoch_millis", Struct(()))


def test_timezones() -> None:
    eventtime.check_timezone("America/New_York")
    with pytest.raises(ValueError, match="IANA"):
        eventtime.check_timezone("CEST+2")


@pytest.mark.parametrize(
    ("text", "date_and_time"),
    [
        ("2026-11-20T10:15:00Z", True),
        ("2026-11-20T10:15:00.123456+01:00", True),
        ("2026-11-20 10:15", True),
        ("2026-11-20T10:15:00+0100", True),
        ("+99999-01-01T00:00:00Z", True),  # refused later as out of range, with the range
        ("2021", False),  # Spark's cast: 2021-01-01T00:00Z
        ("10:15:00", False),  # Spark's cast: today, from the clock
        ("2026-11-20", False),  # Spark's cast: midnight
        ("2026-11-20T10", False),
        ("2026-11-20T10:15:00 UTC", False),
    ],
)
def test_an_iso8601_event_time_needs_a_date_and_a_time(text: str, date_and_time: bool) -> None:
    assert bool(re.match(eventtime.ISO_DATE_TIME, text)) is date_and_time
    assert bool(re.match(eventtime.ISO_DATE, text)) is (text == "2026-11-20")


def test_the_date_format_reads_a_date_alone() -> None:
    sql = eventtime.event_time_sql("e.ts", "date", STRING)
    assert sql.endswith("THEN CAST(try_cast(e.ts AS DATE) AS TIMESTAMP) END")
    eventtime.check_format("date")
