"""The lineage Sluice reports: datasets named as OpenLineage says, column lineage that points
at fields the inputs have, events the spec accepts, and a stream run's order of events."""

from __future__ import annotations

import copy
import json
import logging
import random
from typing import Any

import pytest
from openlineage.client.event_v2 import RunEvent
from openlineage.client.serde import Serde

from jobs.stream.lineage import StreamLineage
from sluice import lineage
from sluice.spec import Pipeline, all_pipelines
from tests.lineage_receiver import Invalid, check

RUN_ID = "0190e2a4-7d2e-7cc1-a8a6-0123456789ab"


def as_json(event: RunEvent) -> dict[str, Any]:
    return json.loads(Serde.to_json(event))


def paths(fields: list[dict[str, Any]], prefix: str = "") -> set[str]:
    """Every dotted path of a schema facet's (nested) fields."""
    out: set[str] = set()
    for f in fields:
        out.add(prefix + f["name"])
        out |= paths(f.get("fields") or [], prefix + f["name"] + ".")
    return out


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/data/tables/payments", ("file", "/data/tables/payments")),
        ("file:///data/tables/payments", ("file", "/data/tables/payments")),
        ("s3a://lake/sluice/tables/payments", ("s3://lake", "sluice/tables/payments")),
        ("s3://lake/t", ("s3://lake", "t")),
        ("kafka://k1:9092,k2:9092/payments-verdicts", ("kafka://k1:9092", "payments-verdicts")),
        ("gs://bucket/a/b", ("gs://bucket", "a/b")),
    ],
)
def test_locations_are_named_as_openlineage_names_datasets(location: str, expected: tuple[str, str]) -> None:
    assert lineage.dataset_name(location) == expected


@pytest.mark.parametrize("pipeline", all_pipelines(), ids=lambda p: p.name)
def test_every_shipped_pipeline_reports_valid_events_whose_lineage_points_at_real_fields(pipeline: Pipeline) -> None:
    found = lineage.of(pipeline)
    event = as_json(lineage.event(pipeline, lineage.RunState.FAIL, RUN_ID, found.with_input_rows(7), error="boom"))
    check(event)
    assert event["run"]["facets"]["errorMessage"]["message"] == "boom"
    assert [i["inputFacets"]["inputStatistics"]["rowCount"] for i in event["inputs"]] == [7] * len(event["inputs"])

    readable = {(i["namespace"], i["name"]): paths(i["facets"]["schema"]["fields"]) for i in event["inputs"]}
    out = event["outputs"][0]
    assert (out["namespace"], out["name"]) == lineage.dataset_name(pipeline.sink_path)
    columns = {f["name"] for f in out["facets"]["schema"]["fields"]}
    facet = out["facets"]["columnLineage"]
    assert set(facet["fields"]) <= columns
    for column, how in facet["fields"].items():
        for source in how["inputFields"]:
            assert source["field"] in readable[(source["namespace"], source["name"])], (column, source)
    for source in facet.get("dataset", []):
        assert source["field"] in readable[(source["namespace"], source["name"])], source
        assert source["transformations"][0]["type"] == "INDIRECT"

    if pipeline.spec.sink.format == "kafka":  # a continuous branch's verdicts
        assert {"flagged", "rules", "event_time"} <= set(facet["fields"])
        assert facet["fields"]["flagged"]["inputFields"], "the rules read fields"
    elif not pipeline.derived:  # each flattened column reads the one field the plan says
        assert set(facet["fields"]) == {*pipeline.plan.names, "_event_time", pipeline.spec.date_partition.column}
        for c in pipeline.plan.columns:
            assert {s["field"] for s in facet["fields"][c.name]["inputFields"]} == {c.path}


def test_a_derived_window_reports_keys_aggregates_and_what_shapes_its_rows() -> None:
    pushes = next(p for p in all_pipelines() if p.name == "github_pushes")
    facet = as_json(lineage.event(pushes, lineage.RunState.START, RUN_ID))["outputs"][0]["facets"]["columnLineage"]
    d = pushes.derivation
    assert d.window is not None
    for key in d.group_by:
        assert [(s["field"], s["transformations"][0]["subtype"]) for s in facet["fields"][key]["inputFields"]] == [
            (key, "IDENTITY")
        ]
    for name, sql in d.aggregate.items():
        subtypes = {s["transformations"][0]["subtype"] for s in facet["fields"][name]["inputFields"]}
        assert subtypes <= {"AGGREGATION"}, (name, sql)
    shaping = {(s["field"], s["transformations"][0]["subtype"]) for s in facet["dataset"]}
    assert (d.time, "WINDOW") in shaping and {(g, "GROUP_BY") for g in d.group_by} <= shaping


def test_the_check_refuses_what_the_spec_does_not_allow() -> None:
    """The receiver's check can fail: each mutation of a valid event is refused, by path."""
    pipeline = next(p for p in all_pipelines() if p.name == "device_signals")
    good = as_json(lineage.event(pipeline, lineage.RunState.RUNNING, RUN_ID, lineage.of(pipeline).with_input_rows(3)))
    check(good)

    def broken(change: Any) -> dict[str, Any]:
        event = copy.deepcopy(good)
        change(event)
        return event

    lineage_fields = good["outputs"][0]["facets"]["columnLineage"]["fields"]
    column = next(iter(lineage_fields))
    mutations = {
        "runId": lambda e: e["run"].update(runId="not-a-uuid"),
        "eventTime": lambda e: e.update(eventTime="yesterday"),
        "eventType": lambda e: e.update(eventType="PAUSED"),
        "job.name": lambda e: e["job"].pop("name"),
        "unknown": lambda e: e["run"].update(extra=1),
        "field type": lambda e: e["outputs"][0]["facets"]["columnLineage"]["fields"][column]["inputFields"][0].update(
            field=3
        ),
        "facet base": lambda e: e["outputs"][0]["facets"]["schema"].pop("_producer"),
        "schemaURL": lambda e: e["outputs"][0]["facets"]["schema"].update(_schemaURL="https://example.com/x.json"),
        "rowCount": lambda e: e["inputs"][0]["inputFacets"]["inputStatistics"].update(rowCount="3"),
        "producer": lambda e: e.pop("producer"),
        "producer URI": lambda e: e.update(producer="sluice"),
        "null": lambda e: e.update(outputs=None),
        "misplaced facet": lambda e: e["inputs"][0]["facets"].update(
            inputStatistics=e["inputs"][0]["inputFacets"]["inputStatistics"]
        ),
    }
    for what, change in mutations.items():
        with pytest.raises(Invalid):
            check(broken(change))
        assert what  # named for the failure message above


def test_a_stream_run_starts_reports_while_running_and_ends_once_whatever_it_is_told() -> None:
    """Seeded random sequences of what the status reporter sees: START comes first, RUNNING
    only while running, one terminal event, and nothing after it."""
    pipeline = next(p for p in all_pipelines() if p.name == "payments")
    rng = random.Random(27)
    for _ in range(200):
        sent: list[RunEvent] = []
        run = StreamLineage(pipeline, sent.append, "4.1.1", every_s=0)
        states = rng.choices(
            ["starting", "running", "stopped", "finished", "failed"], [1, 8, 1, 1, 1], k=rng.randint(1, 12)
        )
        for state in states:
            run.observe(
                state, rng.randint(0, 50) if state != "starting" else None, "boom" if state == "failed" else None
            )
            run.queue.join()  # sent: a RUNNING is skipped only while one waits
        run.close()
        kinds = [e.eventType.value for e in sent]
        assert kinds[0] == "START"
        end = next((i for i, s in enumerate(states) if s in ("stopped", "finished", "failed")), None)
        assert kinds.count("RUNNING") == states[: end if end is not None else len(states)].count("running")
        if end is None:
            assert "COMPLETE" not in kinds and "FAIL" not in kinds
        else:
            assert kinds[-1] == ("FAIL" if states[end] == "failed" else "COMPLETE")
            assert kinds.count("COMPLETE") + kinds.count("FAIL") == 1
        assert len({e.run.runId for e in sent}) == 1


def test_a_receiver_that_fails_is_logged_once_and_never_stops_the_stream(caplog) -> None:
    pipeline = next(p for p in all_pipelines() if p.name == "payments")
    answers = iter([ConnectionError("refused"), ConnectionError("refused"), None, None])

    def send(event: RunEvent) -> None:
        error = next(answers)
        if error is not None:
            raise error

    run = StreamLineage(pipeline, send, "4.1.1", every_s=0)
    with caplog.at_level(logging.INFO, logger="sluice.lineage"):
        for state in ("starting", "running", "running", "stopped"):
            run.observe(state, 1)
            run.queue.join()
        run.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "payments: OpenLineage START event not sent: refused",
        "payments: OpenLineage events are received again",
    ]
