"""Where Sluice's ingest time goes: the plain Spark plan, then each of Sluice's stages added.

    make bench-ablation                                           # 600,000 events, 2 rounds
    .venv/bin/python benchmarks/ablation.py --events 200000 --rounds 1 --small-batches 0   # a quick look

One embedded broker, one topic of generated device signals (the shipped ``device_signals``
spec, 3 partitions): ``--bad-fraction`` of them are records Sluice quarantines (every kind
the generator makes) and ``--rescued-fraction`` of the good ones carry fields the schema does
not declare. Every stage reads all of it from the earliest offset, ``--max-offsets`` records a
batch, into tables of its own. Each stage adds one thing to the one before (:data:`STAGES`);
up to ``reason`` a stage writes what it adds as a column (``_probe_*``), so that Spark cannot
leave it out of the plan, until a later stage consumes it. From ``quarantine split`` on the
parse is Sluice's own (:func:`jobs.stream.parse.parse`), and the last stage is the ingest job's
``drive``, what ``sluice run`` runs. Beside the stages, variants of the plain plan show what
plain Spark's own Delta write costs (:data:`WRITE_VARIANTS`): statistics, codec, files.

All stages of a round run in one Spark session (``local[2]``, Sluice's settings) after a
warm-up, so the figures are steady-state costs; a job's start is measured by
``make bench-throughput``. Round 2 runs the stages in the reverse order. Per stage: rows/s
over the query's batches (the sum of Spark's ``triggerExecution``), the median batch of
``--max-offsets`` records, and the median batch of 10 records (``--small-batches``, the
first left out). Every stage's tables are counted with delta-rs: all records in the table
before the split, after it the good ones in the table and the rest in the quarantine, or
the benchmark stops.

Figures are printed and saved to ``benchmarks/results/ablation.json`` and ``.png``
(``--name`` saves them under another name, for an after beside a before).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from harness import RESULTS, ROOT, isolated_home

SPEC = ROOT / "pipelines" / "device_signals.yaml"
SMALL = 10  # records in a batch for the fixed cost
PARTITIONS = 3

#: Each stage adds one thing to the stage before it.
STAGES: dict[str, str] = {
    "plain": "Kafka -> from_json -> the flattened columns -> Delta by date, a plain writeStream",
    "lineage columns": "+ each row's Kafka coordinates, event time and ingest time",
    "corrupt-record column": "+ from_json's corrupt-record column (PERMISSIVE)",
    "VARIANT parse": "+ try_parse_json of each value",
    "value checks": "+ a check per field that from_json may have changed",
    "rescued map": "+ the fields the schema does not declare, as _rescued",
    "reason": "+ each record's quarantine reason",
    "quarantine split": "foreachBatch: good records to the table, the rest to the quarantine",
    # The writer as a whole: the row rules' check, the audit (observed in a one-pass write, or
    # counted from the copy), the rejects read again, the rescued paths, the audit file.
    "audit observation": "Sluice's batch writer, its appends without the writer's id",
    "idempotent commit": "+ Delta's txnAppId/txnVersion, mergeSchema, the fence's confirm",
    # The run loop: micro_batch.start's checks, the listener, the event log's flushes (outside
    # the batches: they show in the run's wall time).
    "event log": "+ Sluice's run loop: its start checks, the progress listener, the event log table",
    "lease checks": "+ the driver's lease, renewed beside it, checked before each batch and commit",
    "whole job": "+ status reports, lineage events, the put-if-absent check (jobs.ingest.drive)",
}
ORDER = list(STAGES)
#: Plain plans with one setting of the Delta write changed: what plain Spark's write costs.
WRITE_VARIANTS: dict[str, dict[str, str]] = {
    "plain: no statistics": {"spark.databricks.delta.stats.collect": "false"},
    "plain: zstd": {"spark.sql.parquet.compression.codec": "zstd"},
    "plain: uncompressed": {"spark.sql.parquet.compression.codec": "uncompressed"},
    "plain: one file a date": {},  # repartitioned by date before the write
    # A partitioned write sorts each task's rows by date first; with concurrent writers, and the
    # sort left out of the plan, each task keeps a file open per date instead.
    "plain: no sort": {
        "spark.sql.optimizer.plannedWrite.enabled": "false",
        "spark.sql.maxConcurrentOutputFileWriters": "8",
    },
}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def commit(ref: str) -> str:
    return git("rev-parse", "--short", ref)


def on(level: str, stage: str) -> bool:
    return ORDER.index(level) >= ORDER.index(stage)


# --- filling the topics -------------------------------------------------------------------


def records(n: int, bad_fraction: float, rescued_fraction: float) -> list[tuple[bytes | None, bool]]:
    """``n`` generated records (value, good?): ``bad_fraction`` of them bad, of every kind the
    generator makes, and ``rescued_fraction`` of the good ones with two undeclared fields."""
    import random

    from sluice.dev.generate import EventGenerator
    from sluice.spec import load_pipeline

    gen = EventGenerator(load_pipeline(SPEC), seed=11)
    rng = random.Random(5)
    out: list[tuple[bytes | None, bool]] = []
    for _ in range(n):
        record = gen.record(bad_fraction)
        value = record.value
        if record.kind == "good" and rng.random() < rescued_fraction:
            assert record.event is not None
            event = record.event | {"firmware_channel": "beta"}
            event["device"] = event["device"] | {"vendor": "acme"}
            value = json.dumps(event).encode()
        out.append((value, record.kind == "good"))
    return out


def fill(bootstrap: str, topic: str, events: int, bad_fraction: float, rescued_fraction: float) -> dict[str, int]:
    """Create ``topic`` and send ``events`` records to it (:func:`records`); how many are good and bad."""
    from confluent_kafka import Producer

    from sluice.topics import create_topics

    create_topics(bootstrap, [topic], PARTITIONS)
    pool = records(min(events, 20_000), bad_fraction, rescued_fraction)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "log_level": 3})
    good = 0
    for i in range(events):
        value, ok = pool[i % len(pool)]
        good += ok
        while True:
            try:
                prod.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                prod.poll(0.05)
        if i % 10_000 == 0:
            prod.poll(0)
    if prod.flush(120) != 0:
        raise SystemExit(f"{topic}: the broker did not take every record")
    return {"records": events, "good": good, "bad": events - good}


# --- one round: every stage in one Spark session (the child process) ----------------------


def spec_for(work: Path, name: str, topic: str, max_offsets: int) -> Path:
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    spec |= {
        "name": name,
        "schema": str(ROOT / "schemas" / "device_signal" / "v1.json"),
        "sink": {"format": "delta", "path": str(work / "tables" / name)},
        "checkpoint": str(work / "checkpoints" / name),
    }
    spec["source"] |= {"topics": [topic], "max_offsets_per_trigger": max_offsets}
    path = work / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def probed(raw: Any, pipeline: Any, level: str) -> Any:
    """The rows a stage before the split writes: Sluice's parse up to ``level``, with what
    the stage adds as ``_probe_*`` columns until a later stage consumes it."""
    from pyspark.sql import functions as F

    from jobs.stream.parse import _lineage, parse_schema, rescued_json
    from sluice.spec import eventtime, rescue, strict
    from sluice.spec import quarantine as q
    from sluice.spec.columns import KEY, REASON, RESCUED, RESCUED_MAP, VARIANT
    from sluice.spec.flatten import EVENT_TIME, INGESTED_AT, PARSED

    et = pipeline.event_time
    event_field = pipeline.schema.find(et.field)
    df = raw.select(
        F.col("key").alias(KEY),
        F.col("value").alias(q.VALUE),
        F.col("value").cast("string").alias(q.JSON),
        "topic",
        "partition",
        "offset",
        "timestamp",
    )
    probes: dict[str, Any] = {}
    if on(level, "corrupt-record column"):
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": q.CORRUPT}
        df = df.withColumn(PARSED, F.from_json(q.JSON, parse_schema(pipeline), options))
        probes["corrupt"] = F.col(f"{PARSED}.{q.CORRUPT}")
    else:
        schema = json.loads(pipeline.schema.to_spark_json())
        df = df.withColumn(PARSED, F.from_json(q.JSON, json.dumps(schema)))
    if on(level, "VARIANT parse"):
        df = df.withColumn(VARIANT, F.expr(f"try_parse_json({q.JSON})"))
        probes["not_json"] = F.col(VARIANT).isNull()
    inexact = "''"
    if on(level, "value checks"):
        checks = strict.checks(pipeline.schema, et.field, pipeline.spec.coerce)
        rescued = set(pipeline.rescue_fields)
        for dotted, check in checks:
            if dotted in rescued:
                kept = F.when(F.expr(check).isNull(), F.col(q.parsed_sql(dotted)))
                df = df.withColumn(PARSED, F.col(PARSED).withField(dotted, kept))
        inexact = strict.items_sql([(d, c) for d, c in checks if d not in rescued])
        probes["inexact"] = F.expr(inexact)
    df = df.withColumn(
        q.EVENT_TS, F.expr(eventtime.event_time_sql(q.parsed_sql(et.field), et.format, event_field.type))
    )
    out = []
    if on(level, "rescued map"):
        df = df.withColumn(RESCUED_MAP, F.expr(rescue.rescued_sql(pipeline.schema, pipeline.rescue_fields)))
        out.append(F.expr(rescued_json()).alias(RESCUED))
        probes.pop("not_json")  # the rescued map reads the VARIANT
    if on(level, "reason"):
        reason = q.reason_sql(
            pipeline.schema, et.field, et.format, pipeline.accepted_times, pipeline.rescue_fields, inexact
        )
        df = df.withColumn(REASON, F.expr(reason))
        probes = {"reason": F.col(REASON)}  # the reason reads all the others
    if on(level, "lineage columns"):
        out += [*_lineage(), F.col(q.EVENT_TS).alias(EVENT_TIME), F.current_timestamp().alias(INGESTED_AT)]
    dp = pipeline.spec.date_partition
    return df.select(
        *[F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns],
        *out,
        *[column.alias(f"_probe_{name}") for name, column in probes.items()],
        F.expr(eventtime.date_sql(q.EVENT_TS, dp.timezone)).alias(dp.column),
    )


def offsets_between(start: str | None, end: str | None) -> int:
    """Records between a Kafka source's start and end offsets (JSON, ``{topic: {partition: offset}}``)."""
    # PySpark passes the JVM's strings through str(): a first batch's start is "None".
    first = json.loads(start) if start and start != "None" else {}
    last = json.loads(end) if end and end != "None" else {}
    return sum(o - first.get(t, {}).get(p, 0) for t, parts in last.items() for p, o in parts.items())


class Progress:
    """Every query's progress, by query name, from Spark's listener bus."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        self.batches: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                # The batch's records from its offsets: Spark's numInputRows counts a record
                # each time the batch is read, and a split batch may be read twice.
                rows = sum(offsets_between(s.startOffset, s.endOffset) for s in p.sources)
                if rows:
                    with outer.lock:
                        outer.batches.setdefault(p.name, []).append(
                            {"rows": rows, "ms": p.durationMs.get("triggerExecution", 0)}
                        )

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Listener())

    def wait(self, name: str, rows: int, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = list(self.batches.get(name, []))
            if sum(b["rows"] for b in found) >= rows:
                return found
            time.sleep(0.2)
        raise SystemExit(f"{name}: Spark reported {sum(b['rows'] for b in found)} of {rows} records")


def run_stage(spark: Any, stage: str, pipeline: Any, conf: dict[str, str]) -> None:
    """Run one stage's query over the whole topic (available now) until it ends."""
    from pyspark.sql import functions as F

    from jobs import ingest
    from jobs.stream import modes
    from jobs.stream.micro_batch import BatchWriter, good
    from jobs.stream.parse import flat_rows, parse, quarantine_rows, read_kafka
    from jobs.tables.sinks import DeltaSink
    from sluice.state import lease as leases

    date = pipeline.spec.date_partition.column
    level = stage if stage in STAGES else "plain"  # the write's variants are plain plans
    raw = read_kafka(spark, pipeline)
    checkpoint = pipeline.checkpoint_path
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        if on(level, "event log"):
            lease = leases.take(pipeline.name, leases.claims_for(pipeline))
            try:
                if stage == "whole job":
                    if ingest.drive(pipeline, None, True, None, False, lease) != 0:
                        raise SystemExit(f"{pipeline.name}: the ingest job failed")
                    return
                stop = threading.Event()
                fence = leases.Fence(lease, stop).start() if stage == "lease checks" else leases.UNFENCED
                try:
                    error = modes.MicroBatch(pipeline).run(spark, available_now=True, stop=stop, fence=fence)
                finally:
                    fence.close()
                if error is not None:
                    raise SystemExit(f"{pipeline.name}: {error}")
                return
            finally:
                leases.release(lease)
        if on(level, "quarantine split"):
            parsed = parse(raw, pipeline)
            if stage == "quarantine split":

                def split(batch: Any, batch_id: int) -> None:
                    for rows, path in (
                        (flat_rows(batch.filter(good()), pipeline), pipeline.sink_path),
                        (quarantine_rows(batch.filter(~good()), pipeline), pipeline.quarantine_path),
                    ):
                        rows.write.format("delta").mode("append").partitionBy(date).save(path)

                writer: Any = split
            else:

                class Appends(DeltaSink):
                    """Delta appends without the writer's (txnAppId, txnVersion)."""

                    def write(self, df: Any, batch_id: int) -> None:
                        df.write.format("delta").mode("append").partitionBy(self.partition_by).save(self.path)

                class Writer(BatchWriter):
                    def sinks(self) -> Any:
                        if stage == "audit observation" and self._sinks is None:
                            self._sinks = (
                                Appends(spark, pipeline.sink_path, date, "ablation"),
                                Appends(spark, pipeline.quarantine_path, date, "ablation"),
                            )
                        return super().sinks()

                writer = Writer(spark, pipeline)
            stream = parsed.writeStream.foreachBatch(writer)
        else:
            rows = probed(raw, pipeline, level)
            if stage == "plain: one file a date":
                rows = rows.repartition(F.col(date))
            stream = rows.writeStream.format("delta").partitionBy(date).option("path", pipeline.sink_path)
        query = stream.queryName(pipeline.name).option("checkpointLocation", checkpoint)
        query = query.trigger(availableNow=True).start()
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"{pipeline.name}: {query.exception()}")
    finally:
        for key in conf:
            spark.conf.unset(key)


def count(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows() if Path(path, "_delta_log").is_dir() else 0


def child(args: argparse.Namespace) -> None:
    """Run the round's stages in one session; print each one's figures (``RESULT {...}``)."""
    if args.code:  # another commit's jobs and package (a --baseline), in place of this tree's
        for module in [m for m in sys.modules if m.split(".")[0] in ("sluice", "jobs")]:
            del sys.modules[module]
        sys.path.insert(0, args.code)
    from jobs.session import local_session
    from sluice.spec import load_pipeline

    work = Path(args.work)
    spark = local_session("bench-ablation", master="local[2]")
    progress = Progress(spark)
    fills = json.loads(args.fills)
    runs = iter(range(10_000))

    def one(stage: str, topic: str, max_offsets: int) -> dict[str, Any]:
        name = f"ablation_{args.round}_{next(runs)}"
        pipeline = load_pipeline(str(spec_for(work, name, topic, max_offsets)))
        started = time.perf_counter()
        run_stage(spark, stage, pipeline, WRITE_VARIANTS.get(stage, {}))
        wall = time.perf_counter() - started
        expected = fills[topic]
        batches = progress.wait(name, expected["records"])
        rows, quarantined = count(pipeline.sink_path), count(pipeline.quarantine_path)
        split = stage in STAGES and on(stage, "quarantine split")
        want = (expected["good"], expected["bad"]) if split else (expected["records"], 0)
        if (rows, quarantined) != want:
            raise SystemExit(f"{stage}: {rows} rows and {quarantined} quarantined, expected {want[0]} and {want[1]}")
        for folder in ("tables", "checkpoints"):
            for leftover in (work / folder).glob(f"{name}*"):
                shutil.rmtree(leftover, ignore_errors=True)
        return {"wall_s": round(wall, 3), "batches": batches}

    # Warm-up: the JIT compiles the plain plan's and Sluice's code before anything is measured.
    for stage in ("plain", "whole job"):
        one(stage, "ablation-small", SMALL)
    stages = [s for s in args.stages.split(",") if s]
    for stage in stages:
        big = one(stage, "ablation", args.max_offsets)
        label = f"{stage} @{args.label}" if args.label else stage
        result: dict[str, Any] = {"stage": label, "round": args.round, **big}
        if args.small_batches:
            small = one(stage, "ablation-small", SMALL)
            result["small_batch_ms"] = [b["ms"] for b in small["batches"]]
        print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


# --- the rounds, the figures --------------------------------------------------------------


def summarize(results: list[dict[str, Any]], stages: list[str]) -> dict[str, dict[str, Any]]:
    medians: dict[str, dict[str, Any]] = {}
    for stage in stages:
        runs = [r for r in results if r["stage"] == stage]
        rates, steady = [], []
        for r in runs:
            rows, ms = sum(b["rows"] for b in r["batches"]), sum(b["ms"] for b in r["batches"])
            rates.append(rows / (ms / 1000))
            full = [b["ms"] for b in r["batches"][1:] if b["rows"] == r["batches"][0]["rows"]]
            steady += full or [b["ms"] for b in r["batches"]]
        small = [ms for r in runs for ms in r.get("small_batch_ms", [])[1:]]
        medians[stage] = {
            "rows_per_s": round(statistics.median(rates)),
            "batch_ms": round(statistics.median(steady)),
            "first_batch_ms": round(statistics.median(r["batches"][0]["ms"] for r in runs)),
            "small_batch_ms": round(statistics.median(small)) if small else None,
            "wall_s": round(statistics.median(r["wall_s"] for r in runs), 1),
        }
    plain = medians.get("plain")
    previous: dict[str, Any] | None = None
    for stage in stages:
        m = medians[stage]
        if plain:
            m["vs_plain"] = round(m["rows_per_s"] / plain["rows_per_s"], 3)
        if stage in STAGES and previous is not None:
            m["added_batch_ms"] = m["batch_ms"] - previous["batch_ms"]
            if m["small_batch_ms"] is not None and previous["small_batch_ms"] is not None:
                m["added_small_batch_ms"] = m["small_batch_ms"] - previous["small_batch_ms"]
        if stage in STAGES:
            previous = m
    return medians


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians = report["medians"]
    names = list(medians)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = ["tab:blue" if n in STAGES else "tab:gray" for n in names]
    left.barh(names, [medians[n]["rows_per_s"] for n in names], color=colors)
    left.invert_yaxis()
    left.set_xlabel("rows / s (median over rounds)")
    s = report["settings"]
    left.set_title(f"{s['events']:,} records, batches of {s['max_offsets']:,}, local[2]")
    left.grid(True, axis="x", alpha=0.3)
    small = [medians[n]["small_batch_ms"] or 0 for n in names]
    right.barh(names, small, color=colors)
    right.invert_yaxis()
    right.set_yticklabels([])
    right.set_xlabel(f"ms per batch of {SMALL} records (median)")
    right.set_title("fixed cost of a batch")
    right.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--max-offsets", type=int, default=200_000, help="records per batch (maxOffsetsPerTrigger)")
    parser.add_argument("--bad-fraction", type=float, default=0.01, help="records Sluice quarantines")
    parser.add_argument("--rescued-fraction", type=float, default=0.05, help="good records with undeclared fields")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small-batches", type=int, default=4, help="batches of 10 records a stage (0: none)")
    parser.add_argument("--stages", default=",".join([*STAGES, *WRITE_VARIANTS]), help="comma-separated subset")
    parser.add_argument("--name", default="ablation", help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument(
        "--baseline", metavar="REF", help="also run the stages with REF's jobs and package, as 'STAGE @REF'"
    )
    args = parser.parse_args()
    stages = [s.strip() for s in args.stages.split(",")]
    unknown = [s for s in stages if s not in STAGES and s not in WRITE_VARIANTS]
    if unknown:
        parser.error(f"unknown stages: {', '.join(unknown)}; known: {', '.join([*STAGES, *WRITE_VARIANTS])}")

    provenance = {
        "commit": commit("HEAD"),
        # Stages measured with uncommitted changes: their code is not the commit's.
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "baseline": commit(args.baseline) if args.baseline else None,
    }
    codes: list[tuple[str | None, str | None]] = [(None, None)]
    if args.baseline:
        tree = Path(tempfile.mkdtemp(prefix="sluice-baseline-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline], check=True)
        codes.append((str(tree), args.baseline))
    work = isolated_home("sluice-bench-ablation-")
    from sluice.dev.broker import EmbeddedBroker

    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    results: list[dict[str, Any]] = []
    try:
        fills = {"ablation": fill(broker.bootstrap, "ablation", args.events, args.bad_fraction, args.rescued_fraction)}
        small = max(args.small_batches, 2) * SMALL  # the warm-up and each stage read it all
        fills["ablation-small"] = fill(broker.bootstrap, "ablation-small", small, args.bad_fraction, 0.0)
        print(f"filled: {fills}", flush=True)
        # Each round runs every code (this tree, the baseline) in turn, in the order the round's parity gives.
        turns = [(r, c) for r in range(args.rounds) for c in (codes if r % 2 == 0 else codes[::-1])]
        for n, (code, label) in turns:
            order = stages if n % 2 == 0 else stages[::-1]
            command = [sys.executable, __file__, "child", "--round", str(n + 1), "--work", str(work)]
            command += ["--fills", json.dumps(fills), "--stages", ",".join(order)]
            command += ["--max-offsets", str(args.max_offsets), "--small-batches", str(args.small_batches)]
            command += ["--code", code, "--label", label] if code and label else []
            log = work / f"round-{n + 1}{'-' + label.replace('/', '_') if label else ''}.log"
            with log.open("w") as out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=out, text=True) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith("RESULT "):
                        r = json.loads(line.removeprefix("RESULT "))
                        results.append(r)
                        ms = [b["ms"] for b in r["batches"]]
                        print(f"round {n + 1} {r['stage']}: batches {ms} ms, 10-record {r.get('small_batch_ms')} ms")
            if proc.returncode != 0:
                raise SystemExit(f"round {n + 1} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
        for code, _ in codes[1:]:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(code)], check=False)

    labels = [label for _, label in codes[1:] if label]
    medians = summarize(results, [*stages, *(f"{s} @{label}" for label in labels for s in stages)])
    header = f"{'stage':<24}{'rows/s':>10}{'/ plain':>9}{'batch ms':>10}{'+ms':>7}{'10-rec ms':>11}{'+ms':>7}"
    print(header)
    for stage, m in medians.items():
        print(
            f"{stage:<24}{m['rows_per_s']:>10,}{m.get('vs_plain', 0):>9.3f}{m['batch_ms']:>10,}"
            f"{m.get('added_batch_ms', ''):>7}{m['small_batch_ms'] or '':>11}{m.get('added_small_batch_ms', ''):>7}"
        )
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **provenance,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "settings": {
            "events": args.events,
            "partitions": PARTITIONS,
            "max_offsets": args.max_offsets,
            "bad_fraction": args.bad_fraction,
            "rescued_fraction": args.rescued_fraction,
            "rounds": args.rounds,
            "records": fills,
        },
        "stages": {s: STAGES.get(s) or json.dumps(WRITE_VARIANTS[s]) for s in stages},
        "medians": medians,
        "runs": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    plot(report, RESULTS / f"{args.name}.png")
    print(f"saved {RESULTS / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        p = argparse.ArgumentParser()
        p.add_argument("mode")
        for option in ("--round", "--work", "--fills", "--stages"):
            p.add_argument(option, required=True)
        p.add_argument("--max-offsets", type=int, required=True)
        p.add_argument("--small-batches", type=int, required=True)
        p.add_argument("--code", help="a worktree whose jobs and sluice run instead of this tree's")
        p.add_argument("--label", help="the worktree's ref, added to each stage's name")
        child(p.parse_args())
        sys.exit(0)
    sys.exit(main())
