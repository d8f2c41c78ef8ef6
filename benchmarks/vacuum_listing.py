"""What the maintenance job's VACUUM costs with Spark's listing parallelism and with Sluice's.

Delta's VACUUM lists a table's folders in ``spark.sql.sources.parallelPartitionDiscovery.parallelism``
Spark tasks: 10,000 by default, whatever the table's size. Sluice's jobs run with
:data:`sluice.runtime.BASE_CONF`'s value. This script writes a small date-partitioned Delta
table (``--appends`` appends of 20 rows), compacts it as the maintenance job does, then times
VACUUM with the default and with Sluice's setting in turn, ``--rounds`` times each, in one
Spark session (``local[2]``). Prints each round and writes
``benchmarks/results/trials/12-vacuum-listing.json``::

    .venv/bin/python benchmarks/vacuum_listing.py [--appends 15] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "trials" / "12-vacuum-listing.json"
KEY = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from delta.tables import DeltaTable

    from jobs.session import local_session
    from sluice.runtime import BASE_CONF

    spark = local_session("vacuum-listing", "local[2]")
    path = str(Path(tempfile.mkdtemp(prefix="sluice-vacuum-")) / "t")
    rows = spark.range(20).selectExpr("id", "current_date() AS date")
    for _ in range(args.appends):
        rows.write.format("delta").mode("append").partitionBy("date").save(path)
    table = DeltaTable.forPath(spark, path)
    table.optimize().executeCompaction().collect()

    variants = {"Spark's default (10000)": "10000", f"Sluice's ({BASE_CONF[KEY]})": BASE_CONF[KEY]}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, value in variants.items():  # side by side, in turn
            spark.conf.set(KEY, value)
            began = time.perf_counter()
            table.vacuum(168.0)
            seconds[name].append(time.perf_counter() - began)
            print(f"round {round_ + 1}: VACUUM with {name}: {seconds[name][-1]:.1f} s", flush=True)
    spark.stop()

    medians = {name: statistics.median(s) for name, s in seconds.items()}
    default, sluice = medians.values()
    print(f"median: default {default:.1f} s, Sluice {sluice:.1f} s, x{default / sluice:.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).date().isoformat(),
                "appends": args.appends,
                "seconds": seconds,
                "median_seconds": medians,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
