"""State size and batch time of the windowed example (``github_pushes``) at 1,000 and 10,000 keys.

The upstream table is written straight to Delta in ``--rounds`` commits of ``--rows`` rows
each (one micro-batch each), GitHub-push shaped: ``--keys`` repositories, event times
advancing a minute a round with a few minutes of disorder, 2 % repeats of an earlier event
id. Two ways read it, side by side in one run, each an available-now run per round:

- ``sluice``: the derived job itself (``jobs.stream.derive``): filter, deduplication within the
  watermark, 10-minute windows per repository, the late-row branch, Delta writes exactly
  once, the audit;
- ``plain spark``: the same query a user would write by hand: ``withWatermark``,
  ``dropDuplicatesWithinWatermark``, ``groupBy(window, repo)`` into Delta's streaming sink;
  late rows dropped silently, no quarantine, no audit.

Both on the RocksDB state store. Per data batch: its time (``triggerExecution``), the rows
in the state and the state's memory and files as Spark reports them.

    .venv/bin/python benchmarks/derived.py            # ~10 minutes on 2 cores

Prints the medians per way and key count; saves ``results/derived.json`` and ``results/derived.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from harness import RESULTS, ROOT, isolated_home

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def specs(home: Path, keys: int) -> tuple[Path, Path]:
    """An upstream spec (the github_events shape, Delta) and the shipped github_pushes example on it."""
    raw = yaml.safe_load((ROOT / "pipelines" / "github_events.yaml").read_text())
    raw |= {
        "name": f"raw_{keys}",
        "schema": str(ROOT / "schemas" / "github_event" / "v1.json"),
        "sink": {"format": "delta", "path": str(home / "tables" / f"raw_{keys}")},
        "checkpoint": str(home / "checkpoints" / f"raw_{keys}"),
    }
    pushes = yaml.safe_load((ROOT / "pipelines" / "github_pushes.yaml").read_text())
    pushes |= {
        "name": f"pushes_{keys}",
        "source": {"table": f"raw_{keys}"},
        "sink": {"format": "delta", "path": str(home / "tables" / f"pushes_{keys}")},
        "checkpoint": str(home / "checkpoints" / f"pushes_{keys}"),
    }
    folder = home / f"specs_{keys}"
    folder.mkdir()
    (folder / f"raw_{keys}.yaml").write_text(yaml.safe_dump(raw))
    (folder / f"pushes_{keys}.yaml").write_text(yaml.safe_dump(pushes, sort_keys=False))
    return folder / f"raw_{keys}.yaml", folder / f"pushes_{keys}.yaml"


def write_round(spark: Any, raw: Any, r: int, rows: int, keys: int, rng: random.Random, serial: list[int]) -> None:
    """One upstream commit: pushes (and some other events) over ``keys`` repositories."""
    from pyspark.sql import functions as F

    from sluice.spec import compatibility

    base = datetime(2021, 7, 21, tzinfo=UTC) + timedelta(minutes=r)
    data = []
    for _ in range(rows):
        if serial[0] > 100 and rng.random() < 0.02:
            eid = f"e{rng.randrange(1, serial[0])}"  # a repeat of an earlier event
        else:
            serial[0] += 1
            eid = f"e{serial[0]}"
        t = base - timedelta(seconds=rng.randrange(0, 240))
        kind = "PushEvent" if rng.random() < 0.8 else "WatchEvent"
        data.append((eid, kind, f"org/repo{rng.randrange(keys)}", rng.randrange(1, 6), t.replace(tzinfo=None)))
    df = spark.createDataFrame(
        data, "id string, type string, repo_name string, payload_size bigint, _event_time timestamp"
    )
    shape = compatibility.expected(raw)[0]
    cols = []
    for name, sql_type in shape.columns.items():
        if name in df.columns:
            cols.append(F.col(name).cast(sql_type or "string").alias(name))
        elif name == "date":
            cols.append(F.to_date("_event_time").alias("date"))
        else:
            cols.append(F.lit(None).cast(sql_type or "string").alias(name))
    df.select(*cols).write.format("delta").mode("append").partitionBy("date").save(raw.sink_path)


#: Spark's names for the two stateful operators of the example.
OPERATORS = {"dedupeWithinWatermark": "dedup", "stateStoreSave": "window"}


def state_of(progress: Any) -> dict[str, int]:
    ops = progress.get("stateOperators") or []
    custom = [o.get("customMetrics") or {} for o in ops]
    per_operator = {
        f"{OPERATORS.get(o.get('operatorName'), o.get('operatorName'))}_state_rows": int(o.get("numRowsTotal") or 0)
        for o in ops
    }
    return {
        "state_rows": sum(int(o.get("numRowsTotal") or 0) for o in ops),
        "state_memory_bytes": sum(int(o.get("memoryUsedBytes") or 0) for o in ops),
        "state_sst_bytes": sum(int(c.get("rocksdbSstFileSize") or 0) for c in custom),
    } | per_operator


def plain_query(spark: Any, pipeline: Any, checkpoint: str, out: str) -> Any:
    """What a user writes by hand for the same table: Spark's operators into Delta's own
    streaming sink (exactly once too, through its transaction log)."""
    from pyspark.sql import functions as F

    assert pipeline.upstream is not None
    return (
        spark.readStream.format("delta")
        .load(pipeline.upstream.sink_path)
        .withWatermark("_event_time", "10 minutes")
        .filter("type = 'PushEvent'")
        .dropDuplicatesWithinWatermark(["id"])
        .groupBy(F.window("_event_time", "10 minutes"), "repo_name")
        .agg(F.count(F.lit(1)).alias("pushes"), F.sum("payload_size").alias("commits"))
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(out)
    )


def measure(spark: Any, home: Path, keys: int, rounds: int, rows: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    from jobs.stream import derive
    from jobs.stream.events import EventLog
    from sluice.spec import load_pipeline

    raw_path, pushes_path = specs(home, keys)
    raw = load_pipeline(raw_path)
    rng, serial = random.Random(seed), [0]
    write_round(spark, raw, 0, rows, keys, rng, serial)
    pushes = load_pipeline(pushes_path)
    batches: dict[str, list[dict[str, Any]]] = {"sluice": [], "plain spark": []}
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    for r in range(rounds):
        if r:
            write_round(spark, raw, r, rows, keys, rng, serial)
        for way in ("sluice", "plain spark") if r % 2 == 0 else ("plain spark", "sluice"):
            if way == "sluice":
                query = derive.start(spark, pushes, EventLog(pushes.name, pushes.name), available_now=True)
            else:
                query = plain_query(spark, pushes, str(home / f"plain_cp_{keys}"), str(home / f"plain_{keys}"))
            query.awaitTermination()
            progress = list(query.recentProgress)
            total = sum(int((p.get("durationMs") or {}).get("triggerExecution", 0)) for p in progress)
            for p in progress:
                if p.get("numInputRows"):
                    ms = int((p.get("durationMs") or {}).get("triggerExecution", 0))
                    # round_ms adds the no-data batch after it, which writes the closed windows
                    batches[way].append(
                        {"round": r, "keys": keys, "batch_ms": ms, "round_ms": total, "rows": int(p["numInputRows"])}
                        | state_of(p)
                    )
        print(
            f"  {keys} keys, round {r + 1}/{rounds}: "
            + ", ".join(f"{w} {b[-1]['batch_ms']} ms" for w, b in batches.items()),
            flush=True,
        )
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--rows", type=int, default=20000, help="upstream rows per round")
    parser.add_argument("--warmup", type=int, default=2, help="rounds left out of the medians")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    home = isolated_home("sluice-bench-derived-")
    from jobs.session import local_session

    spark = local_session(
        "bench-derived", "local[2]", {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    started = time.time()
    results: dict[str, Any] = {"rows_per_round": args.rows, "rounds": args.rounds, "warmup": args.warmup, "runs": {}}
    for keys in args.keys:
        results["runs"][str(keys)] = measure(spark, home, keys, args.rounds, args.rows, args.seed)
    summary = {}
    for keys, ways in results["runs"].items():
        for way, batches in ways.items():
            steady = [b for b in batches if b["round"] >= args.warmup]
            summary[f"{way} @ {keys}"] = {
                "batch_ms_p50": statistics.median(b["batch_ms"] for b in steady),
                "round_ms_p50": statistics.median(b["round_ms"] for b in steady),
                "state_rows_max": max(b["state_rows"] for b in batches),
                "window_state_rows_max": max(b.get("window_state_rows", 0) for b in batches),
                "dedup_state_rows_max": max(b.get("dedup_state_rows", 0) for b in batches),
                "state_memory_mib_max": round(max(b["state_memory_bytes"] for b in batches) / 1_048_576, 2),
                "state_sst_mib_max": round(max(b["state_sst_bytes"] for b in batches) / 1_048_576, 2),
            }
        ratio = summary[f"sluice @ {keys}"]["batch_ms_p50"] / summary[f"plain spark @ {keys}"]["batch_ms_p50"]
        summary[f"ratio @ {keys}"] = {"sluice / plain spark batch time": round(ratio, 2)}
    results["summary"] = summary
    results["seconds"] = round(time.time() - started)
    results["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    for name, values in summary.items():
        print(f"{name:24} {values}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "derived.json").write_text(json.dumps(results, indent=1))
    plot(results)


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for keys, ways in results["runs"].items():
        for way, batches in ways.items():
            left.plot(
                [b["round"] for b in batches], [b["batch_ms"] for b in batches], marker="o", label=f"{way}, {keys} keys"
            )
            if way == "sluice":
                rounds = [b["round"] for b in batches]
                windows = [b.get("window_state_rows", 0) for b in batches]
                ids = [b.get("dedup_state_rows", 0) for b in batches]
                right.plot(rounds, windows, marker="o", label=f"windows, {keys} keys")
                right.plot(rounds, ids, marker="x", label=f"event ids, {keys} keys")
    left.set(title="data batch time (ms)", xlabel="round")
    right.set(title="rows in the state, per operator", xlabel="round", yscale="log")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "derived.png", dpi=110)


if __name__ == "__main__":
    main()
