"""Memory of the whole embedded stack: Airflow standalone, the Kafka broker and one stream.

Each variant starts the broker, Airflow standalone (API server, scheduler with its
LocalExecutor workers, DAG processor, triggerer) and one stream (`sluice start
device_signals`), lets them settle, then samples the resident memory (RSS) and the
proportional share (PSS: shared pages split between the processes that map them) of each
component's process tree. Variants, side by side in one run:

- ``sized``: what `sluice airflow` sets (one LocalExecutor worker per core, one parser);
- ``airflow defaults``: Airflow's own (parallelism 32, two DAG-parsing processes).

    .venv/bin/python benchmarks/memory.py            # ~6 minutes on 2 cores

Prints a table and saves ``results/memory.json`` and ``results/memory.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from harness import RESULTS, free_port, isolated_home

GIB = 1024**3
VARIANTS = {
    "sized": {},
    "airflow defaults": {
        "AIRFLOW__CORE__PARALLELISM": "32",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "2",
    },
}


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def usage(procs: list[psutil.Process]) -> tuple[int, int, int]:
    """(RSS, PSS, processes) of live processes."""
    rss = pss = n = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss, n = rss + info.rss, pss + getattr(info, "pss", info.rss), n + 1
    return rss, pss, n


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our own http://127.0.0.1 URL
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def measure(variant: str, extra_env: dict[str, str], settle: float, samples: int) -> dict[str, Any]:
    from sluice.airflow.env import airflow_binary, airflow_env
    from sluice.dev.broker import EmbeddedBroker
    from sluice.dev.generate import EventGenerator
    from sluice.dev.produce import send, synthetic
    from sluice.ops import stream
    from sluice.ops.target import LocalTarget
    from sluice.spec import load_pipeline
    from sluice.topics import create_topics

    home = isolated_home("sluice-memory-")
    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    port = free_port()
    env = (
        os.environ
        | airflow_env(port=port)
        | {"AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        | extra_env
    )
    log = (home / "standalone.log").open("wb")
    airflow = subprocess.Popen(
        [str(airflow_binary()), "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    pipeline = load_pipeline("device_signals")
    try:
        create_topics(broker.bootstrap, pipeline.kafka.topics or [], partitions=2)
        send(broker.bootstrap, "device-signals", synthetic(EventGenerator(pipeline, seed=1), 5000))
        wait_http(f"http://127.0.0.1:{port}/api/v2/monitor/health", 300)
        started = stream.start(pipeline, LocalTarget(), by="benchmarks/memory.py")
        time.sleep(settle)
        rows: dict[str, list[tuple[int, int, int]]] = {"airflow": [], "kafka": [], "stream": []}
        for _ in range(samples):
            rows["airflow"].append(usage(tree(airflow.pid)))
            rows["kafka"].append(usage(tree(broker.pid() or 0)))
            rows["stream"].append(usage(tree(started.driver.pid)))
            time.sleep(5)
        stream.stop(pipeline, by="benchmarks/memory.py")
    finally:
        os.killpg(airflow.pid, 15)
        try:
            airflow.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(airflow.pid, 9)
        broker.stop()
        log.close()
    parts = {
        name: {
            "rss_gib": round(statistics.median(s[0] for s in got) / GIB, 3),
            "pss_gib": round(statistics.median(s[1] for s in got) / GIB, 3),
            "processes": int(statistics.median(s[2] for s in got)),
        }
        for name, got in rows.items()
    }
    total_rss = round(sum(p["rss_gib"] for p in parts.values()), 3)
    total_pss = round(sum(p["pss_gib"] for p in parts.values()), 3)
    return {
        "variant": variant,
        "env": extra_env,
        "parts": parts,
        "total_rss_gib": total_rss,
        "total_pss_gib": total_pss,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["variant"] for r in results]
    bottom = [0.0] * len(results)
    for part in ("airflow", "kafka", "stream"):
        values = [r["parts"][part]["rss_gib"] for r in results]
        ax.bar(names, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.axhline(3.0, color="red", linestyle="--", label="target 3 GiB")
    ax.set_ylabel("RSS (GiB), median of samples")
    ax.set_title(f"Embedded stack memory on {os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=60, help="seconds after the stream starts before sampling")
    parser.add_argument("--samples", type=int, default=6, help="samples, 5 s apart")
    args = parser.parse_args()
    results = [measure(name, env, args.settle, args.samples) for name, env in VARIANTS.items()]
    print(f"{'variant':<18} {'airflow':>16} {'kafka':>12} {'stream':>12} {'total RSS':>10} {'total PSS':>10}")
    for r in results:
        p = r["parts"]
        print(
            f"{r['variant']:<18} {p['airflow']['rss_gib']:>7.2f} GiB ({p['airflow']['processes']:>2} p)"
            f" {p['kafka']['rss_gib']:>8.2f} GiB {p['stream']['rss_gib']:>8.2f} GiB"
            f" {r['total_rss_gib']:>6.2f} GiB {r['total_pss_gib']:>6.2f} GiB"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"cores": os.cpu_count(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": results}
    (RESULTS / "memory.json").write_text(json.dumps(out, indent=1))
    plot(results, RESULTS / "memory.png")
    print(f"saved {RESULTS / 'memory.json'} and memory.png")


if __name__ == "__main__":
    main()
