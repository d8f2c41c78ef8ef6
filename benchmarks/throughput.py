"""Ingest throughput: Sluice against plain Spark and a hand-written consumer, side by side.

    make bench-throughput                                        # 1,000,000 events, 3 rounds
    .venv/bin/python benchmarks/throughput.py --events 200000 --rounds 1 --no-scale   # a quick look

One embedded broker. A topic is filled once with generated device signals (the shipped
``device_signals`` spec: six fields, a nested struct, an array; about 190 bytes of JSON) and
every variant reads all of it from the earliest offset, ``--max-offsets`` records a batch:

- ``spark noop``: Kafka -> CAST(value AS STRING) -> the noop sink (what Spark can read);
- ``spark delta``: Kafka -> from_json -> the flattened columns -> Delta ``partitionBy(date)``,
  a plain ``writeStream``: what a user writes by hand;
- ``sluice``: ``sluice run SPEC --available-now`` as a user runs it (spark-submit of the
  ingest job), with the quarantine split, the audit and exactly-once writes;
- ``python delta``: confluent-kafka -> json.loads -> pyarrow -> ``deltalake.write_deltalake``,
  appends of ``--python-append`` rows (100,000) partitioned by date, one thread.

Each variant runs in its own process, ``local[2]`` unless said otherwise, so that its whole
process time (JVM start included) and its peak RSS (the process tree: JVM and Python) are
its own. The order of the variants rotates between rounds, so none always runs first or
last. Query time is the sum of the batches' ``triggerExecution`` (Spark's progress) or the
consume-and-write loop (Python). The fixed cost of a batch is the median time of batches of
10 records (``--small-batches`` of them; the first, cold one left out). With ``--scale``,
Sluice also runs on ``local[1]``, on topics of 1, 3 and 6 partitions, and on a standalone
cluster of two one-core workers (``spark.cores.max`` 1, then 2). Each ``--trial 'KEY=VALUE[;...]'``
adds ``sluice trial N``: Sluice with those Spark settings (``source.KEY``: a Kafka source option
of the spec; ``env.KEY``: an environment variable of the driver), measured in the same rounds, which is how a tuning's before and after are
compared. ``--baseline REF`` adds ``sluice @REF``: the ingest job of an earlier commit (checked
out in a temporary git worktree), the same way, for a change to the code.

Figures are printed and saved to ``benchmarks/results/throughput.json`` and ``.png``.
Every run must account for every event (the table's row count, read with delta-rs, and
Sluice's audit) or the benchmark stops.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from harness import RESULTS, ROOT, isolated_home

VARIANTS = ("spark noop", "spark delta", "sluice", "python delta")
#: ``--trial KEY=VALUE``: Sluice again with these Spark settings, side by side with the others.
#: ``--trial 'KEY=VALUE[;KEY=VALUE]'``: variant ``sluice trial N`` -> its settings.
TRIALS: dict[str, Trial] = {}
#: ``--baseline REF``: variant name -> the worktree holding that commit.
BASELINES: dict[str, Path] = {}
SPEC = ROOT / "pipelines" / "device_signals.yaml"
SMALL = 10  # records in a batch for the fixed cost
COLUMNS = {  # the flattened columns, as Sluice names them
    "timestamp": "e.timestamp",
    "device_id": "e.device.id",
    "device_type": "e.device.type",
    "device_firmware": "e.device.firmware",
    "device_location_lat": "e.device.location.lat",
    "device_location_lon": "e.device.location.lon",
    "signal": "e.signal",
    "battery": "e.battery",
    "tags": "e.tags",
}


@dataclass
class Trial:
    conf: dict[str, str] = field(default_factory=dict)  # Spark settings
    source: dict[str, str] = field(default_factory=dict)  # source.KEY: Kafka source options of the spec
    env: dict[str, str] = field(default_factory=dict)  # env.KEY: the driver's environment

    @classmethod
    def parse(cls, text: str) -> Trial:
        trial = cls()
        for key, value in (kv.split("=", 1) for kv in text.split(";")):
            if key.startswith("source."):
                trial.source[key.removeprefix("source.")] = value
            elif key.startswith("env."):
                trial.env[key.removeprefix("env.")] = value
            else:
                trial.conf[key] = value
        return trial


# --- filling the topics -------------------------------------------------------------------


def fill(bootstrap: str, topic: str, partitions: int, events: int) -> float:
    """Create ``topic`` and send ``events`` good device signals to it, spread over partitions."""
    from confluent_kafka import Producer

    from sluice.dev.generate import EventGenerator
    from sluice.spec import load_pipeline
    from sluice.topics import create_topics

    create_topics(bootstrap, [topic], partitions)
    gen = EventGenerator(load_pipeline(SPEC), seed=11)
    pool = [json.dumps(gen.good(), separators=(",", ":")).encode() for _ in range(min(events, 20_000))]
    prod = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "acks": "all", "log_level": 3}
    )
    started = time.perf_counter()
    for i in range(events):
        while True:
            try:
                prod.produce(topic, pool[i % len(pool)], partition=i % partitions)
                break
            except BufferError:
                prod.poll(0.05)
        if i % 10_000 == 0:
            prod.poll(0)
    if prod.flush(120) != 0:
        raise SystemExit(f"{topic}: the broker did not take every event")
    return time.perf_counter() - started


# --- the variants, each in a child process ------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run one variant in this process and print its result as the last line (``RESULT {...}``)."""
    result = python_delta(args) if args.variant == "python delta" else spark_variant(args)
    print("RESULT " + json.dumps(result), flush=True)


def spark_variant(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from jobs.session import local_session
    from jobs.stream.status import run_summary
    from sluice.spec import load_pipeline

    spark = local_session(f"bench-{args.variant.replace(' ', '-')}", master=args.master)
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .load()
    )
    checkpoint = str(Path(args.table) / "_checkpoint")
    if args.variant == "spark noop":
        writer = raw.selectExpr("CAST(value AS STRING) AS value").writeStream.format("noop")
    else:
        schema = StructType.fromJson(json.loads(load_pipeline(SPEC).schema.to_spark_json()))
        parsed = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
        flat = parsed.select(
            *[F.col(path).alias(name) for name, path in COLUMNS.items()],
            F.to_date(F.timestamp_seconds(F.col("e.timestamp"))).alias("date"),
        )
        writer = flat.writeStream.format("delta").partitionBy("date").option("path", args.table)
        checkpoint = str(Path(args.table + "_checkpoint"))
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    summary = run_summary(query.recentProgress)
    spark.stop()
    return summary


def python_delta(args: argparse.Namespace) -> dict[str, Any]:
    """The script a user writes instead: one consumer, json.loads, pyarrow, delta-rs."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import write_deltalake

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{os.getpid()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    partitions = consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(args.topic, p, 0) for p in partitions])
    total, done, batch_ms = sum(ends.values()), 0, []
    started = time.perf_counter()
    while done < total:
        t0 = time.perf_counter()
        events: list[dict[str, Any]] = []
        while len(events) < args.append_rows and done + len(events) < total:
            for m in consumer.consume(min(10_000, args.append_rows - len(events)), timeout=1.0):
                if m.error():
                    raise SystemExit(f"consumer: {m.error()}")
                events.append(json.loads(m.value() or b"null"))
        device = [e["device"] for e in events]
        location = [d.get("location") or {} for d in device]
        ts = pa.array([e["timestamp"] for e in events], pa.int64())
        table = pa.table(
            {
                "timestamp": ts,
                "device_id": [d["id"] for d in device],
                "device_type": [d.get("type") for d in device],
                "device_firmware": [d.get("firmware") for d in device],
                "device_location_lat": pa.array([loc.get("lat") for loc in location], pa.float64()),
                "device_location_lon": pa.array([loc.get("lon") for loc in location], pa.float64()),
                "signal": pa.array([e["signal"] for e in events], pa.float64()),
                "battery": pa.array([e.get("battery") for e in events], pa.int32()),
                "tags": pa.array([e.get("tags") for e in events], pa.list_(pa.string())),
                "date": pc.cast(pc.cast(ts, pa.timestamp("s", tz="UTC")), pa.date32()),
            }
        )
        write_deltalake(args.table, table, mode="append", partition_by=["date"])
        done += len(events)
        batch_ms.append(round((time.perf_counter() - t0) * 1000))
    seconds = time.perf_counter() - started
    consumer.close()
    return {
        "batches": len(batch_ms),
        "input_rows": done,
        "batch_ms": batch_ms,
        "phase_ms": {"triggerExecution": round(seconds * 1000)},
    }


# --- running and measuring ----------------------------------------------------------------


def sluice_spec(work: Path, name: str, topic: str, max_offsets: int, options: dict[str, str] | None = None) -> Path:
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    spec |= {
        "name": name,
        "schema": str(ROOT / "schemas" / "device_signal" / "v1.json"),
        "sink": {"format": "delta", "path": str(work / "tables" / name)},
        "checkpoint": str(work / "checkpoints" / name),
    }
    spec["source"] |= {"topics": [topic], "max_offsets_per_trigger": max_offsets}
    if options:
        spec["source"]["options"] = spec["source"].get("options", {}) | options
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def measure(command: list[str], env: dict[str, str], log: Path) -> tuple[float, float, str]:
    """Run ``command``; its wall time, the peak RSS of its process tree (MiB), and its output."""
    import psutil

    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)
    seconds = time.perf_counter() - started
    text = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])}... exited {proc.returncode}:\n{text[-3000:]}")
    return seconds, peak / 2**20, text


def run_variant(
    variant: str,
    work: Path,
    bootstrap: str,
    topic: str,
    max_offsets: int,
    master: str,
    run: int,
    append_rows: int = 100_000,
    conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    from sluice.ops.submit import ingest_submission
    from sluice.runtime import submit_env

    name = f"bench_{run}"
    table = work / "tables" / name
    log = work / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | submit_env(master)
    if variant.startswith("sluice"):
        trial = TRIALS.get(variant, Trial())
        env |= trial.env
        sub = ingest_submission(
            sluice_spec(work, name, topic, max_offsets, trial.source),
            pipeline_name=name,
            available_now=True,
            master=master,
            conf=trial.conf | (conf or {}),
        )
        command = sub.command()
        if variant in BASELINES:  # the same submission, with that commit's job and package
            tree = BASELINES[variant]
            command[command.index(sub.application)] = str(tree / "jobs" / "ingest.py")
            env["PYTHONPATH"] = str(tree)
        seconds, rss, text = measure(command, env, log)
        found = re.search(r"run summary (\{.*\})", text)
        if found is None:
            raise SystemExit(f"sluice: no run summary in {log}")
        summary = json.loads(found.group(1))
        audits = [json.loads(f.read_text()) for f in (work / "checkpoints" / name / "sluice_audit").glob("*.json")]
        if sum(a["records_out"] for a in audits) != summary["input_rows"]:
            raise SystemExit(f"sluice: the audit does not account for {summary['input_rows']} records")
    else:
        command = [sys.executable, __file__, "child", variant, "--bootstrap", bootstrap, "--topic", topic]
        command += ["--max-offsets", str(max_offsets), "--master", master, "--table", str(table)]
        command += ["--append-rows", str(min(append_rows, max_offsets))]
        seconds, rss, text = measure(command, env, log)
        summary = json.loads(text.rsplit("RESULT ", 1)[1])
    if variant != "spark noop":
        from deltalake import DeltaTable

        rows = DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
        if rows != summary["input_rows"]:
            raise SystemExit(f"{variant}: {rows} rows in the table for {summary['input_rows']} records read")
    for leftover in (table, Path(str(table) + "_checkpoint"), work / "tables" / f"{name}_quarantine"):
        shutil.rmtree(leftover, ignore_errors=True)
    query_s = summary["phase_ms"].get("triggerExecution", sum(summary["batch_ms"])) / 1000
    return {
        "variant": variant,
        "master": master,
        "topic": topic,
        "rows": summary["input_rows"],
        "batches": summary["batches"],
        "query_s": round(query_s, 3),
        "process_s": round(seconds, 3),
        "rows_per_s_query": round(summary["input_rows"] / query_s) if query_s else None,
        "rows_per_s_process": round(summary["input_rows"] / seconds),
        "peak_rss_mib": round(rss),
        "batch_ms": summary["batch_ms"],
        "phase_ms": summary["phase_ms"],
    }


def median_of(results: list[dict[str, Any]], variant: str, key: str) -> float:
    return statistics.median(r[key] for r in results if r["variant"] == variant)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    names = list(report["medians"])
    query = [report["medians"][v]["rows_per_s_query"] for v in names]
    process = [report["medians"][v]["rows_per_s_process"] for v in names]
    xs = range(len(names))
    left.bar([x - 0.2 for x in xs], query, 0.4, label="query time")
    left.bar([x + 0.2 for x in xs], process, 0.4, label="whole process")
    left.set_xticks(list(xs), names)
    left.set_ylabel("rows / s (median over rounds)")
    left.set_title(f"{report['settings']['events']:,} events, {report['settings']['partitions']} partitions, local[2]")
    left.legend()
    left.grid(True, axis="y", alpha=0.3)
    fixed = report.get("fixed_cost_ms", {})
    right.bar(list(fixed), list(fixed.values()), color="tab:gray")
    right.set_ylabel(f"ms per batch of {SMALL} records (median)")
    right.set_title("fixed cost of a batch")
    right.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--max-offsets", type=int, default=200_000, help="records per batch (maxOffsetsPerTrigger)")
    parser.add_argument("--python-append", type=int, default=100_000, help="rows per write_deltalake append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--small-batches", type=int, default=8, help="batches of 10 records for the fixed cost (0: not measured)"
    )
    parser.add_argument("--scale", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument(
        "--trial",
        action="append",
        default=[],
        metavar="KEY=VALUE[;KEY=VALUE]",
        help="adds 'sluice trial N' with these Spark settings (source.KEY: a Kafka source option, env.KEY: a variable)",
    )
    parser.add_argument("--baseline", action="append", default=[], metavar="REF", help="adds 'sluice @REF'")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",")]
    for n, trial in enumerate(args.trial, 1):
        TRIALS[f"sluice trial {n}"] = Trial.parse(trial)
        variants.append(f"sluice trial {n}")
    commits: dict[str, str] = {}
    for ref in args.baseline:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True, text=True, check=True)
        commits[f"sluice @{ref}"] = commit.stdout.strip()
        tree = Path(tempfile.mkdtemp(prefix="sluice-baseline-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True)
        BASELINES[f"sluice @{ref}"] = tree
        variants.append(f"sluice @{ref}")

    work = isolated_home("sluice-bench-throughput-")
    from rich.console import Console
    from rich.table import Table

    from sluice.dev.broker import EmbeddedBroker
    from sluice.dev.cluster import StandaloneCluster

    console = Console(width=160)
    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    results: list[dict[str, Any]] = []
    fixed: dict[str, float] = {}
    scale: list[dict[str, Any]] = []
    runs = iter(range(10_000))
    try:
        main_topic = f"bench-{args.partitions}p"
        took = fill(broker.bootstrap, main_topic, args.partitions, args.events)
        console.print(f"filled {main_topic}: {args.events:,} events in {took:.1f}s")
        if args.small_batches > 0:
            fill(broker.bootstrap, "bench-small", args.partitions, SMALL * args.small_batches)
        for n in range(args.rounds):
            order = variants[n % len(variants) :] + variants[: n % len(variants)]
            for variant in order:
                r = run_variant(
                    variant,
                    work,
                    broker.bootstrap,
                    main_topic,
                    args.max_offsets,
                    "local[2]",
                    next(runs),
                    args.python_append,
                )
                r["round"] = n + 1
                results.append(r)
                console.print(
                    f"round {n + 1} {variant}: {r['rows_per_s_query']:,} rows/s query, "
                    f"{r['rows_per_s_process']:,} whole process, peak RSS {r['peak_rss_mib']:,} MiB, "
                    f"batches {r['batch_ms']} ms"
                )
        for variant in [v for v in variants if v != "spark noop" and args.small_batches > 0]:
            # Batches of 10: per partition, Spark rounds the limit down; ask for 10 in all.
            r = run_variant(variant, work, broker.bootstrap, "bench-small", SMALL, "local[2]", next(runs))
            warm = r["batch_ms"][1:] or r["batch_ms"]
            fixed[variant] = statistics.median(warm)
            console.print(f"fixed cost {variant}: {fixed[variant]:.0f} ms per batch of ~{SMALL} ({r['batch_ms']} ms)")
        if args.scale:
            for master in ("local[1]", "local[2]"):
                r = run_variant("sluice", work, broker.bootstrap, main_topic, args.max_offsets, master, next(runs))
                scale.append(r | {"scale": f"{master}, {args.partitions} partitions"})
            for partitions in (1, 6):
                topic = f"bench-{partitions}p"
                fill(broker.bootstrap, topic, partitions, args.events)
                r = run_variant("sluice", work, broker.bootstrap, topic, args.max_offsets, "local[2]", next(runs))
                scale.append(r | {"scale": f"local[2], {partitions} partitions"})
            # The same job on a standalone cluster of two one-core workers, on one and on both.
            cluster = StandaloneCluster(work / "cluster", workers=2, cores=1, memory="1g")
            url = cluster.start()
            try:
                for cores in (1, 2):
                    conf = {"spark.cores.max": str(cores), "spark.executor.memory": "1g"}
                    r = run_variant(
                        "sluice", work, broker.bootstrap, main_topic, args.max_offsets, url, next(runs), conf=conf
                    )
                    scale.append(r | {"scale": f"cluster, {cores} worker(s) of 1 core, {args.partitions} partitions"})
            finally:
                cluster.stop()
            for r in scale:
                console.print(f"scale {r['scale']}: {r['rows_per_s_query']:,} rows/s query")
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
        for tree in BASELINES.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)

    medians = {
        v: {
            key: round(median_of(results, v, key))
            for key in ("rows_per_s_query", "rows_per_s_process", "peak_rss_mib", "query_s", "process_s")
        }
        for v in variants
    }
    ratios: dict[str, float] = {}
    if "sluice" in medians:
        s = medians["sluice"]["rows_per_s_query"]
        for other in ("spark noop", "spark delta", "python delta"):
            if other in medians:
                ratios[f"sluice / {other} (query)"] = round(s / medians[other]["rows_per_s_query"], 3)
        if "python delta" in medians:
            p = medians["python delta"]["rows_per_s_process"]
            ratios["sluice / python delta (process)"] = round(medians["sluice"]["rows_per_s_process"] / p, 3)
        for other in [*TRIALS, *BASELINES]:
            if other in medians:
                ratios[f"{other} / sluice (query)"] = round(medians[other]["rows_per_s_query"] / s, 3)
        one = [r for r in scale if r["master"] == "local[1]"]
        two = [r for r in scale if r["master"] == "local[2]" and r["topic"] == main_topic]
        if one and two:
            ratios["local[2] / local[1] (sluice, query)"] = round(
                two[0]["rows_per_s_query"] / one[0]["rows_per_s_query"], 3
            )
        on_cluster = [r for r in scale if r["scale"].startswith("cluster")]
        if len(on_cluster) == 2:
            ratios["cluster 2 workers / 1 worker (sluice, query)"] = round(
                on_cluster[1]["rows_per_s_query"] / on_cluster[0]["rows_per_s_query"], 3
            )

    table = Table("variant", "rows/s (query)", "rows/s (process)", "query s", "process s", "peak RSS MiB")
    for v, m in medians.items():
        table.add_row(
            v,
            f"{m['rows_per_s_query']:,}",
            f"{m['rows_per_s_process']:,}",
            f"{m['query_s']:,}",
            f"{m['process_s']:,}",
            f"{m['peak_rss_mib']:,}",
        )
    console.print(table)
    for what, value in ratios.items():
        console.print(f"{what}: {value:.3f}")
    for variant, ms in fixed.items():
        console.print(f"fixed cost of a {SMALL}-record batch, {variant}: {ms:.0f} ms")

    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "settings": {
            "events": args.events,
            "partitions": args.partitions,
            "max_offsets_per_trigger": args.max_offsets,
            "python_append_rows": args.python_append,
            "trials": {v: asdict(t) for v, t in TRIALS.items()},
            "baselines": commits,
            "rounds": args.rounds,
            "master": "local[2]",
        },
        "medians": medians,
        "ratios": ratios,
        "fixed_cost_ms": fixed,
        "scale": scale,
        "runs": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "throughput.json").write_text(json.dumps(report, indent=2))
    plot(report, RESULTS / "throughput.png")
    console.print(f"saved {RESULTS / 'throughput.json'} and {RESULTS / 'throughput.png'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        p = argparse.ArgumentParser()
        p.add_argument("mode")
        p.add_argument("variant", choices=[v for v in VARIANTS if v != "sluice"])
        for option in ("--bootstrap", "--topic", "--master", "--table"):
            p.add_argument(option, required=True)
        p.add_argument("--max-offsets", type=int, required=True)
        p.add_argument("--append-rows", type=int, required=True)
        child(p.parse_args())
        sys.exit(0)
    sys.exit(main())
