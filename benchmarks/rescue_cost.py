"""What the rescued map costs per record, and what a cheaper expression for it would save.

Rescued data (:mod:`sluice.spec.rescue`) casts every object of a record to a
``map<string,variant>`` and keeps the keys the schema does not declare. This script
evaluates that expression alone over cached VARIANTs of ``device_signals``-shaped records
(1 in 100 with an undeclared top-level field, 1 in 150 with one two levels down), beside:

- ``none``: a constant map (reading the cached column, the floor);
- ``key check``: a candidate that first lists each object's keys through a cast to
  ``map<string,binary>`` (objects and numbers become NULL without being copied) and builds
  the map of variants only for an object that has an undeclared key; nested objects are
  reached by path from the record instead of being copied out first.

Both expressions must give the same map for every record (checked before timing). Prints
the seconds of each round and writes ``benchmarks/results/trials/11-rescue-key-check.json``::

    .venv/bin/python benchmarks/rescue_cost.py [--records 600000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from sluice.spec import load_pipeline, rescue
from sluice.spec.columns import VARIANT
from sluice.spec.quarantine import json_path, lit
from sluice.spec.schema import Array, DataType, Map, Struct

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "trials" / "11-rescue-key-check.json"
NONE = "CAST(map() AS map<string,variant>)"


def key_check_sql(schema: Struct) -> str:
    """The candidate: the same map as :func:`sluice.spec.rescue.rescued_sql` without ``rescue`` fields."""

    def walk(t: DataType, v: str, at: str, path: str | None, depth: int) -> list[str]:
        k, x, e, i = f"k{depth}", f"x{depth}", f"e{depth}", f"i{depth}"
        child = lambda name: name if path is None else f"concat({path}, '.', {name})"  # noqa: E731
        if isinstance(t, Struct):
            names = f"array({', '.join(lit(f.name) for f in t.fields)})"
            keys = f"map_keys(try_variant_get({v}, {lit(at)}, 'map<string,binary>'))"
            members = f"try_variant_get({v}, {lit(at)}, 'map<string,variant>')"
            keyed = (
                f"transform_keys(map_filter({members}, ({k}, {x}) -> NOT array_contains({names}, {k})), "
                f"({k}, {x}) -> {child(rescue._display_sql(k))})"
            )
            out = [f"CASE WHEN exists({keys}, {k} -> NOT array_contains({names}, {k})) THEN {keyed} ELSE {NONE} END"]
            for f in t.fields:
                sub = json_path(f.name)
                if sub is not None and rescue._contains_struct(f.type):
                    out += walk(f.type, v, at + sub[1:], child(lit(rescue.display(f.name))), depth + 1)
            return out
        if isinstance(t, Array) and rescue._contains_struct(t.element):
            element = rescue._merge(walk(t.element, e, "$", f"concat({path or lit('')}, '[', {i}, ']')", depth + 1))
            each = f"transform(try_variant_get({v}, {lit(at)}, 'array<variant>'), ({e}, {i}) -> {element})"
            return [
                f"coalesce(aggregate({each}, {NONE}, (a{depth}, m{depth}) -> map_concat(a{depth}, m{depth})), {NONE})"
            ]
        if isinstance(t, Map) and rescue._contains_struct(t.value):
            entries = f"map_entries(try_variant_get({v}, {lit(at)}, 'map<string,variant>'))"
            value = rescue._merge(
                walk(t.value, f"{e}.value", "$", f"concat({path or lit('')}, '[', {e}.key, ']')", depth + 1)
            )
            each = f"transform({entries}, {e} -> {value})"
            return [
                f"coalesce(aggregate({each}, {NONE}, (a{depth}, m{depth}) -> map_concat(a{depth}, m{depth})), {NONE})"
            ]
        return []

    return rescue._merge(walk(schema, VARIANT, "$", None, 0))


def record(i: int, rnd: random.Random) -> str:
    r: dict = {
        "timestamp": 1_700_000_000 + i,
        "device": {
            "id": f"dev-{i % 250:04d}",
            "type": "camera",
            "firmware": "1.4.2",
            "location": {"lat": rnd.uniform(-60, 70), "lon": rnd.uniform(-170, 170)},
        },
        "signal": rnd.uniform(-95, -30),
        "battery": rnd.randint(0, 100),
        "tags": ["indoor", "maintenance"],
    }
    if i % 100 == 0:
        r["extra"] = {"z": 1}
    if i % 150 == 0:
        r["device"]["location"]["alt"] = 3
    return json.dumps(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=600_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rnd = random.Random(1)
    df = spark.createDataFrame([(record(i, rnd),) for i in range(args.records)], "j string").repartition(2)
    df = df.withColumn(VARIANT, F.expr("try_parse_json(j)")).cache()
    df.count()
    schema = load_pipeline(ROOT / "pipelines" / "device_signals.yaml").schema
    exprs = {"shipped": rescue.rescued_sql(schema, []), "key check": key_check_sql(schema), "none": NONE}
    differ = df.filter(F.expr(f"NOT (to_json({exprs['shipped']}) <=> to_json({exprs['key check']}))")).count()
    if differ:
        raise SystemExit(f"the candidate differs from the shipped expression on {differ} records")

    seconds: dict[str, list[float]] = {name: [] for name in exprs}
    for n in range(args.rounds):
        for name, expr in exprs.items():
            t = time.perf_counter()
            df.select(F.sum(F.size(F.expr(expr)))).first()
            seconds[name].append(round(time.perf_counter() - t, 3))
            print(f"round {n}: {name}: {seconds[name][-1]:.2f} s", flush=True)
    warm = {name: statistics.median(s[1:] or s) for name, s in seconds.items()}
    cost = {name: warm[name] - warm["none"] for name in ("shipped", "key check")}
    result = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"records": args.records, "rounds": args.rounds, "master": "local[2]"},
        "seconds": seconds,
        "warm_median_s": warm,
        "rescue_cost_s": cost,
        "ratio key check / shipped (rescue cost)": round(cost["key check"] / cost["shipped"], 3),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("warm_median_s", "ratio key check / shipped (rescue cost)")}))


if __name__ == "__main__":
    main()
