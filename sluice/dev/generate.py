"""Synthetic events for any pipeline, generated from its schema.

Values follow the field types, shaped by optional hints in the schema's field metadata
under ``sluice.gen`` (``choices``, ``range``, ``template`` with ``range``, ``format:
uuid``). Event times are spread over the last ``days`` days so that several date
partitions fill up.

Bad records are mutations of good ones, one kind at a time, and each carries the exact
quarantine reason the pipeline must give it (worded by :mod:`sluice.spec.quarantine`), so a
test can check the quarantine table reason for reason.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.spec import Pipeline, strict
from sluice.spec import quarantine as q
from sluice.spec.schema import Array, Atomic, DataType, Map, Struct

BAD_KINDS = (
    "malformed",
    "not_object",
    "missing_required",
    "type_mismatch",
    "bad_event_time",
    "event_time_out_of_range",
    "not_utf8",
    "tombstone",
    "inexact_value",
    "partial_event_time",
)
#: Stands for a JSON number written as text of its own (json.dumps would reformat it).
_NUMBER = "\u0000number\u0000"


@dataclass(frozen=True)
class Record:
    """One Kafka value to send, with what the pipeline should make of it."""

    value: bytes | None
    kind: str  # "good" or one of BAD_KINDS
    reason: str | None  # the expected quarantine reason; None for a good record
    event: dict[str, Any] | None = None  # the event as sent, for a good record


EPOCH_SCALE = {"epoch_seconds": 1, "epoch_millis": 1000, "epoch_micros": 1_000_000}
_JAVA_TO_STRFTIME = [("yyyy", "%Y"), ("MM", "%m"), ("dd", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S")]


class EventGenerator:
    def __init__(self, pipeline: Pipeline, seed: int = 7, days: int = 3, now: datetime | None = None) -> None:
        self.pipeline = pipeline
        self.rng = random.Random(seed)
        self.days = days
        self.now = now or datetime.now(UTC)
        et = pipeline.event_time
        self.event_field, self.event_format = et.field, et.format
        self.kinds = [k for k in BAD_KINDS if self._applies(k)]

    # --- good events -----------------------------------------------------------------

    def good(self) -> dict[str, Any]:
        event = self._struct(self.pipeline.schema, top=True)
        _set(event, self.event_field, self._event_time())
        return event

    def _event_time(self) -> Any:
        """A time in the last ``days`` days, inside what the pipeline accepts."""
        bounds = self.pipeline.accepted_times
        earliest = self.now - timedelta(days=self.days)
        if bounds.not_before is not None:
            earliest = max(earliest, bounds.not_before.moment(self.now) + timedelta(minutes=1))
        latest = self.now if bounds.not_after is None else min(self.now, bounds.not_after.moment(self.now))
        ts = latest - (latest - earliest) * self.rng.random()
        fmt = self.event_format
        if fmt == "epoch_seconds":
            return int(ts.timestamp())
        if fmt == "epoch_millis":
            return int(ts.timestamp() * 1000)
        if fmt == "epoch_micros":
            return int(ts.timestamp() * 1_000_000)
        if fmt == "iso8601":
            return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
        pattern = fmt
        for java, py in _JAVA_TO_STRFTIME:
            pattern = pattern.replace(java, py)
        if re.search(r"[A-Za-z]", re.sub(r"%[YmdHMS]|T", "", pattern)):
            raise ValueError(f"the generator cannot write event times in the pattern {fmt!r}")
        return ts.strftime(pattern)

    def _struct(self, struct: Struct, top: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in struct.fields:
            if f.nullable and not top and self.rng.random() < 0.05:
                continue  # optional fields are sometimes absent
            out[f.name] = self._value(f.type, f.metadata.get("sluice.gen") or {}, f.name)
        return out

    def _value(self, dtype: DataType, hint: dict[str, Any], name: str) -> Any:
        rng = self.rng
        if isinstance(dtype, Struct):
            return self._struct(dtype)
        if isinstance(dtype, Array):
            return [self._value(dtype.element, hint, name) for _ in range(rng.randint(0, 3))]
        if isinstance(dtype, Map):
            return {f"k{i}": self._value(dtype.value, {}, name) for i in range(rng.randint(0, 2))}
        assert isinstance(dtype, Atomic)
        if "choices" in hint:
            return rng.choice(hint["choices"])
        if hint.get("format") == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        lo, hi = hint.get("range", (0, 1000))
        if "template" in hint:
            return hint["template"].format(rng.randint(int(lo), int(hi)))
        t = dtype.name
        if t in ("long", "integer", "short", "byte"):
            return rng.randint(int(lo), int(hi))
        if t in ("double", "float"):
            return round(rng.uniform(lo, hi), 3)
        if t.startswith("decimal"):
            scale = int(t.rstrip(")").split(",")[1])
            return round(rng.uniform(lo, hi), scale)
        if t == "boolean":
            return rng.random() < 0.5
        if t in ("timestamp", "timestamp_ntz"):
            return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        if t == "date":
            return self.now.strftime("%Y-%m-%d")
        return f"{name}-{rng.randint(0, 9999)}"

    # --- records -----------------------------------------------------------------------

    def record(self, bad_fraction: float = 0.0) -> Record:
        if self.kinds and self.rng.random() < bad_fraction:
            return self.bad(self.rng.choice(self.kinds))
        event = self.good()
        return Record(json.dumps(event).encode(), "good", None, event)

    def bad(self, kind: str) -> Record:
        event = self.good()
        if kind == "tombstone":
            return Record(None, kind, q.EMPTY_VALUE)
        if kind == "malformed":
            text = json.dumps(event)
            return Record(text[: max(1, len(text) // 2)].encode(), kind, q.MALFORMED)
        if kind == "not_object":
            found, value = self.rng.choice(
                [("array", [event]), ("number", 42), ("string", "hello"), ("boolean", True), ("null", None)]
            )
            return Record(json.dumps(value).encode(), kind, q.not_object(found))
        if kind == "missing_required":
            path = self.rng.choice(self._required_paths())
            _delete(event, path)
            return Record(json.dumps(event).encode(), kind, q.missing_required([path]))
        if kind == "type_mismatch":
            path, dtype = self.rng.choice(self._present_leaves(event))
            _set(event, path, "not-a-" + dtype.name)
            return Record(json.dumps(event).encode(), kind, q.type_mismatch([q.mismatch_item(path, dtype.sql())]))
        if kind == "bad_event_time":
            raw: Any = 10**18 if self.event_format.startswith("epoch") else "not-a-time"
            _set(event, self.event_field, raw)
            return Record(
                json.dumps(event).encode(),
                kind,
                q.bad_event_time(self.event_field, str(raw), self.event_format),
            )
        if kind == "event_time_out_of_range":
            raw = self._absurd_time()
            _set(event, self.event_field, raw)
            accepted = self.pipeline.accepted_times.describe()
            return Record(json.dumps(event).encode(), kind, q.out_of_range(self.event_field, str(raw), accepted))
        if kind == "inexact_value":
            return self._inexact(event)
        if kind == "partial_event_time":
            raw = self.rng.choice(["2021", "10:15:00", self.now.strftime("%Y-%m-%d")])
            _set(event, self.event_field, raw)
            return Record(json.dumps(event).encode(), kind, q.bad_event_time(self.event_field, raw, self.event_format))
        if kind == "not_utf8":
            encoded = json.dumps(event).encode()
            return Record(encoded[:-1] + b', "note": "caf\xe9 \xff"}', kind, q.NOT_UTF8)  # Latin-1 bytes, not UTF-8
        raise ValueError(f"unknown bad record kind {kind!r}; known: {', '.join(BAD_KINDS)}")

    def _inexact(self, event: dict[str, Any]) -> Record:
        """A value from_json would take but change (:mod:`sluice.spec.strict`)."""
        path, dtype = self.rng.choice(self._inexact_leaves())
        number = None
        if dtype.name.startswith("decimal"):
            scale = int(dtype.name.rstrip(")").split(",")[1])
            digits = "".join(str(self.rng.randint(0, 9)) for _ in range(scale)) + str(self.rng.randint(1, 9))
            text = f"{self.rng.randint(0, 99)}.{digits}"
            if self.rng.random() < 0.5:
                number, detail = text, strict.too_many_places(text, scale)
            else:
                text = text[:-1] or "0"
                _set(event, path, text)
                detail = strict.not_a(json.dumps(text), "a string", dtype)
        elif dtype.name in ("double", "float"):
            _set(event, path, "NaN")
            detail = strict.not_finite('"NaN"')
        else:
            _set(event, path, {"x": 1})
            detail = strict.not_a('{"x":1}', "an object", dtype)
        if number is not None:
            _set(event, path, _NUMBER)
        value = json.dumps(event).replace(json.dumps(_NUMBER), number or "")
        return Record(value.encode(), "inexact_value", q.type_mismatch([strict.item(path, detail)]))

    def _inexact_leaves(self) -> list[tuple[str, Atomic]]:
        """Leaves outside arrays whose values strict parsing checks, but for the event time and
        the fields the spec lets coerce."""
        skipped = {self.event_field, *self.pipeline.spec.coerce, *self.pipeline.rescue_fields}
        return [
            (path, t)
            for path, _, t, _, _ in q.nodes(self.pipeline.schema)
            if isinstance(t, Atomic)
            and path not in skipped
            and (t.name.startswith("decimal") or t.name in ("double", "float", "string"))
        ]

    def _absurd_time(self) -> Any:
        return self.rng.choice(self._absurd_times())

    def _absurd_times(self) -> list[Any]:
        """Event times that parse but the pipeline does not accept: years 2999, 0001, +99999 (or,
        in an int field, 1901), whichever its bounds refuse (a continuous branch takes 2999)."""
        fmt = self.event_format
        moments: list[datetime | None] = [datetime(2999, 12, 31, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)]
        f = self.pipeline.schema.find(self.event_field)
        int_field = f is not None and isinstance(f.type, Atomic) and f.type.name == "integer"
        if int_field:  # -2**31 fits an int: 1901 in seconds, December 1969 in milliseconds
            moments = [datetime(1970, 1, 1, tzinfo=UTC) - timedelta(seconds=2**31 / EPOCH_SCALE.get(fmt, 1))]
        if fmt == "iso8601":
            moments.append(None)  # +99999-01-01: Spark reads it, no date type elsewhere can
        out: list[Any] = []
        for when in moments:
            if self.pipeline.accepted_times.contains(when, self.now):
                continue
            if when is None:
                out.append("+99999-01-01T00:00:00Z")
            elif fmt in EPOCH_SCALE:
                seconds = int((when - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
                out.append(-(2**31) if int_field else seconds * EPOCH_SCALE[fmt])
            else:
                pattern = "%Y-%m-%dT%H:%M:%SZ" if fmt == "iso8601" else fmt
                for java, py in _JAVA_TO_STRFTIME:
                    pattern = pattern.replace(java, py)
                out.append(when.strftime(pattern.replace("%Y", f"{when.year:04d}")))  # strftime writes year 1 as '1'
        return out

    def _applies(self, kind: str) -> bool:
        if kind == "inexact_value":
            return bool(self._inexact_leaves())
        if kind == "partial_event_time":
            return self.event_format == "iso8601"
        if kind == "missing_required":
            return bool(self._required_paths())
        if kind == "type_mismatch":
            return bool(_typed_leaves(self.pipeline.schema))
        if kind == "bad_event_time":
            f = self.pipeline.schema.find(self.event_field)
            # An epoch in an int field cannot be out of range without also not fitting the type.
            return f is not None and not (isinstance(f.type, Atomic) and f.type.name in ("integer", "short", "byte"))
        if kind == "event_time_out_of_range":
            f = self.pipeline.schema.find(self.event_field)
            # A typed time field would refuse an absurd value as a type mismatch first.
            typed = ("timestamp", "timestamp_ntz", "date", "short", "byte")
            return (
                f is not None
                and not (isinstance(f.type, Atomic) and f.type.name in typed)
                and bool(self._absurd_times())
            )
        return True

    def _required_paths(self) -> list[str]:
        out = []

        def walk(struct: Struct, prefix: str) -> None:
            for f in struct.fields:
                if f.required:
                    path = f"{prefix}{f.name}"
                    out.append(path)
                    if isinstance(f.type, Struct):
                        walk(f.type, path + ".")

        walk(self.pipeline.schema, "")
        return out

    def _present_leaves(self, event: dict[str, Any]) -> list[tuple[str, Atomic]]:
        present = [(p, t) for p, t in _typed_leaves(self.pipeline.schema) if _has(event, p)]
        return present or _typed_leaves(self.pipeline.schema)


def _typed_leaves(struct: Struct, prefix: str = "") -> list[tuple[str, Atomic]]:
    """Numeric and boolean leaves outside arrays: a string there cannot fit them."""
    out = []
    for f in struct.fields:
        path = f"{prefix}{f.name}"
        if isinstance(f.type, Struct):
            out.extend(_typed_leaves(f.type, path + "."))
        elif isinstance(f.type, Atomic) and f.type.name in ("long", "integer", "double", "boolean"):
            out.append((path, f.type))
    return out


def _set(event: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = event
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _has(event: dict[str, Any], dotted: str) -> bool:
    node: Any = event
    for p in dotted.split("."):
        if not isinstance(node, dict) or node.get(p) is None:
            return False
        node = node[p]
    return True


def _delete(event: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    node = event
    for p in parents:
        node = node[p]
    node.pop(last, None)
