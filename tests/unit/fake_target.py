"""A Spark target for unit tests of the actions: no JVM, no spark-submit.

Its "stream" is a small Python process whose script is named ``ingest.py``, like the real
job, so the actions find, judge and stop it exactly as they do a real driver: it adopts the
launch's leases and renews them, reports its status as the job does (a heartbeat every
0.1 s), and stops on SIGTERM or a stop request in the run-state store. How it
behaves is chosen per target (``mode``). Bounded jobs are recorded; a validation writes the
report the real job would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sluice.errors import JobFailed
from sluice.ops.submit import Submission
from sluice.spec import Pipeline

DRIVER = r"""
import os, signal, sys, threading, time

from sluice.records.run import Driver, Failures, Status
from sluice import registry
from sluice.spec import load_pipeline
from sluice.state import lease as leases

mode, name = sys.argv[1], sys.argv[2]
pipeline = load_pipeline(sys.argv[sys.argv.index("--spec") + 1], schemas=registry.schema_file)  # as the job
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())
print("fake driver", mode, "WARN something Spark would say", flush=True)
if mode == "exit":
    sys.exit(3)
lease = leases.take(name, leases.claims_for(pipeline), os.environ.get(leases.OWNER_ENV))

def asked():
    driver = Driver.read(name)
    return driver is not None and driver.owner == lease.holder.owner and driver.desired == "stopped"

keeper = leases.Fence(lease, threading.Event() if mode == "ignore-term" else stopping, asked, every=0.1).start()

def report(state, error=None):
    Status(name, state, os.getpid(), time.time(), "local-fake", error=error).save(fence=keeper.lease)

if mode == "fail":
    report("failed", "the table has data but the checkpoint is new")
    sys.exit(3)
if mode == "once":
    report("finished")
    sys.exit(0)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
report("running")
if mode == "crash":  # runs, then fails on the same batch every time, as a fail rule makes it
    time.sleep(0.3)
    cause = "expectation 'card_id_format' failed for 1 of 1 records in batch 2"
    Failures.record(name, 2, cause, fence=keeper.lease)
    report("failed", cause)
    sys.exit(1)
while not stopping.is_set():
    if mode != "hang":
        report("running")
    time.sleep(0.1)
report("stopped")
keeper.close()
leases.release(keeper.lease)
"""


class FakeTarget:
    def __init__(self, folder: Path, mode: str = "run", master: str = "local[4]", cores: int | None = None) -> None:
        self.script = folder / "fake" / "ingest.py"
        self.script.parent.mkdir(parents=True, exist_ok=True)
        self.script.write_text(DRIVER)
        self.mode, self._master, self.cores = mode, master, cores
        self.launched: list[Submission] = []
        self.ran: list[Submission] = []
        self.fail_runs = False

    @property
    def master(self) -> str:
        return self._master

    def app_cores(self, app_id: str) -> int | None:
        return self.cores  # what the master granted, as a test sets it

    def launch_command(self, sub: Submission) -> tuple[list[str], dict[str, str]]:
        self.launched.append(sub)
        name = sub.name.removeprefix("sluice-")
        return [sys.executable, str(self.script), self.mode, name, *sub.application_args], {}

    def run(self, sub: Submission) -> None:
        self.ran.append(sub)
        if self.fail_runs:
            raise JobFailed(f"{sub.name} exited with 1", 1)
        if "--report" in sub.application_args:
            report = Path(sub.application_args[sub.application_args.index("--report") + 1])
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps(REPORT))


REPORT = {
    "pipeline": "p",
    "table": "/t/p",
    "suite": "sluice_p",
    "selection": "latest:1",
    "validated_at": "2026-11-21T10:00:00Z",
    "docs": "/q/index.html",
    "partitions": [{"date": "2026-11-20", "rows": 10, "success": True}],
    "outcomes": [],
}


def no_lag(_: Pipeline) -> dict[str, dict[int, int]]:
    """End offsets for the actions' tests: no lag (the broker is never asked)."""
    return {}
