"""Great Expectations on a real output table: the validation reports exactly what was planted.

Device signals go through a real broker and the ingest job into a Delta table with two date
partitions. Row violations are planted under warn rules (so they are kept), plus a rule the
spec gains after the data was written, duplicates of a key and an old, thin partition.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

from jobs.validate import ValidationError, validate
from sluice.dev.generate import EventGenerator, Record
from sluice.dev.produce import send
from sluice.records.validation import Selection
from tests.fixtures import chromium, make_pipeline, new_topic, run_available_now

pytestmark = pytest.mark.integration

RECENT, OLD, DUPLICATED = 120, 6, (0, 1, 2, 7)

WARN_ROWS: dict[str, dict[str, Any]] = {
    "known_firmware": {"column": "device_firmware", "in_set": ["1.4.2", "1.5.0", "2.0.1"]},
    "typed": {"column": "device_type", "not_null": True},
    "weak_signal": {"sql": "signal < -35"},
}
#: Added after the data was written: its violations are in the table, and it is critical.
LATE_RULE = {"battery_percent": {"column": "battery", "in_range": {"min": 0, "max": 100}, "action": "drop"}}
TABLE_KNOWN = {"known_columns": {"no_unexpected_columns": True}}
TABLE = {
    "rows_per_day": {"row_count": {"min": 10}},
    "one_row_per_device": {"unique": "device_id"},
    "fresh": {"freshness": "12 hours", "severity": "warning"},
    **TABLE_KNOWN,
}


def events(gen: EventGenerator, now: datetime) -> list[dict[str, Any]]:
    """Clean events with unique device ids, today's with planted violations, and a few of yesterday."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    base = max(midnight + timedelta(seconds=RECENT + 60), now - timedelta(hours=1))  # all of them on one day
    out = []
    for i in range(RECENT + OLD):
        e = gen.good()
        at = base - timedelta(seconds=i) - (timedelta(days=1) if i >= RECENT else timedelta())
        e["timestamp"], e["battery"], e["signal"] = int(at.timestamp()), 50, -60.0
        e["device"].update(id=f"dev-{i:04d}", type="camera", firmware="1.5.0")
        if i < RECENT:
            if i % 10 == 3:
                e["device"]["firmware"] = "9.9.9"
            if i % 15 == 4:
                e["device"]["type"] = None
            if i % 20 == 5:
                e["battery"] = 140
            if i % 25 == 6:
                e["signal"] = -31.0
        out.append(e)
    return out + [out[i] for i in DUPLICATED]


def test_validation_reports_exactly_the_planted_violations(spark, broker, tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=2)
    pipeline = make_pipeline(tmp_path, topic, expectations={"rows": WARN_ROWS, "table": TABLE})
    now = datetime.now(UTC)
    sent = events(EventGenerator(pipeline, seed=3), now)
    send(broker.bootstrap, topic, [Record(json.dumps(e).encode(), "good", None, e) for e in sent])
    run_available_now(spark, pipeline)

    pipeline = make_pipeline(
        tmp_path, topic, name=pipeline.name, expectations={"rows": WARN_ROWS | LATE_RULE, "table": TABLE}
    )
    today = datetime.fromtimestamp(sent[0]["timestamp"], UTC).date()
    yesterday = today - timedelta(days=1)
    report = validate(spark, pipeline, Selection(start=yesterday, end=today), now=now)

    recent_rows = RECENT + len(DUPLICATED)
    assert [(p.date, p.rows, p.success) for p in report.partitions] == [
        (str(yesterday), OLD, False),
        (str(today), recent_rows, False),
    ]
    failed = {(o.partition, o.rule): (o.severity, o.failed, o.observed) for o in report.outcomes if not o.success}
    assert failed == {
        (str(today), "known_firmware"): ("warning", 12, None),
        (str(today), "typed"): ("warning", 8, None),
        (str(today), "weak_signal"): ("warning", 5, None),
        (str(today), "battery_percent"): ("critical", 6, None),
        (str(today), "one_row_per_device"): ("critical", 2 * len(DUPLICATED), None),
        (str(yesterday), "rows_per_day"): ("critical", None, str(OLD)),
        (str(yesterday), "fresh"): ("warning", None, failed[(str(yesterday), "fresh")][2]),
    }
    # Everything else passed, on both days, with nothing GX could not evaluate.
    assert len(report.outcomes) == 2 * 8 and not any(o.error for o in report.outcomes)
    assert {o.rule for o in report.outcomes if o.success and o.partition == str(today)} == {
        "rows_per_day",
        "fresh",
        "known_columns",
    }
    checked = {o.rule: o.checked for o in report.outcomes if o.partition == str(today) and o.checked is not None}
    assert set(checked.values()) == {recent_rows}
    assert {o.rule for o in report.critical_failures} == {"battery_percent", "one_row_per_device", "rows_per_day"}
    assert not report.passed
    assert "140" in next(o for o in report.outcomes if o.rule == "battery_percent" and not o.success).examples

    # The Data Docs a person opens: the index, and a page per validated partition.
    assert local_file(report.docs).name == "index.html"
    for p in report.partitions:
        assert p.docs and pipeline.name in p.docs and local_file(p.docs).is_file(), p
    works_offline(local_file(report.docs), local_file(report.partitions[0].docs))


def works_offline(*pages: Path) -> None:
    """Each page in Chromium from file:// with the network cut: its scripts load and run
    (Bootstrap's tabs and popovers, bootstrap-table), nothing it loads fails, and every link
    to another page of the site leads to a file that is there."""
    with chromium() as browser:
        for path in pages:
            page = browser.new_page()
            failed: list[str] = []
            errors: list[str] = []
            page.on("requestfailed", lambda r, failed=failed: failed.append(r.url))
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.route(re.compile(r"^https?://"), lambda route: route.abort())  # no network
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            assert not failed, (path, failed)  # a file not there, or a link to the network left in
            assert not errors, (path, errors)
            assert page.evaluate(
                "typeof jQuery === 'function' && typeof jQuery.fn.tab === 'function'"
                " && typeof jQuery.fn.popover === 'function' && typeof jQuery.fn.bootstrapTable === 'function'"
            ), path
            links = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
            local = [u for u in links if u.startswith("file:")]
            assert local, path
            for url in local:
                assert Path(url2pathname(urlparse(url).path)).is_file(), (path, url)
            page.close()


def local_file(url: str) -> Path:
    parsed = urlparse(url)
    path = Path(url2pathname(parsed.path))
    assert parsed.scheme == "file" and path.is_file(), url
    return path


def test_a_missing_table_is_a_clear_error(spark, tmp_path: Path) -> None:
    pipeline = make_pipeline(
        tmp_path, "never-written", expectations={"table": {"known": {"no_unexpected_columns": True}}}
    )
    with pytest.raises(ValidationError, match=r"no delta table at .*never_written yet \(has the pipeline run\?\)"):
        validate(spark, pipeline, Selection(latest=1))


def test_a_parquet_table_validates_the_same_way(spark, broker, tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=1)
    rules = {"rows": WARN_ROWS, "table": {"rows_per_day": {"row_count": {"min": 1}}, **TABLE_KNOWN}}
    pipeline = make_pipeline(tmp_path, topic, expectations=rules, sink={"format": "parquet"})
    gen, at = EventGenerator(pipeline, seed=4), datetime.now(UTC) - timedelta(minutes=5)
    sent = []
    for i in range(30):
        e = gen.good() | {"timestamp": int(at.timestamp()), "signal": -60.0}
        e["device"].update(type="camera", firmware="2.0.1" if i % 10 else "0.0.1")
        sent.append(e)
    send(broker.bootstrap, topic, [Record(json.dumps(e).encode(), "good", None, e) for e in sent])
    run_available_now(spark, pipeline)

    report = validate(spark, pipeline, Selection(latest=1))
    assert [(p.date, p.rows) for p in report.partitions] == [(at.date().isoformat(), 30)]
    assert [(o.rule, o.failed) for o in report.outcomes if not o.success] == [("known_firmware", 3)]
    assert report.passed and not report.critical_failures
    # A warning fails no run: the partition and its Data Docs page say passed, as the task does.
    (part,) = report.partitions
    assert part.success
    text = " ".join(re.sub(r"<[^>]+>", " ", local_file(part.docs).read_text()).split())
    assert "Status: Succeeded" in text and "Unsuccessful Expectations 1" in text, part.docs
