"""Sluice's own errors: every failure a user can meet, worded for them.

Each class says how a front end reports it, so the CLI and Airflow translate them the same
way without knowing each case: ``exit_code`` for the CLI (2: invalid input or usage, 1: it
was tried and failed), ``transient`` for Airflow (a retry may help, so the task is retried;
otherwise it fails at once), and :class:`NothingToDo` for work that is not an error at all
(the task is skipped, the CLI says so and exits 0).
"""

from __future__ import annotations

import re


class SluiceError(Exception):
    """An expected failure; its message is complete and meant for the user."""

    exit_code = 1
    transient = False


class InvalidInput(SluiceError, ValueError):
    """The request itself is wrong (a spec, a range, an option): nothing was tried."""

    exit_code = 2


class NothingToDo(SluiceError):
    """The request is valid but there is nothing to do (an empty backfill, nothing new to publish)."""

    exit_code = 0


class AlreadyRunning(SluiceError):
    """A start was asked for a stream that runs."""


class IntentChanged(SluiceError):
    """What a person asked for (a stop) was recorded after an action read the record it acted on."""


class StartFailed(SluiceError):
    """The stream was launched but did not report a running query."""

    transient = True


class StopFailed(SluiceError):
    """A driver on another host was asked to stop and has not (it may be hung, or cut off)."""

    transient = True


class JobFailed(SluiceError):
    """A bounded Spark job (backfill, validation) exited with an error."""

    transient = True

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


class StreamUnhealthy(SluiceError):
    """The stream runs but does not keep up: a person has to look."""


def first_line(exc: BaseException) -> str:
    """An exception's message in one line: Spark's and Java's carry their stack after it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


#: How py4j wraps an exception raised in Python code that the JVM called (``foreachBatch``).
_PYTHON_PROXY = "An exception was raised by the Python Proxy. Return Message: "
#: How Spark wraps the error that ended a streaming query.
_QUERY_ENDED = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
#: The exception line that ends a Python traceback: its (qualified) class, then its message.
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: (.+)$")


def root_cause(text: str) -> str:
    """The one line a person needs from a streaming query's error: the message of the
    exception a batch raised, without the bridge's wrapper (py4j's traceback of the Python
    side, Spark's query description and the JVM's stack)."""
    text = text.strip()
    if text.startswith(_PYTHON_PROXY):
        # After the last traceback's indented frames comes the line naming what was raised.
        last = text.rsplit("Traceback (most recent call last):", 1)[-1]
        raised = next((line for line in last.splitlines()[1:] if line and not line[0].isspace()), "")
        found = _RAISED.match(raised)
        text = root_cause(found.group(1)) if found else raised or text.removeprefix(_PYTHON_PROXY)
    line = (text.splitlines() or [""])[0]
    return _QUERY_ENDED.sub("", line).strip()


class BrokerUnreachable(SluiceError):
    """Kafka did not answer."""

    transient = True
