"""The run-state store is not a single point of failure for data already flowing: its
PostgreSQL stops while a stream writes, for less than the lease and then for more.

- Shorter than the lease: the stream writes on (the lease is good by the driver's own
  clock, and the storage decides every commit), with no restart.
- Longer: the driver stops writing cleanly (its next batch waits, nothing is committed
  once its lease is out of date) and, when the store is back and nobody took the lease,
  takes it back at the same epoch and writes on. Same driver, no traceback, every record
  once.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from sluice.dev.generate import EventGenerator
from sluice.dev.produce import send, synthetic
from sluice.ops import drivers, processes, stream
from sluice.ops.target import LocalTarget
from tests.fixtures import exactly_once, make_pipeline, new_topic, shared_state, wait_written

pytestmark = pytest.mark.e2e

TTL = 12.0


#: What the driver logs when a batch finds its lease out of date, and when it has it back.
WAITING = "nothing is written until it answers"
RESUMED = "the lease is this driver's again"


class Producer:
    """Sends the generator's records, from the test or a thread of its own, and keeps what
    the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, gen: EventGenerator) -> None:
        self.bootstrap, self.topic, self.gen = bootstrap, topic, gen
        self.sent: set[tuple[str, int, int]] = set()
        self._lock = threading.Lock()

    def send(self, n: int) -> None:
        report = send(self.bootstrap, self.topic, synthetic(self.gen, n, bad_fraction=0.05), keep=True)
        with self._lock:
            self.sent.update((self.topic, d.partition, d.offset) for d in report.delivered)

    def meanwhile(self, seconds: float) -> threading.Thread:
        """Records keep arriving for ``seconds``: 20 a second."""

        def run() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                self.send(10)
                time.sleep(0.5)

        thread = threading.Thread(target=run)
        thread.start()
        return thread


def test_the_store_stopped_for_less_then_for_more_than_the_lease(broker, postgres, tmp_path, monkeypatch, capsys):
    shared_state(postgres, monkeypatch, ttl=TTL)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    topic = new_topic(broker, partitions=2)
    p = make_pipeline(
        tmp_path, topic, source={"max_offsets_per_trigger": 40}, trigger={"processing_time": "500 milliseconds"}
    )
    records = Producer(broker.bootstrap, topic, EventGenerator(p, seed=43))
    started = stream.start(p, LocalTarget("local[2]"), by="drill")
    log = Path(started.driver.log)
    try:
        records.send(200)
        wait_written(p, 200, lambda: processes.log_tail(started.driver.log, 60))
        holder = drivers.running(p)
        assert holder is not None

        # Shorter than the lease: nothing stops.
        arriving = records.meanwhile(8)
        short = postgres.restart(down_for=TTL / 3)
        arriving.join()
        wait_written(p, len(records.sent), lambda: processes.log_tail(started.driver.log, 80))
        after_short = drivers.running(p)
        assert after_short is not None and (after_short.pid, after_short.epoch) == (holder.pid, holder.epoch)

        # Longer than the lease: the driver stops writing, then takes its lease back.
        arriving = records.meanwhile(TTL + 8)
        postgres.stop(remove=False)
        stopped_at = time.monotonic()
        while WAITING not in log.read_text(errors="replace"):  # its next batch found the lease out of date
            assert time.monotonic() - stopped_at < TTL + 120, processes.log_tail(started.driver.log, 80)
            time.sleep(0.5)
        while time.monotonic() - stopped_at < TTL + 4:  # and stays so while the store is away, past the lease
            time.sleep(0.5)
        down = time.monotonic() - stopped_at
        postgres.start()
        arriving.join()
        wait_written(p, len(records.sent), lambda: processes.log_tail(started.driver.log, 80), timeout=180)
        back = drivers.running(p)
        assert back is not None and (back.pid, back.epoch) == (holder.pid, holder.epoch), (holder, back)
    finally:
        if not (postgres.data / "postmaster.pid").exists():
            postgres.start()  # the session's other tests share the server
        said = stream.stop(p, by="drill")
    text = log.read_text(errors="replace")
    result = exactly_once(p, records.sent)
    with capsys.disabled():
        print(
            f"\nstore outage drill: {result}, down {short:.1f}s then {down:.1f}s (lease {TTL:.0f}s), "
            f"same driver and epoch {holder.epoch}; {said}"
        )
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    waited = text[text.index(WAITING) : text.index(RESUMED)]
    assert not re.search(r"batch \d+: .* in ", waited), waited  # no batch ended between the two
    assert "Traceback" not in text, text[-5000:]
