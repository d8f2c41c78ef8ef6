"""A person's intent wins: a stop recorded while supervision decides to restart the stream is
never undone, in any order of their steps.

Supervision and a stop each run in a thread of their own; at each named fault point
(sluice.faults) a thread waits for its turn, and a seeded scheduler picks which thread goes
next, so each seed is one interleaving, replayed exactly by its number. The "stream" is the
fake driver of fake_target.py: a real process that adopts the launch's lease, reads stop
requests from the run-state store, and stops."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice import faults
from sluice.ops import drivers, stream, supervision
from sluice.records.run import Driver, Status
from sluice.spec import Pipeline
from tests.fixtures import make_pipeline
from tests.unit.fake_target import FakeTarget, no_lag

#: The points where the two threads can interleave: supervision's decision and its launch's
#: record, the stop's read of the record it then writes.
POINTS = ("supervise.decided", "launch.recorded", "stop.read")
SEEDS = int(os.environ.get("SLUICE_INTERLEAVINGS", "20"))


class Interleaving:
    """Runs functions in threads, one at a time between fault points, in a seeded order.

    A thread that does not reach its next point within ``patience`` seconds is waiting on
    something outside (a stop waits for the driver a launch in the other thread starts): the
    next thread is let go beside it, as it would be on another host."""

    def __init__(self, seed: int, patience: float = 2.0) -> None:
        self.rng, self.patience = random.Random(seed), patience
        self.cond = threading.Condition()
        self.names: set[str] = set()
        self.allowed: set[str] = set()  # may run until its next point
        self.waiting: set[str] = set()  # at a point, waiting for its turn
        self.done: set[str] = set()
        self.woken: dict[str, int] = {}  # how often each thread went on from a point
        self.order: list[str] = []  # which thread went at each step

    def at_point(self, _batch: int | None) -> None:
        name = threading.current_thread().name
        if name not in self.names:
            return
        with self.cond:
            self.allowed.discard(name)
            self.waiting.add(name)
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: name in self.allowed, timeout=300), "never given a turn"
            self.waiting.discard(name)
            self.woken[name] = self.woken.get(name, 0) + 1
            self.cond.notify_all()

    def _busy(self) -> bool:
        return bool(self.allowed - self.waiting - self.done)

    def run(self, fns: dict[str, Callable[[], None]]) -> dict[str, BaseException]:
        self.names = set(fns)
        errors: dict[str, BaseException] = {}

        def body(name: str, fn: Callable[[], None]) -> None:
            self.at_point(None)  # every thread begins by waiting for its first turn
            try:
                fn()
            except BaseException as exc:
                errors[name] = exc
            finally:
                with self.cond:
                    self.done.add(name)
                    self.allowed.discard(name)
                    self.cond.notify_all()

        threads = [threading.Thread(target=body, args=item, name=item[0]) for item in fns.items()]
        for t in threads:
            t.start()
        with self.cond:
            self.cond.wait_for(lambda: len(self.waiting) == len(fns), timeout=60)  # all at their first point
            while len(self.done) < len(fns):
                self.cond.wait_for(lambda: not self._busy() or len(self.done) == len(fns), timeout=self.patience)
                ready = sorted(self.waiting - self.allowed)
                if ready:
                    chosen = self.rng.choice(ready)
                    woken = self.woken.get(chosen, 0)
                    self.allowed.add(chosen)
                    self.order.append(chosen)
                    self.cond.notify_all()
                    self.cond.wait_for(lambda c=chosen, w=woken: self.woken.get(c, 0) > w, timeout=60)
        for t in threads:
            t.join(60)
        return errors


def a_stream_that_died(home: Path) -> Pipeline:
    """A stream a person started, whose driver is gone: supervision's verdict is to restart it."""
    pipeline = make_pipeline(home, "events", name="events")
    assert Driver(pipeline.name, 2**22 + 1, ["spark-submit"], "log", time.time() - 60, "a person").save_if_unchanged()
    Status(pipeline.name, "running", 2**22 + 1, time.time() - 30).save()
    return pipeline


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_stop_against_a_supervision_pass_stays_stopped(home: Path, seed: int) -> None:
    pipeline, target = a_stream_that_died(home), FakeTarget(home)
    assert supervision.status(pipeline, no_lag).verdict.action == "restart"
    schedule = Interleaving(seed)
    said: dict[str, object] = {}
    with (
        faults.hook("supervise.decided", schedule.at_point),
        faults.hook("launch.recorded", schedule.at_point),
        faults.hook("stop.read", schedule.at_point),
    ):
        errors = schedule.run(
            {
                "supervise": lambda: said.update(
                    supervised=supervision.supervise(pipeline, target, by="the schedule", offsets=no_lag)
                ),
                "stop": lambda: said.update(stopped=stream.stop(pipeline, by="a person", timeout=60)),
            }
        )
    assert not errors, (schedule.order, errors)
    # Whatever ran, nothing runs once the stop has returned, and it stays so.
    deadline = time.monotonic() + 30
    while drivers.running(pipeline) is not None:
        assert time.monotonic() < deadline, (schedule.order, said, drivers.running(pipeline))
        time.sleep(0.1)
    driver = Driver.read(pipeline.name)
    assert driver is not None and driver.desired == "stopped" and driver.stopped_by == "a person", (
        schedule.order,
        driver,
    )
    again = supervision.supervise(pipeline, target, by="the schedule", offsets=no_lag)
    assert again.started is None and again.status.verdict.action == "none", (schedule.order, again.status.verdict)
