"""Which partitions a validation checks, and how its report is judged and told."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from sluice.records.validation import Outcome, Partition, Report, Selection, read_report


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", Selection(latest=1)),
        ("latest:3", Selection(latest=3)),
        ("2026-11-20", Selection(start=date(2026, 11, 20), end=date(2026, 11, 20))),
        (" 2026-11-18..2026-11-20 ", Selection(start=date(2026, 11, 18), end=date(2026, 11, 20))),
    ],
)
def test_selections_parse_and_print_back(text: str, expected: Selection) -> None:
    assert Selection.parse(text) == expected
    assert Selection.parse(str(expected)) == expected


def test_a_range_lists_every_day_including_both_ends() -> None:
    days = Selection.parse("2026-02-27..2026-03-01").days()
    assert days == [date(2026, 2, 27), date(2026, 2, 28), date(2026, 3, 1)]
    assert Selection.parse("latest:2").days() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yesterday", "is not 'latest', 'latest:N', a date"),
        ("2026-11-20..", "is not 'latest'"),
        ("2026-11-21..2026-11-20", "starts on 2026-11-21 after it ends on 2026-11-20"),
        ("latest:0", "at least 1"),
    ],
)
def test_bad_selections_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Selection.parse(text)


def outcome(rule: str, severity: str, success: bool, **kw: object) -> Outcome:
    return Outcome(partition="2026-11-20", rule=rule, expectation="expect_x", severity=severity, success=success, **kw)  # type: ignore[arg-type]


def report(*outcomes: Outcome) -> Report:
    return Report(
        pipeline="payments",
        table="/t/payments",
        suite="sluice.payments",
        selection="latest:1",
        validated_at=datetime(2026, 11, 21, tzinfo=UTC),
        docs="file:///q/index.html",
        partitions=[Partition(date="2026-11-20", rows=10, success=all(o.success for o in outcomes))],
        outcomes=list(outcomes),
    )


def test_only_a_failed_critical_expectation_fails_the_report() -> None:
    warned = report(outcome("a", "critical", True), outcome("b", "warning", False, failed=2, checked=10))
    assert warned.passed and [o.rule for o in warned.warnings] == ["b"] and not warned.critical_failures
    failed = report(outcome("a", "critical", False, observed="3"), outcome("b", "warning", False))
    assert not failed.passed and [o.rule for o in failed.critical_failures] == ["a"]


def test_the_summary_names_each_failure_its_evidence_and_the_data_docs() -> None:
    r = report(
        outcome("amount_positive", "critical", False, failed=2, checked=10, examples=["-1.0", "0.0"]),
        outcome("fresh", "warning", False, observed="2026-11-19 10:00:00"),
        outcome("broken", "critical", False, error="no column x"),
        outcome("ok", "critical", True),
    )
    assert r.summary() == [
        "payments: validation FAILED: 4 expectations on partitions 2026-11-20 (10 rows); 2 critical failed, 1 warning",
        "  CRITICAL amount_positive on 2026-11-20 (expect_x): 2 of 10 rows failed; e.g. -1.0, 0.0",
        "  CRITICAL broken on 2026-11-20 (expect_x): error: no column x",
        "  warning fresh on 2026-11-20 (expect_x): observed 2026-11-19 10:00:00",
        "Data Docs: file:///q/index.html",
    ]


def test_a_report_reads_back_as_written(tmp_path) -> None:
    r = report(outcome("a", "critical", False, failed=1, checked=3, examples=["x"]))
    (tmp_path / "r.json").write_text(r.model_dump_json())
    assert read_report(tmp_path / "r.json") == r


def test_the_page_the_airflow_button_opens(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.records.validation import docs_site, site_page

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    site = docs_site()
    page = site / "validations" / "sluice.p" / "date=2026-11-20" / "r.html"
    assert site_page(page.as_uri()) == "validations/sluice.p/date=2026-11-20/r.html"
    assert site_page((tmp_path / "elsewhere.html").as_uri()) is None  # outside the site: no button
    one = report(outcome("r", "critical", True)).model_copy(update={"docs": (site / "index.html").as_uri()})
    one.partitions[0].docs = page.as_uri()
    assert one.page() == "validations/sluice.p/date=2026-11-20/r.html"  # the partition's own page
    two = one.model_copy(update={"partitions": [*one.partitions, Partition(date="2026-11-21", rows=1, success=True)]})
    assert two.page() == "index.html"  # several: the index


def test_on_a_cluster_hosts_share_the_quality_stores_and_the_site(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts validate in turn: each takes the other's store files (never its site pages),
    and hands over what it wrote and what the shared copy lacks; the shared copy ends with both."""
    import os
    import time

    from sluice.records.validation import SITE, pull_stores, push_changed, shared_quality
    from sluice.storage import Location

    home = tmp_path / "one-machine"
    home.mkdir()
    monkeypatch.setenv("SLUICE_HOME", str(home))
    for same in (None, str(home), f"{home}/", f"file://{home}", f"{home}/../one-machine"):
        if same is None:
            monkeypatch.delenv("SLUICE_STORE", raising=False)
        else:
            monkeypatch.setenv("SLUICE_STORE", same)
        assert shared_quality() is None, same  # one machine: the local stores are the only copy
    monkeypatch.setenv("SLUICE_STORE", "s3a://lake/sluice/")
    assert shared_quality() == Location("s3a://lake/sluice/quality")
    monkeypatch.setenv("SLUICE_STORE", str(tmp_path / "store"))
    shared = shared_quality()
    assert shared == Location(str(tmp_path / "store" / "quality"))

    a, b = tmp_path / "a" / "quality", tmp_path / "b" / "quality"

    def write(home, rel: str, text: str, age: float = 0) -> None:
        f = home / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        if age:
            os.utime(f, (time.time() - age, time.time() - age))

    write(a, "expectations/sluice.x.json", '"old suite"', age=3600)  # older, but the shared copy lacks it
    write(a, f"{SITE}/static/vendor/jquery.min.js", "jquery", age=86400)  # an asset keeps its first copy's time
    since = time.time()
    write(a, "validations/sluice.x/run-a.json", '"a\'s result"')
    write(a, f"{SITE}/index.html", "index by a")
    write(a, "reports/x/1.json", "a's report")  # the host's own report stays there
    assert push_changed(a, shared, since) == 4
    assert "reports/x/1.json" not in shared.files()
    assert push_changed(a, shared, time.time() + 60) == 0  # nothing new, nothing missing

    write(b, f"{SITE}/index.html", "b's stale index", age=3600)
    write(Path(shared.uri), "validations/sluice.x/half.json", '{"cut sho')  # a file cut short is left there
    write(Path(shared.uri), "validations/what?.json", "{}")  # a name some filesystems read otherwise
    pulled, refused = pull_stores(shared, b)
    assert (pulled, sorted(refused)) == (2, ["validations/sluice.x/half.json", "validations/what?.json"])
    assert (b / "validations/sluice.x/run-a.json").read_text() == '"a\'s result"'
    assert (b / SITE / "index.html").read_text() == "b's stale index"  # pages are never taken back
    assert pull_stores(shared, b)[0] == 0
    since = time.time()
    write(b, "validations/sluice.x/run-b.json", '"b\'s result"')
    write(b, f"{SITE}/index.html", "index by b, with both")
    assert push_changed(b, shared, since) == 2  # not what it took, nor its stale pages
    assert (shared / "validations/sluice.x/run-a.json").read_text() == '"a\'s result"'
    assert (shared / f"{SITE}/index.html").read_text() == "index by b, with both"
    assert (shared / f"{SITE}/static/vendor/jquery.min.js").read_text() == "jquery"
