"""PySpark's private parts Sluice uses, each in one place, each checked here so that an upgrade
that changes one fails a test instead of a stream:

- Real-Time Mode set through ``DataStreamWriter._jwrite`` (jobs/stream/continuous.real_time),
  because PySpark 4.1's ``trigger()`` has no argument for it;
- the event log's listener giving Spark its own Java-side object through ``_jlistener``
  (jobs/stream/events.EventLog), which reads each batch's progress as one JSON text."""

from __future__ import annotations

import inspect
import json

from pyspark.sql.streaming import DataStreamWriter, StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, StreamingQueryProgress

from jobs.stream.events import EventLog, _ProgressAsJson, progress_row


def test_pyspark_still_reaches_real_time_mode_only_through_its_private_writer() -> None:
    assert "realTime" not in inspect.signature(DataStreamWriter.trigger).parameters, (
        "PySpark's trigger() now takes realTime=...: use it in jobs/stream/continuous.real_time instead of _jwrite"
    )
    assert "self._jwrite = " in inspect.getsource(DataStreamWriter), (
        "DataStreamWriter no longer keeps its JVM writer in _jwrite: jobs/stream/continuous.real_time must change"
    )


def test_pyspark_still_asks_a_listener_for_its_java_side_through_jlistener() -> None:
    from pyspark.sql.streaming.query import StreamingQueryManager

    assert isinstance(StreamingQueryListener.__dict__.get("_jlistener"), property)
    for method in (StreamingQueryManager.addListener, StreamingQueryManager.removeListener):
        assert "listener._jlistener" in inspect.getsource(method), (
            f"{method.__qualname__} no longer takes the listener's _jlistener: jobs/stream/events.EventLog must change"
        )
    # The Java interface it implements, with the methods PySpark's own wrapper has.
    assert _ProgressAsJson.Java.implements == JStreamingQueryListener.Java.implements
    ours = {m for m in vars(_ProgressAsJson) if m.startswith("on")}
    assert ours == {m for m in vars(JStreamingQueryListener) if m.startswith("on")}
    assert isinstance(EventLog.__dict__["_jlistener"], property)


#: A stateful batch's progress, shaped as Spark's StreamingQueryProgress.json() writes it: what
#: _ProgressAsJson reads (test_event_log_has_each_batch
#: in tests/integration/test_derived.py reads real ones).
PROGRESS = {
    "id": "0b5e7e6a-9f41-4a43-9d4c-8a8b8e8f1c11",
    "runId": "5d8a3c56-1a0e-4a2b-8f6f-0e9d2b7c4a22",
    "name": "gh_pushes",
    "timestamp": "2026-11-29T14:05:01.123Z",
    "batchId": 4,
    "batchDuration": 812,
    "numInputRows": 30,
    "inputRowsPerSecond": 12.5,
    "processedRowsPerSecond": 36.9,
    "durationMs": {"addBatch": 640, "triggerExecution": 812},
    "eventTime": {"watermark": "2026-11-29T13:50:00.000Z"},
    "stateOperators": [
        {
            "operatorName": "stateStoreSave",
            "numRowsTotal": 7,
            "numRowsUpdated": 3,
            "allUpdatesTimeMs": 5,
            "numRowsRemoved": 1,
            "allRemovalsTimeMs": 0,
            "commitTimeMs": 9,
            "memoryUsedBytes": 4096,
            "numRowsDroppedByWatermark": 2,
            "numShufflePartitions": 2,
            "numStateStoreInstances": 2,
            "customMetrics": {"rocksdbBytesCopied": 0},
        }
    ],
    "sources": [
        {
            "description": "DeltaSource[file:/tmp/t]",
            "startOffset": None,
            "endOffset": None,
            "latestOffset": None,
            "numInputRows": 30,
            "inputRowsPerSecond": 12.5,
            "processedRowsPerSecond": 36.9,
            "metrics": {},
        }
    ],
    "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
    "observedMetrics": {"audit": {"records": 30}},
}


def test_a_progress_read_from_its_json_gives_the_event_log_its_row() -> None:
    progress = StreamingQueryProgress.fromJson(json.loads(json.dumps(PROGRESS)))
    row = progress_row("gh_pushes", progress, {})
    assert (row["batch_id"], row["input_rows"], row["state_rows"], row["rows_dropped_by_watermark"]) == (4, 30, 7, 2)
    assert row["duration_ms"] == {"addBatch": 640, "triggerExecution": 812}
    assert row["watermark"] is not None and row["watermark"].minute == 50
    assert json.loads(row["state_operators"])[0]["memory_bytes"] == 4096
