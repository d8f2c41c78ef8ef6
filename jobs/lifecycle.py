"""What every spark-submit driver script sets up first: logging to stderr, and a stop
event that SIGTERM (a stop from `sluice stop` or Airflow) and Ctrl-C set, so the script
finishes its current work and exits cleanly instead of dying mid-way."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def stop_on_signals(log: logging.Logger) -> threading.Event:
    """An event set by the first SIGTERM or SIGINT (logged)."""
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
