"""Sessions per key, over Spark's state store (``transformWithStateInPandas``, event time).

A key's events belong to one session while each follows the one before by less than the
gap (``state.timeout``); events may arrive out of order, so a late-arriving event can join
two open sessions into one. A session is written when the watermark passes its last event
plus the gap: nothing that is not late can join it any more (a row is late when its event
time is at or behind the watermark), so every written session is final.

Output: the key columns, ``session_start`` and ``session_end`` (first and last event) and
``events``. Spark drops late rows before they reach :meth:`Sessions.handleInputRows`; the
job quarantines the same rows (see :mod:`sluice.spec.derived`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from sluice.spec.derived import SESSION_END, SESSION_EVENTS, SESSION_START

Session = tuple[int, int, int]  # first event, last event (epoch ms), events


def merge(sessions: list[Session], gap_ms: int) -> list[Session]:
    """Sessions with every pair closer than the gap joined (sorted by start)."""
    out: list[Session] = []
    for start, end, n in sorted(sessions):
        if out and start < out[-1][1] + gap_ms:
            s, e, m = out[-1]
            out[-1] = (s, max(e, end), m + n)
        else:
            out.append((start, end, n))
    return out


def epoch_ms(series: pd.Series) -> list[int]:
    stamps = pd.to_datetime(series, utc=True)
    return [int(v) for v in (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)]


class Sessions(StatefulProcessor):
    def __init__(self, keys: list[str], time_column: str, gap_ms: int) -> None:
        self.keys, self.time_column, self.gap_ms = keys, time_column, gap_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.open = handle.getListState("sessions", "first long, last long, events long")

    def _read(self) -> list[Session]:
        return [(int(s[0]), int(s[1]), int(s[2])) for s in self.open.get()] if self.open.exists() else []

    def _write(self, sessions: list[Session]) -> None:
        self.open.clear()
        if sessions:
            self.open.put(sessions)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        sessions = self._read()
        for pdf in rows:
            sessions += [(t, t, 1) for t in epoch_ms(pdf[self.time_column])]
        merged = merge(sessions, self.gap_ms)
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        for _, last, _ in merged:
            self.handle.registerTimer(last + self.gap_ms)
        self._write(merged)
        return iter([])

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        sessions = self._read()
        done = [s for s in sessions if s[1] + self.gap_ms <= expiry]
        self._write([s for s in sessions if s[1] + self.gap_ms > expiry])
        if done:
            data: dict[str, Any] = {k: [key[i]] * len(done) for i, k in enumerate(self.keys)}
            data[SESSION_START] = pd.to_datetime([s[0] for s in done], unit="ms", utc=True)
            data[SESSION_END] = pd.to_datetime([s[1] for s in done], unit="ms", utc=True)
            data[SESSION_EVENTS] = [s[2] for s in done]
            yield pd.DataFrame(data)

    def close(self) -> None:
        pass
