"""Event time and the date partition, as Spark SQL built from the spec.

Formats:

- ``iso8601``: ``2021-07-21T10:15:00Z``, with or without offset and fraction;
- ``epoch_seconds`` / ``epoch_millis`` / ``epoch_micros``: numbers (or numeric strings);
- anything else is a Spark datetime pattern such as ``yyyy-MM-dd HH:mm:ss``.

Every expression yields NULL instead of failing (Spark 4 runs with ANSI mode on, where a
bad cast raises): a NULL event time sends the record to quarantine with the reason.
The date is taken in the spec's timezone; the job runs with the session timezone UTC.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sluice.schema import Atomic, DataType

EPOCH_FORMATS = {
    "epoch_seconds": "timestamp_seconds",
    "epoch_millis": "timestamp_millis",
    "epoch_micros": "timestamp_micros",
}
# Bounds that keep timestamp_* inside years 0001..9999 (out-of-range overflows under ANSI).
_EPOCH_BOUNDS = {
    "epoch_seconds": 253402300799,
    "epoch_millis": 253402300799999,
    "epoch_micros": 253402300799999999,
}
NAMED_FORMATS = ("iso8601", *EPOCH_FORMATS)
_PATTERN_LETTERS = set("GyYuUDMLdQqEFaBhKkHmsSnNVzOXxZ'-/:.,T ")


def check_format(fmt: str) -> None:
    """Raise ValueError unless ``fmt`` is a named format or a plausible datetime pattern."""
    if fmt in NAMED_FORMATS:
        return
    if not fmt or not set(fmt) <= _PATTERN_LETTERS | set("[]"):
        raise ValueError(
            f"{fmt!r} is neither one of {', '.join(NAMED_FORMATS)} nor a Spark datetime pattern "
            "(e.g. 'yyyy-MM-dd HH:mm:ss')"
        )


def check_timezone(tz: str) -> None:
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{tz!r} is not an IANA timezone such as 'UTC' or 'Europe/Berlin'") from exc


def check_type(fmt: str, dtype: DataType) -> None:
    """Raise ValueError when the field's type cannot hold that format."""
    name = dtype.name if isinstance(dtype, Atomic) else dtype.sql()
    if fmt in EPOCH_FORMATS:
        if not (isinstance(dtype, Atomic) and (dtype.numeric or name == "string")):
            raise ValueError(f"{fmt} needs a number (or numeric string) field, the schema says {dtype.sql()}")
    elif name not in ("string", "timestamp", "timestamp_ntz", "date"):
        raise ValueError(f"{fmt} needs a string field, the schema says {dtype.sql()}")


def event_time_sql(expr: str, fmt: str, dtype: DataType) -> str:
    """A timestamp expression over ``expr`` (the field), NULL when it does not parse."""
    if isinstance(dtype, Atomic) and dtype.name in ("timestamp", "timestamp_ntz", "date"):
        return f"CAST({expr} AS TIMESTAMP)"
    if fmt in EPOCH_FORMATS:
        value = expr if isinstance(dtype, Atomic) and dtype.numeric else f"try_cast({expr} AS DOUBLE)"
        bound = _EPOCH_BOUNDS[fmt]
        func = EPOCH_FORMATS[fmt]
        # timestamp_seconds takes fractions; millis/micros need whole numbers.
        arg = value if fmt == "epoch_seconds" else f"CAST({value} AS BIGINT)"
        return f"CASE WHEN {value} BETWEEN -{bound} AND {bound} THEN {func}({arg}) END"
    if fmt == "iso8601":
        return f"try_cast({expr} AS TIMESTAMP)"
    return f"try_to_timestamp({expr}, '{fmt}')"


def date_sql(ts_expr: str, timezone: str) -> str:
    """The calendar date of a UTC timestamp as seen in ``timezone``."""
    if timezone == "UTC":
        return f"to_date({ts_expr})"
    return f"to_date(from_utc_timestamp({ts_expr}, '{timezone}'))"
