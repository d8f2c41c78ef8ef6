"""Query latency of the SQL endpoint against ``sluice sql`` without it.

A table of ``--rows`` rows (default 1 million, 10 date partitions, plus a quarantine) is
written in the shape of the device-signal pipeline's output, with Spark, straight to Delta:
query latency depends on the table, not on how it was filled. Then three queries, each
``--runs`` times after ``--warmup`` unmeasured runs:

- ``count``: ``SELECT count(*)``;
- ``group by date``: rows per date partition;
- ``one partition``: count and average of one date (partition pruning).

Three ways, side by side in one run:

- ``endpoint``: a DB-API connection to the endpoint (PyHive), as a BI tool or
  ``sluice sql`` holds it: the statement's round trip;
- ``sluice sql via endpoint``: the whole command, Python start-up included;
- ``sluice sql, no endpoint``: the whole command, which then starts its own Spark.

    .venv/bin/python benchmarks/sql.py                 # ~20 minutes on 2 cores
    .venv/bin/python benchmarks/sql.py --cold-runs 5   # fewer runs of the slow way

Prints p50 and p95 per query and way; saves ``results/sql.json`` and ``results/sql.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from harness import RESULTS, ROOT, free_port, isolated_home

NAME = "bench_signals"
DAYS = 10
QUERIES = {
    "count": "SELECT count(*) FROM bench_signals",
    "group by date": "SELECT date, count(*) FROM bench_signals GROUP BY date ORDER BY date",
    "one partition": "SELECT count(*), avg(signal) FROM bench_signals WHERE date = '2026-11-05'",
}


def write_tables(home: Path, rows: int) -> Path:
    """The pipeline's spec in its own folder, and its table and quarantine, written by Spark."""
    from jobs.session import local_session

    spec = yaml.safe_load((ROOT / "pipelines" / "device_signals.yaml").read_text())
    spec.update(
        name=NAME,
        schema=str(ROOT / "schemas" / "device_signal" / "v1.json"),
        sink={"format": "delta", "path": str(home / "tables" / NAME)},
        checkpoint=str(home / "checkpoints" / NAME),
    )
    spec.pop("expectations", None)
    specs = home / "pipelines"
    specs.mkdir()
    (specs / f"{NAME}.yaml").write_text(yaml.safe_dump(spec))
    spark = local_session("bench-sql-write", conf={"spark.ui.enabled": "false"})
    try:
        table = spark.range(rows).selectExpr(
            "concat('dev-', cast(id % 5000 AS string)) AS device_id",
            "element_at(array('phone', 'sensor', 'gateway'), cast(id % 3 AS int) + 1) AS device_type",
            "-30 - (id % 70) AS signal",
            "'bench' AS _kafka_topic",
            "cast(id % 2 AS int) AS _kafka_partition",
            "id AS _kafka_offset",
            f"format_string('2026-11-%02d', cast(id % {DAYS} AS int) + 1) AS date",
        )
        table.repartition(4, "date").write.format("delta").partitionBy("date").save(spec["sink"]["path"])
        bad = spark.range(rows // 100).selectExpr(
            "'not json' AS reason", "cast(id % 2 AS int) AS _kafka_partition", "'2026-11-05' AS date"
        )
        bad.write.format("delta").partitionBy("date").save(spec["sink"]["path"] + "_quarantine")
    finally:
        spark.stop()
    return specs


def timed(fn: Any, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def cli(query: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "sql", query, "--format", "csv"], capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1),
        "runs": len(ordered),
    }


def plot(results: list[dict[str, Any]], path: Path, rows: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ways = list(dict.fromkeys(r["way"] for r in results))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(ways)
    for i, way in enumerate(ways):
        values = [next(r["p50_ms"] for r in results if r["way"] == way and r["query"] == q) for q in QUERIES]
        ax.bar([x + i * width for x in range(len(QUERIES))], values, width, label=way)
    ax.set_xticks([x + width * (len(ways) - 1) / 2 for x in range(len(QUERIES))], list(QUERIES))
    ax.axhline(300, color="red", linestyle="--", label="target: 300 ms")
    ax.set_yscale("log")
    ax.set_ylabel("p50 latency (ms, log scale)")
    ax.set_title(f"SQL on a {rows:,}-row Delta table, {os.cpu_count()} cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20, help="measured runs per query through the endpoint")
    parser.add_argument("--cold-runs", type=int, default=20, help="measured runs per query without the endpoint")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    home = isolated_home("sluice-bench-sql-")
    os.environ["SLUICE_PIPELINES"] = str(write_tables(home, args.rows))

    from sluice.ops import sql
    from sluice.ops.target import LocalTarget
    from sluice.sql.client import EndpointSession
    from sluice.sql.settings import Endpoint

    results = []

    def record(way: str, query: str, samples: list[float]) -> None:
        results.append({"way": way, "query": query, **summary(samples), "samples_ms": [round(s, 1) for s in samples]})
        r = results[-1]
        print(f"{way:<26} {query:<14} p50 {r['p50_ms']:>9.1f} ms   p95 {r['p95_ms']:>9.1f} ms   ({r['runs']} runs)")

    for query, text in QUERIES.items():  # first, while no endpoint runs
        record("sluice sql, no endpoint", query, timed(lambda t=text: cli(t), args.cold_runs, 0))

    endpoint = Endpoint("127.0.0.1", free_port())
    sql.serve(LocalTarget(), endpoint, by="benchmark")
    try:
        session = EndpointSession("127.0.0.1", endpoint.port, auth="none")
        for query, text in QUERIES.items():
            record("endpoint", query, timed(lambda t=text: session.run(t), args.runs, args.warmup))
        session.close()
        for query, text in QUERIES.items():
            record("sluice sql via endpoint", query, timed(lambda t=text: cli(t), args.runs, 1))
    finally:
        sql.stop(by="benchmark")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "cores": os.cpu_count(),
        "rows": args.rows,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    (RESULTS / "sql.json").write_text(json.dumps(out, indent=1))
    plot(results, RESULTS / "sql.png", args.rows)
    print(f"saved {RESULTS / 'sql.json'} and sql.png")


if __name__ == "__main__":
    main()
