"""Real public events (GH Archive, Wikimedia EventStreams) replayed through the pipelines.

The samples live in ../shared/data/real/ beside the clone (CI has them); without them
these tests skip and say where they looked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from jobs.tables.readers import read_table, table_shape
from sluice.dev.produce import read_ndjson, send
from sluice.records import audit
from sluice.records.tables import read_shape
from sluice.spec import compatibility
from tests.conftest import ROOT, require_real_data
from tests.fixtures import audit_totals, make_pipeline, new_topic, run_available_now
from tests.rescue_model import undeclared

pytestmark = pytest.mark.integration


def replay_spec(tmp_path, broker, shipped: str, schema: str):
    """The shipped pipeline's settings, on a fresh topic and tables under tmp_path."""
    spec = yaml.safe_load((ROOT / "pipelines" / f"{shipped}.yaml").read_text())
    topic = new_topic(broker, partitions=2, prefix=shipped.replace("_", "-"))
    return topic, make_pipeline(
        tmp_path,
        topic,
        schema=schema,
        event_time=spec["event_time"],
        flatten=spec.get("flatten", {}),
        sink={"format": spec["sink"]["format"]},
    )


def audit_rescued(pipeline) -> int:
    return sum(audit.read(f).records_rescued for f in audit.audit_files([Path(pipeline.audit_path)]))


def assert_nothing_quarantined(spark, pipeline, expected_in: int) -> None:
    # The table is what the spec predicts, as Spark and as delta-rs/pyarrow read it.
    for read in (read_shape, lambda fmt, path: table_shape(spark, fmt, path)):
        compatibility.check(pipeline, read)
    totals = audit_totals(pipeline)
    if totals["records_quarantined"]:
        rows = read_table(spark, pipeline.spec.sink.format, pipeline.quarantine_path).groupBy("reason").count()
        pytest.fail(f"real events were quarantined: { {r['reason']: r['count'] for r in rows.collect()} }")
    assert totals == {"records_in": expected_in, "records_out": expected_in, "records_quarantined": 0}


def test_github_events_flatten_and_explode_with_nothing_quarantined(spark, broker, tmp_path) -> None:
    path = require_real_data("github-events-2021-07-21.ndjson")
    topic, pipeline = replay_spec(tmp_path, broker, "github_events", "github_event/v1.json")
    report = send(broker.bootstrap, topic, read_ndjson(path))
    assert report.sent == 800
    run_available_now(spark, pipeline)

    fmt = pipeline.spec.sink.format
    assert_nothing_quarantined(spark, pipeline, 800)
    table = read_table(spark, fmt, pipeline.sink_path)
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    commits = sum(max(1, len(e["payload"].get("commits") or [])) for e in events)
    assert table.count() == commits  # one row per push commit, one row for every other event
    assert table.select("_kafka_partition", "_kafka_offset").distinct().count() == 800

    pushes = table.where("type = 'PushEvent'")
    sample = next(e for e in events if e["type"] == "PushEvent" and e["payload"]["commits"])
    row = pushes.where(f"commit_sha = '{sample['payload']['commits'][0]['sha']}'").first()
    assert row["actor_login"] == sample["actor"]["login"]
    assert row["repo_name"] == sample["repo"]["name"]
    assert row["payload_push_id"] == sample["payload"]["push_id"]
    assert row["commit_author_name"] == sample["payload"]["commits"][0]["author"]["name"]

    # What the schema does not declare is kept, exactly: every row of an event carries it.
    want = {e["id"]: undeclared(pipeline.schema, e) for e in events}
    got = {r["id"]: r["_rescued"] for r in table.select("id", "_rescued").distinct().collect()}
    assert got.keys() == want.keys()
    assert {k: json.loads(v) if v else {} for k, v in got.items()} == want
    rescued = sum(1 for v in want.values() if v)
    assert audit_rescued(pipeline) == rescued > 0

    pr = next(e for e in events if e["type"] == "PullRequestEvent")
    pr_row = table.where(f"id = '{pr['id']}'").first()
    assert (
        pr_row["payload_pull_request_head_repo_full_name"] == pr["payload"]["pull_request"]["head"]["repo"]["full_name"]
    )
    assert pr_row["payload_pull_request_number"] == pr["payload"]["pull_request"]["number"]
    assert table.where("org_login IS NOT NULL").count() > 0


def test_wikimedia_recent_changes_flatten_with_nothing_quarantined(spark, broker, tmp_path) -> None:
    path = require_real_data("wikimedia-recentchange.ndjson")
    topic, pipeline = replay_spec(tmp_path, broker, "wikimedia_recentchange", "wikimedia_recentchange/v1.ddl")
    report = send(broker.bootstrap, topic, read_ndjson(path))
    run_available_now(spark, pipeline)

    assert_nothing_quarantined(spark, pipeline, 100)
    table = read_table(spark, pipeline.spec.sink.format, pipeline.sink_path)
    assert table.count() == report.sent == 100
    first = json.loads(path.read_text().splitlines()[0])
    row = table.where(f"meta_id = '{first['meta']['id']}'").first()
    assert row["_schema"] == first["$schema"]
    assert row["meta_domain"] == first["meta"]["domain"]
    assert row["length_new"] == first["length"]["new"]
    assert row["revision_old"] == first["revision"]["old"]
    assert str(row["date"]) == "2023-07-29"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    got = {r["meta_id"]: r["_rescued"] for r in table.select("meta_id", "_rescued").collect()}
    assert {k: json.loads(v) if v else {} for k, v in got.items()} == {
        e["meta"]["id"]: undeclared(pipeline.schema, e) for e in events
    }
