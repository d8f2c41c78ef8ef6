"""In-stream expectations: ingest throughput with and without the row rules, side by side.

    .venv/bin/python benchmarks/expectations.py                       # 300,000 payments, 5 rounds
    .venv/bin/python benchmarks/expectations.py --records 1000000 --rounds 6

One embedded broker and one local Spark session (local[2]). The topic is filled once with
generated payments (``--bad-fraction`` of them unparseable). Each round then ingests all of
it, available-now, into fresh tables, once as ``pipelines/payments.yaml`` declares it (its
five row rules: drop, fail and warn) and once with its expectations removed; the order
alternates between rounds so that neither variant always runs on a warmer JVM. A first,
unmeasured run warms the JIT. Throughput is records / seconds of the query run; the
overhead is the ratio of the two in the same round, and the median over rounds is quoted.
Every run must reconcile (records in = rows out + quarantined) or the benchmark stops.

Figures are printed and saved to ``benchmarks/results/expectations.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from harness import RESULTS, ROOT, isolated_home

VARIANTS = ("without rules", "with rules")


def spec(work: Path, variant: str, run: int) -> dict[str, Any]:
    s: dict[str, Any] = yaml.safe_load((ROOT / "pipelines" / "payments.yaml").read_text())
    s["name"] = f"bench_{run}"
    s["schema"] = str(ROOT / "schemas" / "payment" / "v1.json")
    s["sink"]["path"] = str(work / "tables" / s["name"])
    s["checkpoint"] = str(work / "checkpoints" / s["name"])
    s["source"]["topics"] = ["bench-payments"]
    s["expectations"] = {"rows": s["expectations"]["rows"]} if variant == "with rules" else {}
    return s


def ingest(spark: Any, work: Path, variant: str, run: int) -> dict[str, Any]:
    from jobs.stream.modes import run as run_query
    from sluice.spec import parse_pipeline

    pipeline = parse_pipeline(spec(work, variant, run), ROOT / "pipelines" / "payments.yaml")
    start = time.perf_counter()
    error = run_query(spark, pipeline, available_now=True)
    seconds = time.perf_counter() - start
    if error is not None:
        raise SystemExit(f"{variant}: the query failed: {error}")
    totals = {"records_in": 0, "records_out": 0, "records_quarantined": 0, "batches": 0}
    for f in Path(pipeline.audit_path).glob("*.json"):
        audit = json.loads(f.read_text())
        totals["batches"] += 1
        for key in ("records_in", "records_out", "records_quarantined"):
            totals[key] += audit[key]
    if totals["records_in"] != totals["records_out"] + totals["records_quarantined"]:
        raise SystemExit(f"{variant}: counts do not reconcile: {totals}")
    shutil.rmtree(pipeline.sink_path, ignore_errors=True)
    shutil.rmtree(pipeline.quarantine_path, ignore_errors=True)
    return {"variant": variant, "seconds": round(seconds, 3), **totals}


def plot(rounds: list[dict[str, Any]], ratio: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for i, variant in enumerate(VARIANTS):
        xs = [r["round"] + (i - 0.5) * width for r in rounds]
        ys = [r[variant]["records_per_s"] for r in rounds]
        ax.bar(xs, ys, width, label=variant)
    ax.set_xticks([r["round"] for r in rounds])
    ax.set_xlabel("round (each runs both variants, order alternating)")
    ax.set_ylabel("records / s (ingest, available-now)")
    ax.set_title(f"payments ingest, 5 row rules: median throughput ratio {ratio:.3f}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bad-fraction", type=float, default=0.01)
    args = parser.parse_args()

    work = isolated_home("sluice-bench-expectations-")
    from rich.console import Console
    from rich.table import Table

    from jobs.session import local_session
    from sluice.dev.broker import EmbeddedBroker
    from sluice.dev.generate import EventGenerator
    from sluice.dev.produce import send, synthetic
    from sluice.spec import parse_pipeline
    from sluice.topics import create_topics

    console = Console(width=150)
    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    spark = None
    rounds: list[dict[str, Any]] = []
    try:
        create_topics(broker.bootstrap, ["bench-payments"], partitions=2)
        pipeline = parse_pipeline(spec(work, "with rules", 0), ROOT / "pipelines" / "payments.yaml")
        report = send(
            broker.bootstrap,
            "bench-payments",
            synthetic(EventGenerator(pipeline, seed=7), args.records, args.bad_fraction),
        )
        console.print(f"sent {args.records:,} payments in {report.seconds:.1f}s")
        spark = local_session("sluice-bench-expectations", master="local[2]", conf={"spark.ui.enabled": "false"})
        warm = ingest(spark, work, "with rules", 0)
        console.print(f"warm-up run: {warm}")
        for n in range(1, args.rounds + 1):
            order = VARIANTS if n % 2 else VARIANTS[::-1]
            result: dict[str, Any] = {"round": n}
            for variant in order:
                r = ingest(spark, work, variant, 2 * n + order.index(variant))
                r["records_per_s"] = round(r["records_in"] / r["seconds"])
                result[variant] = r
            result["ratio"] = round(result["with rules"]["records_per_s"] / result["without rules"]["records_per_s"], 4)
            rounds.append(result)
            console.print(
                f"round {n}: without {result['without rules']['records_per_s']:,}/s, "
                f"with {result['with rules']['records_per_s']:,}/s, ratio {result['ratio']:.3f}"
            )
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    ratio = statistics.median(r["ratio"] for r in rounds)
    table = Table("round", "order", "without rules, records/s", "with rules, records/s", "ratio", "batches")
    for r in rounds:
        table.add_row(
            str(r["round"]),
            "without first" if r["round"] % 2 else "with first",
            f"{r['without rules']['records_per_s']:,}",
            f"{r['with rules']['records_per_s']:,}",
            f"{r['ratio']:.3f}",
            str(r["with rules"]["batches"]),
        )
    console.print(table)
    console.print(f"median throughput ratio (with / without rules): {ratio:.3f} -> overhead {100 * (1 - ratio):.1f} %")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "expectations.json").write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "system": platform.platform(),
                },
                "settings": {"records": args.records, "bad_fraction": args.bad_fraction, "master": "local[2]"},
                "median_ratio": ratio,
                "rounds": rounds,
            },
            indent=2,
        )
    )
    plot(rounds, ratio, RESULTS / "expectations.png")
    console.print(f"saved {RESULTS / 'expectations.json'} and {RESULTS / 'expectations.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
