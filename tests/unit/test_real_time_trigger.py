"""The one private PySpark use, in jobs/stream/continuous.real_time: Real-Time Mode set through
DataStreamWriter._jwrite because PySpark 4.1's trigger() has no argument for it."""

from __future__ import annotations

import inspect

from pyspark.sql.streaming import DataStreamWriter


def test_pyspark_still_reaches_real_time_mode_only_through_its_private_writer() -> None:
    assert "realTime" not in inspect.signature(DataStreamWriter.trigger).parameters, (
        "PySpark's trigger() now takes realTime=...: use it in jobs/stream/continuous.real_time instead of _jwrite"
    )
    assert "self._jwrite = " in inspect.getsource(DataStreamWriter), (
        "DataStreamWriter no longer keeps its JVM writer in _jwrite: jobs/stream/continuous.real_time must change"
    )
