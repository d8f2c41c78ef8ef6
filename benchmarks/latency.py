"""End-to-end latency: the same fraud query in micro-batch, continuous and real-time mode, side by side.

    .venv/bin/python benchmarks/latency.py                    # rates 100, 1000, 10000 events/s
    .venv/bin/python benchmarks/latency.py --rates 1000 --measure 20 --partitions 2

One embedded Kafka broker and one local Spark session (local[2]). For each rate, a producer
in a process of its own sends payments at that fixed rate for ``--warmup`` + ``--measure`` seconds; a consumer reads
the verdicts and takes, per event, its latency = receive time minus the input record's Kafka
CreateTime (set by the producer when it sent the event, carried into the verdict as
``source.timestamp``). Only events sent during the measurement window count. The verdict's
own CreateTime (set when Spark's writer sends it) splits that into time spent before the
writer (``in_spark``) and the hop out through the broker. The query is the continuous
branch's own (parse with ``from_json`` + filter + rules, ``emit: all`` so every event yields a
verdict), under each of its engines (``continuous.engine``: continuous processing, and
Spark 4.1's Real-Time Mode with its default checkpoint interval); micro-batch runs the same
transformation with a processing-time trigger of 0.

The floor is the same produce-then-consume path through the broker with no Spark between.
Figures are printed as a table and saved to ``benchmarks/results/latency.json`` and
``latency.png`` (CDF per mode at each rate). Nothing here is a pass/fail test.

The warm-up matters: a fresh JVM on two cores spends its first half-minute compiling
(the C2 compiler thread takes 30-40 % of a core), and latencies measured then are seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import sys
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import RESULTS, ROOT, isolated_home

RULES = {
    "large_amount": "amount > 2000",
    "cross_border_online": "channel = 'online' AND card_country <> merchant_country",
}
# Low-latency client settings, the same for every mode. A fetch returns as soon as one record
# is there (fetch.min.bytes), so a short fetch wait would only burn the broker's CPU. The
# producer's linger is a flag: with 0, librdkafka sends a request per event, and at 10,000/s
# this broker then falls a second behind; 1 ms costs the lower rates at most that.
PRODUCER = {"acks": 1, "enable.idempotence": False, "socket.nagle.disable": True}
CONSUMER = {
    "fetch.wait.max.ms": 100,
    "fetch.min.bytes": 1,
    "socket.nagle.disable": True,
    "auto.offset.reset": "latest",
    "enable.auto.commit": False,
}


@dataclass
class Run:
    mode: str
    rate: int
    sent: int = 0
    received: int = 0
    seconds: float = 0.0  # from the first event sent to the end of the drain
    latencies_ms: list[float] = field(default_factory=list)
    in_spark_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.latencies_ms)

        def pct(p: float, values: list[float] = xs) -> float | None:
            return round(values[min(len(values) - 1, int(p * len(values)))], 2) if values else None

        return {
            "mode": self.mode,
            "rate": self.rate,
            "sent": self.sent,
            "measured": len(xs),
            "kept_up": self.received >= 0.95 * self.rate * self.seconds,
            "throughput_per_s": round(self.received / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "max_ms": round(xs[-1], 2) if xs else None,
            "in_spark_p50_ms": pct(0.50, sorted(self.in_spark_ms)),
        }


def produce_at(
    bootstrap: str, topic: str, values: list[bytes], rate: int, seconds: float, linger_ms: float
) -> tuple[int, float]:
    """Send ``rate`` events per second for ``seconds``, paced against the clock; return (sent, start)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, **PRODUCER})
    total = int(rate * seconds)
    start = time.monotonic()
    started_wall = time.time()
    for i in range(total):
        due = start + i / rate
        while (ahead := due - time.monotonic()) > 0:
            time.sleep(min(ahead, 0.001))
        producer.produce(topic, values[i % len(values)])
        if i % 64 == 0:
            producer.poll(0)
    producer.flush(30)
    return total, started_wall


class Collector(threading.Thread):
    """Reads a topic and records (sent at, latency) per record, from its own clock."""

    def __init__(self, bootstrap: str, topic: str, sent_at: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, **CONSUMER})
        self.consumer.subscribe([topic])
        self.sent_at = sent_at  # "create_time": the record's own timestamp; "source": the verdict's source.timestamp
        self.samples: list[tuple[float, float, float | None]] = []  # (sent at, latency, time before the writer)
        self.received: list[tuple[float, float, bytes | None]] = []  # (received at, CreateTime, value)
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        # Keep the loop lean (no parsing until the end) so the harness keeps up at 10,000
        # events/s: wait for one message, then take what else is already there without waiting
        # (consume() with a timeout would hold a batch back until it is full).
        received = self.received
        while not self.stop.is_set():
            first = self.consumer.poll(0.05)
            now = time.time()
            if first is not None or self.consumer.assignment():
                self.ready.set()
            if first is None:
                continue
            rest = self.consumer.consume(num_messages=1000, timeout=0)
            later = time.time()
            received.extend(
                (at, m.timestamp()[1] / 1000, m.value())
                for at, m in [(now, first), *((later, m) for m in rest)]
                if m.error() is None
            )
        self.consumer.close()
        for now, created, value in received:
            if self.sent_at == "create_time":
                self.samples.append((created, (now - created) * 1000, None))
            else:
                ts = json.loads(value or b"{}")["source"]["timestamp"]
                sent = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
                self.samples.append((sent, (now - sent) * 1000, (created - sent) * 1000))


def measure(
    bootstrap: str,
    in_topic: str,
    out_topic: str,
    sent_at: str,
    mode: str,
    values: list[bytes],
    rate: int,
    warmup: float,
    seconds: float,
    linger_ms: float,
) -> Run:
    collector = Collector(bootstrap, out_topic, sent_at)
    collector.start()
    collector.ready.wait(30)
    time.sleep(1)
    # The producer paces itself in a process of its own, so neither it nor the collector is
    # what falls behind at 10,000 events/s (one Python interpreter shared by both would be).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        sent, started = pool.submit(produce_at, bootstrap, in_topic, values, rate, warmup + seconds, linger_ms).result()
    # Drain: until everything sent came out, nothing more comes for two seconds, or 30 s passed
    # (a mode that falls behind shows it as a throughput below the rate, and few events measured).
    seen, quiet_since, drain_end = -1, time.monotonic(), time.monotonic() + 30
    while len(collector.received) < sent and time.monotonic() - quiet_since < 2 and time.monotonic() < drain_end:
        if len(collector.received) != seen:
            seen, quiet_since = len(collector.received), time.monotonic()
        time.sleep(0.2)
    collector.stop.set()
    collector.join()
    finished = time.time()
    window = (started + warmup, started + warmup + seconds)
    inside = [(lat, spark) for at, lat, spark in collector.samples if window[0] <= at <= window[1]]
    return Run(
        mode,
        rate,
        sent=sent,
        received=len(collector.samples),
        seconds=finished - started,
        latencies_ms=[lat for lat, _ in inside],
        in_spark_ms=[spark for _, spark in inside if spark is not None],
    )


def verdict_values(pipeline: Any, n: int = 5000) -> list[bytes]:
    from sluice.dev.generate import EventGenerator

    gen = EventGenerator(pipeline, seed=42)
    return [r.value for r in (gen.record() for _ in range(n)) if r.value is not None]


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r.rate for r in runs})
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for run in (r for r in runs if r.rate == rate):
            xs = sorted(run.latencies_ms)
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=run.mode)
        ax.set_xscale("log")
        ax.set_title(f"{rate:,} events/s")
        ax.set_xlabel("end-to-end latency (ms, log)")
        ax.set_ylabel("fraction of events")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Kafka → Spark → Kafka latency CDF (2 cores, everything local)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds sent before measuring, per rate")
    parser.add_argument("--measure", type=float, default=20.0, help="seconds measured, per rate")
    parser.add_argument("--modes", nargs="+", default=["floor", "real_time", "continuous", "micro_batch"])
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the input topic")
    parser.add_argument("--checkpoint-interval", default="1 second", help="continuous.checkpoint_interval")
    parser.add_argument("--fetch-wait-ms", type=int, help="Spark's consumer fetch.max.wait.ms (else the job's default)")
    parser.add_argument("--linger-ms", type=float, default=1.0, help="the input producer's linger.ms")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    parser.add_argument("--summarize", action="store_true", help="report the saved raw figures again, no run")
    args = parser.parse_args()
    if args.summarize:
        from rich.console import Console

        report(json.loads((RESULTS / "latency-raw.json").read_text()), Console(width=150))
        return 0

    work = isolated_home("sluice-bench-")
    from rich.console import Console

    from sluice.dev.broker import EmbeddedBroker
    from sluice.spec import parse_pipeline
    from sluice.topics import create_topics

    console = Console(width=150)  # the table stays readable when the output goes to a file
    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    runs: list[Run] = []
    spark = None
    try:
        spec: dict[str, Any] = {
            "name": "bench",
            "mode": "continuous",
            "source": {
                "topics": ["bench-in"],
                "starting_offsets": "latest",
                "options": {"kafka.fetch.max.wait.ms": str(args.fetch_wait_ms)} if args.fetch_wait_ms else {},
            },
            "schema": str(ROOT / "schemas" / "payment" / "v1.json"),
            "event_time": {"field": "created_at", "format": "iso8601"},
            "sink": {"format": "kafka", "topic": "bench-out"},
            "checkpoint": str(work / "checkpoints" / "bench"),
            "continuous": {
                "checkpoint_interval": args.checkpoint_interval,
                "rules": RULES,
                "emit": "all",
                "filter": "amount IS NOT NULL",
            },
        }
        pipeline = parse_pipeline(spec, ROOT / "benchmarks" / "bench.yaml")
        # Real-Time Mode: the same branch under the other engine, on a checkpoint of its own.
        real_time = dict(spec, checkpoint=str(work / "checkpoints" / "bench-real-time"))
        real_time["continuous"] = dict(spec["continuous"], engine="real_time", checkpoint_interval=None)
        pipelines = {"real_time": parse_pipeline(real_time, ROOT / "benchmarks" / "bench.yaml")}
        create_topics(broker.bootstrap, ["bench-in", "bench-out", "bench-out-quarantine"], args.partitions)
        values = verdict_values(pipeline)

        for mode in args.modes:
            query = None
            if mode != "floor":
                if spark is None:
                    from jobs.session import local_session

                    spark = local_session(
                        "sluice-bench",
                        master=f"local[{max(2, args.partitions)}]",
                        conf={"spark.ui.enabled": "false"} | dict(c.split("=", 1) for c in args.conf),
                    )
                query = start_query(spark, pipelines.get(mode, pipeline), mode, work)
                time.sleep(10)  # the query is planned and its tasks are running
            # The floor reads the input topic itself, timed by each record's own CreateTime.
            out_topic, sent_at, label = (
                ("bench-in", "create_time", "floor (no Spark)") if query is None else ("bench-out", "source", mode)
            )
            try:
                for rate in args.rates:
                    run = measure(
                        broker.bootstrap,
                        "bench-in",
                        out_topic,
                        sent_at,
                        label,
                        values,
                        rate,
                        args.warmup,
                        args.measure,
                        args.linger_ms,
                    )
                    runs.append(run)
                    console.print(run.summary())
            finally:
                if query is not None:
                    query.stop()
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    settings = {
        "partitions": args.partitions,
        "warmup_s": args.warmup,
        "measure_s": args.measure,
        "producer": PRODUCER | {"linger.ms": args.linger_ms},
        "consumer": CONSUMER,
        "checkpoint_interval": args.checkpoint_interval,
        "real_time_checkpoint_interval": pipelines["real_time"].spec.continuous.interval,
        "spark_fetch_max_wait_ms": args.fetch_wait_ms or continuous_fetch_wait(),
        "spark_conf": dict(c.split("=", 1) for c in args.conf),
        "micro_batch_trigger": "processingTime=0",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "settings": settings,
        "runs": [asdict(r) | {"latencies_ms": [round(x, 2) for x in r.latencies_ms]} for r in runs],
    }
    (RESULTS / "latency-raw.json").write_text(json.dumps(raw))
    report(raw, console)
    return 0


def report(raw: dict[str, Any], console: Any) -> None:
    """Print the table and ratios, and save the summary (latency.json) and the plot."""
    from rich.table import Table

    runs = [Run(**r) for r in raw["runs"]]
    columns = ("mode", "rate", "measured", "kept_up", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms")
    table = Table(*columns, "in_spark_p50_ms")
    for run in runs:
        s = run.summary()
        table.add_row(*(str(s[k]) if s[k] is not None else "" for k in (*columns, "in_spark_p50_ms")))
    console.print(table)
    ratios: dict[str, dict[int, dict[str, float]]] = {}
    for slower, faster in (("micro_batch", "continuous"), ("continuous", "real_time"), ("real_time", "floor")):
        name = f"{slower}_over_{faster}"
        for rate in sorted({r.rate for r in runs}):
            by_mode = {r.mode.split(" ")[0]: r.summary() for r in runs if r.rate == rate}
            a, b = by_mode.get(slower), by_mode.get(faster)
            if not (a and b and a["p50_ms"] and b["p50_ms"]):
                continue
            got = {q: round(a[q] / b[q], 1) for q in ("p50_ms", "p95_ms", "p99_ms") if a[q] and b[q]}
            ratios.setdefault(name, {})[rate] = got
            console.print(f"{rate:>6,}/s  {slower} / {faster}: p50 x{got['p50_ms']}, p99 x{got.get('p99_ms')}")
    summary = {k: raw[k] for k in ("when", "machine", "settings")} | {
        "summary": [r.summary() for r in runs],
        "ratios": ratios,
        "raw": "latency-raw.json (not kept in git)",
    }
    (RESULTS / "latency.json").write_text(json.dumps(summary, indent=1))
    plot(runs, RESULTS / "latency.png")
    console.print(f"saved {RESULTS / 'latency.json'} and {RESULTS / 'latency.png'} (raw: latency-raw.json)")


def continuous_fetch_wait() -> int:
    from sluice.spec.continuous import SOURCE_DEFAULTS

    return int(SOURCE_DEFAULTS["kafka.fetch.max.wait.ms"])


def start_query(spark: Any, pipeline: Any, mode: str, work: Path) -> Any:
    """The branch's own query (jobs.stream.continuous), or the same transformation as micro-batches."""
    from jobs.stream import continuous
    from jobs.stream.parse import parse, read_kafka
    from sluice.spec.continuous import source_options

    if mode in ("continuous", "real_time"):
        return continuous.start(spark, pipeline)
    raw = read_kafka(spark, pipeline, source_options(pipeline.kafka.spark_options()))
    return (
        continuous.verdicts(parse(raw, pipeline), pipeline)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", pipeline.sink_bootstrap)
        .options(**continuous.SINK_OPTIONS)
        .option("checkpointLocation", str(work / "checkpoints" / "bench-micro-batch"))
        .trigger(processingTime="0 seconds")
        .start()
    )


if __name__ == "__main__":
    sys.exit(main())
