"""Fault points: named places where a test makes a driver crash or pause, exactly between a
check and the act it guards. Off unless set.

``SLUICE_FAULTS`` says what to do where, comma-separated, each ``<action>@<point>[#<batch>]``:

- ``kill``: SIGKILL this process's group (the Python driver and its JVM), as a crash does;
- ``pause``: SIGSTOP this process's group (the driver and its JVM), as a frozen VM, a long
  GC pause or a slow retry does; it goes on when someone sends the group SIGCONT. (Stopping
  the Python driver alone is not a pause Spark survives: its JVM takes the stopped child for
  gone and shuts down.)

Each fires once per process, at the batch given (any batch without one). A pause is also
noted in ``$SLUICE_HOME/run/faults/<pid>`` ("<point> <batch>"): the driver's log reaches its
file through its JVM, which is paused too. In-process tests may :func:`hook` a function onto
a point instead.

Example::

    SLUICE_FAULTS=pause@parquet.before-commit#2 sluice run payments
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

from sluice import config

log = logging.getLogger("sluice.faults")

ENV = "SLUICE_FAULTS"

#: Every point, and where it is.
POINTS = {
    "batch.written": "a batch's tables and audit are written; Spark has not logged the batch as committed",
    "delta.before-write": "a Delta write's lease was confirmed; its files and its commit are not written yet",
    "parquet.before-commit": "a Parquet batch's files are in the table's folders and the next commit number was "
    "read from the log; the commit is not made",
    "parquet.after-commit": "a Parquet batch's commit is made; the files its other attempts left are not removed",
    "supervise.decided": "supervision read the stream's records and decided to start it; nothing is launched yet",
    "launch.recorded": "a launch recorded its intent (desired: running); its driver is not started yet",
    "stop.read": "a stop read the stream's driver record; it has not recorded the stop yet",
}
ACTIONS = ("kill", "pause")


@dataclass(frozen=True)
class Fault:
    action: str
    point: str
    batch: int | None = None


def paused_at(pid: int) -> tuple[str, int | None] | None:
    """Where the driver ``pid`` of this host paused itself last: its point and batch (None: never)."""
    note = config.sluice_home() / "run" / "faults" / str(pid)
    if not note.exists():
        return None
    point, batch = note.read_text().split()
    return point, None if batch == "None" else int(batch)


def parse(text: str) -> list[Fault]:
    """``SLUICE_FAULTS``'s faults; a ValueError names what is wrong in one."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        action, _, rest = item.partition("@")
        point, _, batch = rest.partition("#")
        if action not in ACTIONS or point not in POINTS or (batch and not batch.isdigit()):
            raise ValueError(
                f"{ENV}: {item!r} is not <action>@<point>[#<batch>] with an action of {', '.join(ACTIONS)} "
                f"and a point of {', '.join(POINTS)}"
            )
        faults.append(Fault(action, point, int(batch) if batch else None))
    return faults


@cache
def _armed(text: str) -> list[Fault]:
    return parse(text)


_fired: set[Fault] = set()
_hooks: dict[str, Callable[[int | None], None]] = {}


def point(name: str, batch: int | None = None) -> None:
    """Here is ``name``: do what ``SLUICE_FAULTS`` (or a test's hook) asks for here, if anything."""
    assert name in POINTS, name
    if name in _hooks:
        _hooks[name](batch)
    text = os.environ.get(ENV)
    if not text:
        return
    for fault in _armed(text):
        if fault.point != name or fault in _fired or fault.batch not in (None, batch):
            continue
        _fired.add(fault)
        where = name if batch is None else f"{name} (batch {batch})"
        if fault.action == "kill":
            log.warning("%s=%s: killing this driver at %s", ENV, text, where)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        log.warning("%s=%s: pausing this driver at %s (SIGCONT to its group resumes it)", ENV, text, where)
        note = config.sluice_home() / "run" / "faults" / str(os.getpid())
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"{name} {batch}\n")
        os.killpg(os.getpgrp(), signal.SIGSTOP)
        log.warning("%s: resumed at %s", ENV, where)


@contextmanager
def hook(name: str, fn: Callable[[int | None], None]) -> Iterator[None]:
    """Call ``fn(batch)`` at point ``name`` in this process while the block runs (a test's)."""
    assert name in POINTS, name
    _hooks[name] = fn
    try:
        yield
    finally:
        _hooks.pop(name, None)
