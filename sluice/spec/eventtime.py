"""Event time and the date partition, as Spark SQL built from the spec.

Formats:

- ``iso8601``: ``2021-07-21T10:15:00Z``, with or without seconds, fraction and offset (UTC
  when there is none); a bare year, a bare time or a date alone is not one;
- ``date``: ``2021-07-21``, a calendar date, read as midnight UTC;
- ``epoch_seconds`` / ``epoch_millis`` / ``epoch_micros``: numbers (or numeric strings);
- anything else is a Spark datetime pattern such as ``yyyy-MM-dd HH:mm:ss``.

Every expression yields NULL instead of failing (Spark 4 runs with ANSI mode on, where a
bad cast raises): a NULL event time sends the record to quarantine with the reason.
The date is taken in the spec's timezone; the job runs with the session timezone UTC.

An event time that parses is still refused when it is outside the accepted range
(:class:`Bounds`): Spark reads ``+99999-01-01T00:00:00Z`` as a timestamp, and its date
partition ``date=+99999-01-01`` is one that other readers (delta-rs, pyarrow) cannot open.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sluice.spec.model import duration_seconds
from sluice.spec.schema import Atomic, DataType

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
NAMED_FORMATS = ("iso8601", "date", *EPOCH_FORMATS)
#: An ISO-8601 date and time, as Spark's cast reads it, with at least hours and minutes
#: (a bare year, a bare time or a date alone is not one). A signed year of more than four
#: digits passes here so that it is refused, with its range, as out of range.
ISO_DATE_TIME = (
    r"^[+-]?[0-9]{4,}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.][0-9]{1,9})?)?"
    r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)?$"
)
ISO_DATE = r"^[+-]?[0-9]{4,}-[0-9]{2}-[0-9]{2}$"
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
    # A bare year or a date alone would be midnight, a bare time today's date from the clock:
    # only the pattern's shape is read as a time, so a replayed batch reads it the same.
    if fmt == "iso8601":
        return f"CASE WHEN {expr} RLIKE '{ISO_DATE_TIME}' THEN try_cast({expr} AS TIMESTAMP) END"
    if fmt == "date":
        return f"CASE WHEN {expr} RLIKE '{ISO_DATE}' THEN CAST(try_cast({expr} AS DATE) AS TIMESTAMP) END"
    return f"try_to_timestamp({expr}, '{fmt}')"


def per_batch(sql: str) -> str:
    """``sql`` evaluated by Spark's interpreter rather than compiled into the batch's code.

    A streaming query replaces ``current_timestamp()`` with each batch's own time as a
    literal, and a literal is written into the generated Java: every batch's code then differs
    from the last one's, and Spark compiles it again (about a third of a second per batch of
    10 records; ``tests/integration/test_ingest.py::test_a_batch_shaped_like_the_last_compiles_no_code``
    counts it). A higher-order function is not compiled, so its value reaches the code as a
    reference and the code stays the same from batch to batch. The identity over a
    one-element array is the smallest such wrapper; it yields ``sql``'s value and type."""
    return f"transform(array({sql}), v -> v)[0]"


#: The batch's own time (kept in the offset log, so a replayed batch sees the same), as above.
NOW_SQL = per_batch("current_timestamp()")


def date_sql(ts_expr: str, timezone: str) -> str:
    """The calendar date of a UTC timestamp as seen in ``timezone``."""
    if timezone == "UTC":
        return f"to_date({ts_expr})"
    return f"to_date(from_utc_timestamp({ts_expr}, '{timezone}'))"


# --- the accepted range -------------------------------------------------------------------

#: What every reader can hold, whatever a spec accepts: years 0001 to 9999, a day inside them
#: so that the date in any timezone stays inside them too.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
#: A relative bound further than this from ingestion would overflow Spark's timestamps.
MAX_OFFSET_DAYS = 365_000
_ISO = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?$")


def _micros(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Bound:
    """One end of the accepted range: a moment (UTC), or an offset from the ingestion time."""

    text: str  # as the spec gives it: '1970-01-01' or '1 day'
    at: datetime | None = None
    seconds: float | None = None  # with a sign: negative is before ingestion

    @property
    def relative(self) -> bool:
        return self.at is None

    def sql(self) -> str:
        """A timestamp expression. ``current_timestamp()`` in a streaming query is the batch's
        own time, kept in the offset log, so a replayed batch judges every record the same."""
        if self.at is not None:
            return f"timestamp_micros({_micros(self.at)})"
        return f"timestampadd(MICROSECOND, {round((self.seconds or 0) * 1_000_000)}, {NOW_SQL})"

    def moment(self, ingested_at: datetime) -> datetime:
        return self.at if self.at is not None else ingested_at + timedelta(seconds=self.seconds or 0)

    def describe(self) -> str:
        if self.at is not None:
            return iso(self.at)
        return f"{self.text} {'before' if (self.seconds or 0) < 0 else 'after'} ingestion"


def iso(when: datetime) -> str:
    return when.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"  # strftime drops the zeros of year 0001


def parse_bound(value: str | date, before: bool) -> Bound:
    """A date or date-time (UTC unless it says otherwise), or a duration from ingestion
    (before it for ``not_before``, after it for ``not_after``); ValueError otherwise."""
    if isinstance(value, date):  # YAML reads 1970-01-01 as a date
        at = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
        return _absolute(value.isoformat(), at)
    text = str(value).strip()
    if _ISO.match(text):
        try:
            return _absolute(text, datetime.fromisoformat(text.replace("Z", "+00:00")))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a date: {exc}") from None
    try:
        seconds = duration_seconds(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a date or date-time ('1970-01-01', '2020-01-01T00:00:00Z') nor a duration "
            f"from ingestion ('1 day', '30 days')"
        ) from None
    if seconds > MAX_OFFSET_DAYS * 86400:
        raise ValueError(f"{text!r} is more than {MAX_OFFSET_DAYS} days from ingestion")
    return Bound(text, seconds=-seconds if before else seconds)


def _absolute(text: str, at: datetime) -> Bound:
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if not EARLIEST <= at <= LATEST:
        raise ValueError(f"{text!r} is outside the years 0001 to 9999 that readers can hold")
    return Bound(text, at=at.astimezone(UTC))


@dataclass(frozen=True)
class Bounds:
    """The accepted range of event times; either end may be open (then years 0001..9999 hold)."""

    not_before: Bound | None = None
    not_after: Bound | None = None

    def describe(self) -> str:
        low = self.not_before.describe() if self.not_before else iso(EARLIEST)
        high = self.not_after.describe() if self.not_after else iso(LATEST)
        return f"{low} to {high}"

    def contains(self, when: datetime | None, ingested_at: datetime) -> bool:
        """Would a record with this event time be accepted? (None: beyond year 9999.)"""
        if when is None:
            return False
        low = self.not_before.moment(ingested_at) if self.not_before else EARLIEST
        high = self.not_after.moment(ingested_at) if self.not_after else LATEST
        return low <= when <= high

    def outside_sql(self, ts: str) -> str:
        """True when the timestamp ``ts`` is outside the range (it is never NULL here)."""
        low = self.not_before.sql() if self.not_before else f"timestamp_micros({_micros(EARLIEST)})"
        high = self.not_after.sql() if self.not_after else f"timestamp_micros({_micros(LATEST)})"
        return f"({ts} < {low} OR {ts} > {high})"
