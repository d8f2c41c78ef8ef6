from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import pytest

from sluice.dev.generate import BAD_KINDS, EventGenerator
from sluice.spec import load_pipeline
from sluice.spec import quarantine as q

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def signals():
    return load_pipeline("device_signals")


def test_good_events_follow_schema_and_hints(signals) -> None:
    gen = EventGenerator(signals, seed=1, days=2, now=NOW)
    events = [gen.good() for _ in range(300)]
    assert all(e["device"]["id"].startswith("dev-") for e in events)
    assert {e["device"].get("type") for e in events} - {None} <= {
        "thermostat",
        "smoke-detector",
        "door-sensor",
        "camera",
    }
    assert all(-95.0 <= e["signal"] <= -30.0 for e in events)
    times = [e["timestamp"] for e in events]
    assert NOW.timestamp() - 2 * 86400 <= min(times) and max(times) <= NOW.timestamp()


def test_same_seed_same_events(signals) -> None:
    a = EventGenerator(signals, seed=5, now=NOW)
    b = EventGenerator(signals, seed=5, now=NOW)
    assert [a.record(0.3).value for _ in range(50)] == [b.record(0.3).value for _ in range(50)]


def test_bad_fraction_is_respected_and_every_kind_occurs(signals) -> None:
    gen = EventGenerator(signals, seed=3, now=NOW)
    kinds = Counter(gen.record(0.25).kind for _ in range(4000))
    assert 0.22 < 1 - kinds["good"] / 4000 < 0.28
    assert set(kinds) == {"good", *gen.kinds}
    assert set(BAD_KINDS) - set(gen.kinds) == {"partial_event_time"}  # its event time is an epoch


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_each_bad_kind_predicts_its_reason(signals, kind) -> None:
    if kind == "partial_event_time":
        signals = load_pipeline("payments")
    rec = EventGenerator(signals, seed=11, now=NOW).bad(kind)
    assert rec.kind == kind and rec.reason
    if kind == "tombstone":
        assert rec.value is None and rec.reason == q.EMPTY_VALUE
    elif kind == "malformed":
        with pytest.raises(json.JSONDecodeError):
            json.loads(rec.value)
    elif kind == "not_object":
        assert not isinstance(json.loads(rec.value), dict)
    elif kind == "missing_required":
        assert rec.reason.startswith("missing required field: ")
    elif kind == "type_mismatch":
        assert rec.reason.startswith("type mismatch: ") and "(expected " in rec.reason
    elif kind == "bad_event_time":
        assert json.loads(rec.value)["timestamp"] == 10**18
        assert rec.reason == "bad event time: timestamp=1000000000000000000 is not epoch_seconds"
    elif kind == "event_time_out_of_range":
        ts = json.loads(rec.value)["timestamp"]
        assert ts in (32503593600, -62135596800)
        assert rec.reason == (
            f"event time out of range: timestamp={ts} (accepted 1970-01-01T00:00:00Z to 1 day after ingestion)"
        )
    elif kind == "inexact_value":
        assert rec.reason.startswith("type mismatch: ")
        assert any(w in rec.reason for w in ("decimal places", "is a string", "not a finite", "is an object"))
        json.loads(rec.value)
    elif kind == "partial_event_time":
        assert json.loads(rec.value)["created_at"] in ("2021", "10:15:00", "2026-11-20")
        assert rec.reason.startswith("bad event time: created_at=") and rec.reason.endswith(" is not iso8601")
    elif kind == "not_utf8":
        with pytest.raises(UnicodeDecodeError):
            rec.value.decode("utf-8")
        assert rec.reason == q.NOT_UTF8


def test_iso_event_times_for_payments() -> None:
    gen = EventGenerator(load_pipeline("payments"), seed=2, now=NOW)
    event = gen.good()
    assert datetime.fromisoformat(event["created_at"]).tzinfo is not None
    assert event["currency"] in {"EUR", "USD", "GBP", "CHF", "JPY"}
    assert gen.bad("bad_event_time").reason == "bad event time: created_at=not-a-time is not iso8601"
    absurd = gen.bad("event_time_out_of_range")
    assert json.loads(absurd.value)["created_at"] in (
        "2999-12-31T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "+99999-01-01T00:00:00Z",
    )
