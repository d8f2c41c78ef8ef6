"""Random schedules of what users do to a stream, on both sink formats, checked by readers
that are not Spark (delta-rs; pyarrow over the files the Parquet log lists):

- every Kafka record produced is in exactly one of the table and the quarantine table,
  good records in the table and bad ones in quarantine with their exact reason;
- no record is in a table twice;
- records in = rows out + rows quarantined, per batch and over the stream and its backfills.

A schedule draws from: produce (mixed, clean, or only bad records), start, a graceful stop
with a backlog, SIGKILL at a random moment, restart, rename (after a kill, on the same
checkpoint) and backfill (beside the running stream or not). It ends by stopping, draining
what is left, and checking. Each schedule has a seed, printed with its steps; replay one
with ``SLUICE_CHAOS_SEED=<seed>``. CI runs ``SLUICE_CHAOS_SCHEDULES`` (default 1; random
seeds, so each run covers new schedules) of one format the seed draws, or of each format
named in ``SLUICE_CHAOS_FORMATS`` (``delta,parquet``), two schedules at a time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluice.dev.generate import EventGenerator, Record
from sluice.dev.produce import Delivered, send
from sluice.errors import NothingToDo
from sluice.ops import drivers, stream
from sluice.ops.backfill import BackfillError, plan
from sluice.ops.submit import ingest_submission
from sluice.records.checkpoint import read_committed
from sluice.records.run import Driver
from sluice.runtime import submit_env
from sluice.spec import Pipeline
from tests.fixtures import KAFKA_KEYS, all_audit_totals, kafka_keys, make_pipeline, new_topic, read_without_spark

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

SCHEDULES = int(os.environ.get("SLUICE_CHAOS_SCHEDULES", "1"))
BASE_SEED = int(os.environ.get("SLUICE_CHAOS_SEED") or random.randrange(1_000_000))
FORMATS = tuple(
    os.environ.get("SLUICE_CHAOS_FORMATS", "").split(",")
    if os.environ.get("SLUICE_CHAOS_FORMATS")
    else [random.Random(BASE_SEED).choice(["delta", "parquet"])]
)
MAX_STARTS = 3


@dataclass
class Schedule:
    """One random schedule against one topic, pipeline and pair of tables."""

    seed: int
    fmt: str
    folder: Path
    topic: str
    rng: random.Random
    pipeline: Pipeline
    driver: Driver | None = None
    renames: int = 0
    starts_at: str = "earliest"  # 'latest': what comes before the first start is history only a backfill reads
    delivered: list[Delivered] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def note(self, what: str) -> None:
        self.steps.append(what)
        self.counts[what.split()[0]] = self.counts.get(what.split()[0], 0) + 1

    def where(self) -> str:
        return f"schedule seed={self.seed} fmt={self.fmt}: {' -> '.join(self.steps)}"

    @property
    def running(self) -> bool:
        return drivers.driver_process(self.pipeline) is not None

    # --- actions --------------------------------------------------------------------

    def produce(self, count: int | None = None) -> None:
        pattern = self.rng.choice(["mixed", "clean", "only_bad"])
        count = count or self.rng.randint(20, 150)
        gen = EventGenerator(self.pipeline, seed=self.rng.randrange(2**32))
        records: list[Record] = []
        for _ in range(count):
            if pattern == "only_bad":
                records.append(gen.bad(self.rng.choice(gen.kinds)))
            else:
                records.append(gen.record(0.15 if pattern == "mixed" else 0.0))
        self.delivered += send(self.pipeline.spec.source.bootstrap_servers, self.topic, records, keep=True).delivered
        self.note(f"produce {count} {pattern}")

    def start(self) -> None:
        sub = ingest_submission(self.pipeline.spec_path, pipeline_name=self.pipeline.name)
        self.driver = drivers.launch(self.pipeline, sub.command(), submit_env(sub.master), launched_by="chaos")
        drivers.wait_running(self.pipeline, self.driver)
        self.note(f"start as {self.pipeline.name}")

    def stop(self) -> None:
        self.produce(self.rng.randint(150, 300))  # a backlog to stop in the middle of
        said = stream.stop(self.pipeline, by="chaos", timeout=180)
        assert "gracefully" in said, f"{said}\n{self.where()}"
        self.note("stop with a backlog")

    def kill(self) -> None:
        assert self.driver is not None
        time.sleep(self.rng.uniform(0.0, 3.0))
        os.killpg(self.driver.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.running:
            assert time.monotonic() < deadline, f"the killed driver is still there\n{self.where()}"
            time.sleep(0.2)
        self.note("kill")

    def restart(self) -> None:
        stream.stop(self.pipeline, by="chaos", timeout=180)
        self.note("restart")
        self.start()

    def rename(self) -> None:
        """Kill the stream, then start it under a new name on the same checkpoint and tables."""
        if self.running:
            self.kill()
        self.renames += 1
        self.pipeline = self.spec(f"chaos_{self.fmt}_{self.seed}_r{self.renames}")
        self.note("rename")
        self.start()

    def backfill(self, from_offset: int | None = None) -> None:
        if from_offset is None:
            from_offset = self.rng.choice([0, 0, self.rng.randint(0, 60)])
        try:
            bf = plan(self.pipeline, from_offset=from_offset)
        except (BackfillError, NothingToDo) as exc:
            self.note(f"backfill refused ({str(exc).split(':')[0]})")
            return
        sub = ingest_submission(self.pipeline.spec_path, pipeline_name=self.pipeline.name, backfill=bf)
        done = subprocess.run(sub.command(), env=os.environ | submit_env(sub.master), capture_output=True, timeout=600)
        assert done.returncode == 0, f"{done.stdout.decode()[-2000:]}\n{done.stderr.decode()[-4000:]}\n{self.where()}"
        self.note(
            f"backfill {bf.records}{' (part refused)' if bf.refusal() else ''}{' beside the stream' if self.running else ''}"
        )

    def drain(self) -> None:
        """Stop, then read what is left (available-now), so every record has had its turn; a
        stream that started at 'latest' then backfills its history from offset 0."""
        if self.starts_at == "latest" and not self.committed:
            # 'latest' is fixed by the first batch: one must commit before history is behind it.
            if not self.running:
                self.start()
            self.produce(10)
            deadline = time.monotonic() + 300
            while not self.committed:
                assert time.monotonic() < deadline, f"no batch committed\n{self.where()}"
                time.sleep(0.5)
        if self.running:
            stream.stop(self.pipeline, by="chaos", timeout=180)
        sub = ingest_submission(self.pipeline.spec_path, pipeline_name=self.pipeline.name, available_now=True)
        done = subprocess.run(sub.command(), env=os.environ | submit_env(sub.master), capture_output=True, timeout=900)
        assert done.returncode == 0, f"{done.stdout.decode()[-2000:]}\n{done.stderr.decode()[-4000:]}\n{self.where()}"
        self.note("drain")
        if self.starts_at == "latest":
            self.backfill(from_offset=0)

    @property
    def committed(self) -> bool:
        return read_committed(self.pipeline.checkpoint_path).batch_id is not None

    def spec(self, name: str) -> Pipeline:
        return chaos_spec(self.folder, self.topic, self.fmt, name, self.starts_at)

    # --- the schedule ---------------------------------------------------------------

    def run(self, steps: int) -> None:
        self.note(f"starting_offsets {self.starts_at}")
        self.produce()
        for _ in range(steps):
            # Each start costs a JVM (~15 s here): at most MAX_STARTS a schedule keeps CI in budget.
            starts = self.counts.get("start", 0) < MAX_STARTS
            backfill = ["backfill", "backfill"] if self.committed else []
            if self.running:
                action = self.rng.choice(["produce", "stop", "kill", *(["restart", "rename"] * starts), *backfill])
            else:
                action = self.rng.choice(["produce", *(["start", "start", "rename"] * starts), *backfill])
            getattr(self, action)()
        self.drain()

    def check(self) -> dict[str, int]:
        produced = {(self.topic, d.partition, d.offset): d.record for d in self.delivered}
        out = kafka_keys(read_without_spark(self.fmt, self.pipeline.sink_path, KAFKA_KEYS))
        quarantine = read_without_spark(self.fmt, self.pipeline.quarantine_path, [*KAFKA_KEYS, "reason"])
        bad = dict(zip(kafka_keys(quarantine), quarantine.column("reason").to_pylist(), strict=True))
        found = set(out) | set(bad)
        result = {
            "records": len(produced),
            "duplicates": len(out) - len(set(out)) + quarantine.num_rows - len(bad) + len(set(out) & set(bad)),
            "lost": len(produced.keys() - found),
            "unknown": len(found - produced.keys()),
        }
        where = self.where()
        assert result["duplicates"] == result["lost"] == result["unknown"] == 0, f"{result}\n{where}"
        assert set(out) == {k for k, r in produced.items() if r.kind == "good"}, where
        assert bad == {k: r.reason for k, r in produced.items() if r.kind != "good"}, where
        totals = all_audit_totals(self.pipeline)  # each batch reconciles on its own, too
        assert totals == {"records_in": len(produced), "records_out": len(out), "records_quarantined": len(bad)}, where
        return result


def chaos_spec(folder: Path, topic: str, fmt: str, name: str, starts_at: str) -> Pipeline:
    """The schedule's pipeline; renames keep its checkpoint and tables."""
    return make_pipeline(
        folder,
        topic,
        name=name,
        sink={"format": fmt, "path": str(folder / "tables" / "t")},
        checkpoint=str(folder / "checkpoints" / "t"),
        source={"max_offsets_per_trigger": 150, "starting_offsets": starts_at},
        trigger={"processing_time": "200 milliseconds"},
    )


def run_schedule(broker, tmp_path: Path, fmt: str, seed: int) -> tuple[dict[str, int], Schedule]:
    rng = random.Random(f"{fmt}-{seed}")
    folder = tmp_path / f"{fmt}-{seed}"
    folder.mkdir()
    topic = new_topic(broker, partitions=3, prefix="chaos")
    starts_at = rng.choice(["earliest", "latest"])
    first = chaos_spec(folder, topic, fmt, f"chaos_{fmt}_{seed}", starts_at)
    schedule = Schedule(seed, fmt, folder, topic, rng, first, starts_at=starts_at)
    try:
        schedule.run(steps=rng.randint(4, 6))
        return schedule.check(), schedule
    except Exception as exc:  # say which schedule, so it can be replayed
        raise AssertionError(f"{exc}\n{schedule.where()}") from exc
    finally:
        if schedule.running:
            stream.stop(schedule.pipeline, by="chaos", timeout=60)


def test_random_schedules_keep_every_record_in_exactly_one_table(broker, tmp_path, capsys) -> None:
    totals = {fmt: {"schedules": 0, "records": 0, "duplicates": 0, "lost": 0} for fmt in FORMATS}
    actions: dict[str, dict[str, int]] = {fmt: {} for fmt in FORMATS}
    # Two schedules at a time (both formats by default): each waits mostly on its drivers'
    # JVMs, which the two cores share; their topics, names, checkpoints and tables are their own.
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run_schedule, broker, tmp_path, fmt, BASE_SEED + i) for i in range(SCHEDULES) for fmt in FORMATS
        ]
        for done in runs:
            result, schedule = done.result()
            fmt = schedule.fmt
            totals[fmt]["schedules"] += 1
            for key in ("records", "duplicates", "lost"):
                totals[fmt][key] += result[key]
            for action, n in schedule.counts.items():
                actions[fmt][action] = actions[fmt].get(action, 0) + n
            with capsys.disabled():
                print(f"\nchaos {schedule.where()}: {result}")
    with capsys.disabled():
        for fmt in FORMATS:
            print(f"\nchaos {fmt}: {totals[fmt]}, actions {dict(sorted(actions[fmt].items()))}")
