"""A stream's OpenLineage run: START when the driver starts, RUNNING while it runs, then
COMPLETE (stopped or finished) or FAIL, with the datasets and column lineage of
:mod:`sluice.lineage`.

Off unless OpenLineage is configured the way its clients read it: ``OPENLINEAGE_URL``,
``OPENLINEAGE_CONFIG`` (a YAML file) or ``OPENLINEAGE__TRANSPORT__*`` variables, where the
driver runs. RUNNING is sent every ``SLUICE_LINEAGE_INTERVAL`` seconds (60) while the query
runs, with the records the run has read so far. Events are sent from a daemon thread, so a
slow receiver never delays the heartbeat supervision reads (a RUNNING is skipped while an
earlier event waits), and the driver waits at most 10 s for its last events when it ends. One
that does not answer never stops the stream: the first failure is logged, and the recovery.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import RunEvent, RunState
from openlineage.client.facet_v2 import processing_engine_run, set_producer
from openlineage.client.uuid import generate_new_uuid

from sluice import __version__, lineage
from sluice.spec.pipeline import Pipeline

log = logging.getLogger("sluice.lineage")

DEFAULT_INTERVAL_S = 60.0


def configured() -> bool:
    """Did the user point OpenLineage somewhere? (Its client would print to stdout otherwise.)"""
    env = os.environ
    return (
        bool(
            env.get("OPENLINEAGE_URL")
            or env.get("OPENLINEAGE_CONFIG")
            or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env)
        )
        and env.get("OPENLINEAGE_DISABLED", "").strip().lower() != "true"
    )


def interval() -> float:
    value = os.environ.get("SLUICE_LINEAGE_INTERVAL") or str(DEFAULT_INTERVAL_S)
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"SLUICE_LINEAGE_INTERVAL is {value!r}, not a number of seconds") from None


class StreamLineage:
    """The events of one driver's run of a pipeline (a restart is a new run)."""

    #: How long the driver waits, when it ends, for its last event to go out.
    CLOSE_WAIT_S = 10.0

    def __init__(
        self, pipeline: Pipeline, send: Callable[[RunEvent], None], engine_version: str, every_s: float
    ) -> None:
        self.pipeline, self.send, self.every_s = pipeline, send, every_s
        self.run_id = str(generate_new_uuid())
        self.datasets = lineage.of(pipeline)
        self.engine = processing_engine_run.ProcessingEngineRunFacet(
            version=engine_version, name="spark", openlineageAdapterVersion=__version__
        )
        self.started = self.ended = False
        self.last_running = 0.0
        self.failing = False
        # A daemon thread and a short queue: a receiver that hangs neither delays the status
        # loop nor holds the driver's exit, and RUNNING events do not pile up behind it.
        self.queue: queue.Queue[RunEvent | None] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._drain, name="sluice-lineage", daemon=True)
        self.thread.start()

    @classmethod
    def for_driver(cls, pipeline: Pipeline, engine_version: str) -> StreamLineage | None:
        """The run's events, or None when OpenLineage is not configured here (or its settings
        cannot be used: said in the log, and the stream runs without them)."""
        if not configured():
            return None
        try:
            set_producer(lineage.PRODUCER)  # the facets' _producer: this process sends only Sluice's events
            client = OpenLineageClient()
            return cls(pipeline, client.emit, engine_version, interval())
        except Exception as exc:
            log.warning("%s: OpenLineage events are off: %s", pipeline.name, exc)
            return None

    def observe(self, state: str, rows_read: int | None, error: str | None = None) -> None:
        """What the status reporter saw: ``starting``, ``running`` (each heartbeat), ``stopped``,
        ``finished`` or ``failed``."""
        if self.ended:
            return
        waiting = not self.queue.empty()  # an earlier event still waits for a slow receiver
        if not self.started:
            self._emit(RunState.START)
            self.started = True
        if state == "running":
            if time.monotonic() - self.last_running >= self.every_s and not waiting:
                self.last_running = time.monotonic()
                self._emit(RunState.RUNNING, rows_read)
        elif state in ("stopped", "finished", "failed"):
            self.ended = True
            if state == "failed":
                self._emit(RunState.FAIL, rows_read, error)
            else:
                self._emit(RunState.COMPLETE, rows_read)
            self._put(None)

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Let the last events go out, waiting at most ``timeout`` seconds."""
        if not self.ended:  # else the end is queued already
            self._put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("%s: OpenLineage events still unsent after %.0f s: left behind", self.pipeline.name, timeout)

    def _emit(self, state: RunState, rows_read: int | None = None, error: str | None = None) -> None:
        datasets = self.datasets if rows_read is None else self.datasets.with_input_rows(rows_read)
        event = lineage.event(
            self.pipeline,
            state,
            self.run_id,
            datasets,
            error=error,
            run_facets={"processing_engine": self.engine},
        )
        self._put(event)

    def _put(self, event: RunEvent | None) -> None:
        try:
            self.queue.put(event, timeout=1)
        except queue.Full:
            log.warning("%s: OpenLineage receiver too slow: an event was left behind", self.pipeline.name)

    def _drain(self) -> None:
        while (event := self.queue.get()) is not None:
            self._send(event)
            self.queue.task_done()
        self.queue.task_done()

    def _send(self, event: RunEvent) -> None:
        state = event.eventType.value if event.eventType else "?"
        try:
            self.send(event)
        except Exception as exc:  # a lineage receiver is never a reason to stop a stream
            if not self.failing:
                log.warning("%s: OpenLineage %s event not sent: %s", self.pipeline.name, state, exc)
            self.failing = True
            return
        if self.failing:
            log.info("%s: OpenLineage events are received again", self.pipeline.name)
            self.failing = False
