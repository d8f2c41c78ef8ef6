"""A custom state processor for the tests (``state: {kind: custom, processor: tests.processors:IdleCount}``).

Per key, it counts events until the key has been idle for the timeout (in event time, after
its newest event), then writes (key, events) and forgets the key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues


class IdleCount(StatefulProcessor):
    timeout_ms = 0  # set by Sluice from the spec's state.timeout

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "events long, newest long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        events, newest = self.count.get() if self.count.exists() else (0, 0)
        for pdf in rows:
            times = pd.to_datetime(pdf["event_time"], utc=True)
            events += len(pdf)
            newest = max(int(newest), int((times.max() - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)))
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(newest + self.timeout_ms)
        self.count.update((events, newest))
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        events, _ = self.count.get()
        self.count.clear()
        yield pd.DataFrame({"actor_login": [key[0]], "events": [int(events)]})

    def close(self) -> None:
        pass
