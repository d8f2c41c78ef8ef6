"""A spec changed under an existing table is refused before anything is written, by the job
and by `sluice check`, with the column named (Delta used to refuse at the first write with a
stack trace; Parquet wrote files that made the table unreadable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.stream.micro_batch import start
from jobs.tables.readers import read_table, table_shape
from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.records.tables import read_shape
from sluice.spec import compatibility
from tests.conftest import ROOT
from tests.fixtures import make_pipeline, new_topic, run_available_now

pytestmark = pytest.mark.integration


def signal_as_string(tmp_path: Path) -> str:
    schema = json.loads((ROOT / "schemas/device_signal/v1.json").read_text())
    for f in schema["fields"]:
        if f["name"] == "signal":
            f["type"] = "string"  # double -> string
    path = tmp_path / "device_signal_v2.json"
    path.write_text(json.dumps(schema))
    return str(path)


def log_state(pipeline) -> tuple[list[str], list[str]]:
    """What the table's log and the checkpoint's offset log hold: unchanged if nothing was written."""
    table_log = "_delta_log" if pipeline.spec.sink.format == "delta" else "_spark_metadata"
    return (
        sorted(p.name for p in (Path(pipeline.sink_path) / table_log).iterdir()),
        sorted(p.name for p in (Path(pipeline.checkpoint_path) / "offsets").iterdir()),
    )


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_a_changed_type_or_partition_column_is_refused_before_anything_is_written(spark, broker, tmp_path, fmt) -> None:
    topic = new_topic(broker)
    pipeline = make_pipeline(tmp_path, topic, sink={"format": fmt})
    gen = EventGenerator(pipeline, seed=2)
    send(broker.bootstrap, topic, synthetic(gen, 60, 0.1))
    run_available_now(spark, pipeline)
    # Both readers see the shape the spec predicts: the job's (Spark) and sluice check's (delta-rs, pyarrow).
    for read in (read_shape, lambda f, p: table_shape(spark, f, p)):
        compatibility.check(pipeline, read)
    send(broker.bootstrap, topic, synthetic(gen, 20))
    before = log_state(pipeline)

    (tmp_path / "retyped").mkdir()
    (tmp_path / "repartitioned").mkdir()
    same = {
        "name": pipeline.name,
        "sink": {"format": fmt, "path": pipeline.sink_path},
        "checkpoint": pipeline.checkpoint_path,
    }
    retyped = make_pipeline(tmp_path / "retyped", topic, schema=signal_as_string(tmp_path), **same)
    repartitioned = make_pipeline(tmp_path / "repartitioned", topic, date_partition={"column": "day"}, **same)
    for changed, line in (
        (retyped, "  - column signal: the table has double, the spec makes string"),
        (repartitioned, "  - partitioning: the table is partitioned by date, the spec by day"),
    ):
        with pytest.raises(compatibility.IncompatibleTable) as refused:
            start(spark, changed, available_now=True)
        assert line in str(refused.value) and f"the {fmt} table that is already at {pipeline.sink_path}" in str(
            refused.value
        )
        assert log_state(pipeline) == before  # nothing was written, nothing was planned

        checked = subprocess.run(
            [sys.executable, "-m", "sluice.cli", "check", str(changed.spec_path)],
            capture_output=True,
            text=True,
            env=os.environ | {"COLUMNS": "300"},
            timeout=120,
        )
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert line.strip() in checked.stderr and "1 spec(s) do not match their tables" in checked.stderr

    run_available_now(spark, pipeline)  # the unchanged spec goes on where it stopped
    assert (
        read_table(spark, fmt, pipeline.sink_path).count() + read_table(spark, fmt, pipeline.quarantine_path).count()
        == 80
    )
