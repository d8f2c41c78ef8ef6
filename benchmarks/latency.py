"""End-to-end latency: the same fraud query in micro-batch and in continuous mode, side by side.

    .venv/bin/python benchmarks/latency.py                    # rates 100, 1000, 10000 events/s
    .venv/bin/python benchmarks/latency.py --rates 1000 --measure 20

One embedded Kafka broker and one local Spark session (local[2], as many slots as the
input topic has partitions). For each rate, a producer sends payments at that fixed rate
for ``--warmup`` + ``--measure`` seconds; a consumer reads the verdicts and takes, per
event, its latency = receive time minus the input record's Kafka CreateTime (set by the
producer when it sent the event, carried into the verdict as ``source.timestamp``). Only
events sent during the measurement window count. The query is parse (``from_json``) +
filter + rule, ``emit: all`` so every event yields a verdict; micro-batch runs with a
processing-time trigger of 0, continuous with a 1-second checkpoint interval.

The floor is the same produce-then-consume path through the broker with no Spark between.
Figures are printed as a table and saved to ``benchmarks/results/latency.json`` and
``latency.png`` (CDF per mode at each rate). Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
PARTITIONS = 2
RULES = {
    "large_amount": "amount > 2000",
    "cross_border_online": "channel = 'online' AND card_country <> merchant_country",
}
# Low-latency client settings, the same for every mode (librdkafka's defaults wait up to 500 ms for a fetch).
PRODUCER = {"linger.ms": 0, "acks": 1, "enable.idempotence": False, "socket.nagle.disable": True}
CONSUMER = {
    "fetch.wait.max.ms": 5,
    "fetch.min.bytes": 1,
    "socket.nagle.disable": True,
    "auto.offset.reset": "latest",
    "enable.auto.commit": False,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    mode: str
    rate: int
    sent: int = 0
    received: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.latencies_ms)

        def pct(p: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 2) if xs else None

        return {
            "mode": self.mode,
            "rate": self.rate,
            "sent": self.sent,
            "measured": len(xs),
            "throughput_per_s": round(self.received / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "max_ms": round(xs[-1], 2) if xs else None,
        }


def produce_at(bootstrap: str, topic: str, values: list[bytes], rate: int, seconds: float) -> tuple[int, float]:
    """Send ``rate`` events per second for ``seconds``, paced against the clock; return (sent, start)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
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
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.05)
            if msg is not None and not self.ready.is_set():
                self.ready.set()
            if msg is None:
                if self.consumer.assignment():
                    self.ready.set()
                continue
            if msg.error() is not None:
                continue
            now = time.time()
            if self.sent_at == "create_time":
                sent = msg.timestamp()[1] / 1000
            else:
                ts = json.loads(msg.value())["source"]["timestamp"]
                sent = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
            self.samples.append((sent, (now - sent) * 1000))
        self.consumer.close()


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
) -> Run:
    collector = Collector(bootstrap, out_topic, sent_at)
    collector.start()
    collector.ready.wait(30)
    time.sleep(1)
    sent, started = produce_at(bootstrap, in_topic, values, rate, warmup + seconds)
    time.sleep(3)  # drain what is still in flight
    collector.stop.set()
    collector.join()
    window = (started + warmup, started + warmup + seconds)
    inside = [lat for at, lat in collector.samples if window[0] <= at <= window[1]]
    run = Run(mode, rate, sent=sent, received=len(inside), seconds=seconds, latencies_ms=inside)
    return run


def verdict_values(pipeline: Any, n: int = 5000) -> list[bytes]:
    from sluice.generate import EventGenerator

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
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--measure", type=float, default=15.0)
    parser.add_argument("--modes", nargs="+", default=["floor", "continuous", "micro_batch"])
    parser.add_argument("--fetch-wait-ms", type=int, default=10, help="Spark's Kafka consumer fetch.max.wait.ms")
    parser.add_argument("--poll-interval-ms", type=int, default=10, help="continuous executorPollIntervalMs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    port = free_port()
    os.environ.update(
        SLUICE_HOME=str(work),
        SLUICE_JARS=os.environ.get("SLUICE_JARS") or str(ROOT / ".sluice" / "jars"),
        SLUICE_KAFKA_PORT=str(port),
        SLUICE_KAFKA_CONTROLLER_PORT=str(free_port()),
        SLUICE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    from rich.console import Console
    from rich.table import Table

    from sluice.broker import EmbeddedBroker
    from sluice.spec import parse_pipeline
    from sluice.topics import create_topics

    console = Console()
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
                "options": {"kafka.fetch.max.wait.ms": str(args.fetch_wait_ms)},
            },
            "schema": str(ROOT / "schemas" / "payment" / "v1.json"),
            "event_time": {"field": "created_at", "format": "iso8601"},
            "sink": {"format": "kafka", "topic": "bench-out"},
            "checkpoint": str(work / "checkpoints" / "bench"),
            "continuous": {
                "checkpoint_interval": "1 second",
                "rules": RULES,
                "emit": "all",
                "filter": "amount IS NOT NULL",
            },
        }
        pipeline = parse_pipeline(spec, ROOT / "benchmarks" / "bench.yaml")
        create_topics(broker.bootstrap, ["bench-in", "bench-out", "bench-out-quarantine"], PARTITIONS)
        values = verdict_values(pipeline)

        for mode in args.modes:
            query = None
            if mode != "floor":
                if spark is None:
                    from jobs.session import local_session

                    spark = local_session(
                        "sluice-bench",
                        master=f"local[{PARTITIONS}]",
                        conf={
                            "spark.ui.enabled": "false",
                            "spark.sql.streaming.continuous.executorPollIntervalMs": str(args.poll_interval_ms),
                        },
                    )
                query = start_query(spark, pipeline, mode, work)
                time.sleep(10)  # the query is planned and its tasks are running
            # The floor reads the input topic itself, timed by each record's own CreateTime.
            out_topic, sent_at, label = (
                ("bench-in", "create_time", "floor (no Spark)") if query is None else ("bench-out", "source", mode)
            )
            try:
                for rate in args.rates:
                    run = measure(
                        broker.bootstrap, "bench-in", out_topic, sent_at, label, values, rate, args.warmup, args.measure
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

    table = Table("mode", "rate/s", "measured", "throughput/s", "p50 ms", "p95 ms", "p99 ms", "max ms")
    for run in runs:
        s = run.summary()
        table.add_row(
            *(
                str(s[k])
                for k in ("mode", "rate", "measured", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms")
            )
        )
    console.print(table)
    ratios = {}
    for rate in args.rates:
        by_mode = {r.mode: r.summary() for r in runs if r.rate == rate}
        mb, cont = by_mode.get("micro_batch"), by_mode.get("continuous")
        if mb and cont and mb["p50_ms"] and cont["p50_ms"]:
            ratios[rate] = {q: round(mb[q] / cont[q], 1) for q in ("p50_ms", "p95_ms", "p99_ms") if mb[q] and cont[q]}
            console.print(
                f"{rate:>6,}/s  micro-batch / continuous: p50 x{ratios[rate]['p50_ms']}, p99 x{ratios[rate].get('p99_ms')}"
            )

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "settings": {
            "partitions": PARTITIONS,
            "warmup_s": args.warmup,
            "measure_s": args.measure,
            "producer": PRODUCER,
            "consumer": CONSUMER,
            "checkpoint_interval": "1 second",
            "micro_batch_trigger": "processingTime=0",
        },
        "summary": [r.summary() for r in runs],
        "ratio_micro_batch_over_continuous": ratios,
        "raw": [asdict(r) for r in runs],
    }
    (RESULTS / "latency.json").write_text(json.dumps(out, indent=1))
    plot(runs, RESULTS / "latency.png")
    console.print(f"saved {RESULTS / 'latency.json'} and {RESULTS / 'latency.png'}")
    return 0


def start_query(spark: Any, pipeline: Any, mode: str, work: Path) -> Any:
    """The branch's own query (jobs.continuous), or the same transformation as micro-batches."""
    from jobs import continuous
    from jobs.parse import parse, read_kafka

    if mode == "continuous":
        return continuous.start(spark, pipeline)
    raw = read_kafka(spark, pipeline)
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
