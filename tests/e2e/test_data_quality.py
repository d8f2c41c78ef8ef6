"""The data-quality DAG and `sluice validate` on a real table: a critical violation fails
both, with the failed expectations and the Data Docs named; warnings are reported only."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.dev.generate import EventGenerator, Record
from sluice.dev.produce import send
from sluice.records.validation import quality_home, read_report
from tests.e2e.test_cli import sluice
from tests.fixtures import make_pipeline, new_topic, run_available_now

pytestmark = pytest.mark.e2e

EXPECTATIONS = {
    "rows": {"known_firmware": {"column": "device_firmware", "in_set": ["1.4.2", "1.5.0", "2.0.1"]}},
    "table": {"one_row_per_device": {"unique": "device_id"}, "known_columns": {"no_unexpected_columns": True}},
}


# A failing validation through the DAG and the CLI; the planted failures themselves are
# checked in tests/integration/test_validation.py.
@pytest.mark.drill
def test_a_critical_violation_fails_the_quality_dag_and_sluice_validate(airflow, broker, spark) -> None:
    topic = new_topic(broker, partitions=1)
    pipeline = make_pipeline(airflow.pipelines, topic, name="dq", expectations=EXPECTATIONS)
    gen, at = EventGenerator(pipeline, seed=11), datetime.now(UTC) - timedelta(minutes=1)
    events = []
    for i in range(40):
        e = gen.good()
        e["timestamp"] = int(at.timestamp())  # one date partition
        e["device"].update(id=f"dev-{i:04d}", firmware="9.9.9" if i in (5, 6, 7) else "1.5.0")
        events.append(e)
    events += [events[0], events[1]]  # two devices twice: the critical table rule fails
    send(broker.bootstrap, topic, [Record(json.dumps(e).encode(), "good", None, e) for e in events])
    run_available_now(spark, pipeline)
    day = at.date().isoformat()

    # Default parameters, as when the table's asset triggers it: the newest partition.
    run = airflow.dags_test("sluice_dq_quality")
    assert run.state == "failed", run.log[-4000:]
    assert f"dq: validation FAILED: 3 expectations on partitions {day} (42 rows); 1 critical failed, 1 warning" in (
        run.log
    )
    assert f"CRITICAL one_row_per_device on {day} (expect_column_values_to_be_unique): 4 of 42 rows failed" in run.log
    assert f"warning known_firmware on {day} (expect_column_values_to_be_in_set): 3 of 42 rows failed" in run.log
    docs = Path(run.log.split("Data Docs: file://")[1].split()[0])
    assert docs.name == "index.html" and docs.is_file()
    # The Data Docs render offline: no page loads anything from a CDN, and what they load is there.
    for page in docs.parent.rglob("*.html"):
        html = page.read_text()
        assert not re.search(r'<(script|img)[^>]+src="https?://|<link[^>]+href="https?://', html), page
        for link in re.findall(r'(?:src|href)="([^"#?]+\.(?:js|css))"', html):
            assert (page.parent / link).is_file(), (page, link)
    assert "Traceback" not in run.log.split("validation FAILED")[1], "a critical failure is a verdict, not a crash"

    # The same verdict from the command line, for a chosen date: exit 1 and the table.
    result = sluice("validate", str(pipeline.spec_path), "--date", day, env={"COLUMNS": "80"}, timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # A table per partition, titled with its rows; nothing cut at 80 columns (the summary may run on).
    assert all(len(line) <= 80 for line in result.stdout.splitlines() if "│" in line), result.stdout
    assert "…" not in result.stdout, result.stdout
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert f"sluice.dq: {day} (42 rows)" in lines

    def row(start: str) -> int:
        return next(i for i, x in enumerate(lines) if x.startswith(start))

    # Each expectation by its rule's name, the GX expectation on the line under it.
    unique = row("│ one_row_per_device │ FAIL │ 4 of 42 │")
    assert "│ column_values_to_be_unique │" in lines[unique + 1]
    in_set = row("│ known_firmware │ warning │ 3 of 42 │ 9.9.9")
    assert "│ column_values_to_be_in_set │" in lines[in_set + 1]
    columns = row("│ known_columns │ pass │")
    assert "│ table_columns_to_match_set │" in lines[columns + 1]
    reports = sorted((quality_home() / "reports" / "dq").glob("*.json"))
    assert len(reports) == 2 and [p.date for p in read_report(reports[-1]).partitions] == [day]
