"""What each parse stage costs alone, without Kafka or a table: the floor for issue 44's item 2.

    .venv/bin/python benchmarks/parse_cost.py [--records 200000] [--rounds 5]

The ablation (``make bench-ablation``) times whole streams, so a stage's cost there carries
the read from the broker and the Delta write, and differences under a second are lost in the
spread. Here the records the ablation sends (the shipped ``device_signals`` spec, 1 % bad of
every kind, 5 % of the good ones with two undeclared fields) sit in a cached DataFrame shaped
like Kafka's rows, and each variant's rows go to Spark's ``noop`` sink, which evaluates every
column and writes nothing. The variants:

- the ablation's parse stages, each adding one thing (:func:`ablation.probed`);
- ``reference parse``: :func:`jobs.stream.parse.parse` for every record without the one pass, and
  the output columns, as the batch writer reads them;
- ``sluice parse``: the same with the one pass first (what the job runs);
- ``VARIANT alone``: ``try_parse_json`` and the typed columns read from it by ``variant_get``,
  with no ``from_json``: the least a parse that reads each record once as a VARIANT could cost;
- ``JVM one pass``: :mod:`jobs.stream.one_pass`, the value's bytes read once in the JVM into the
  typed columns and the rescued fields (``make setup`` builds its jar).

Rounds alternate the order; the first round is a warm-up and is left out of the medians.
Prints each variant's median seconds and ratio to ``plain``, and writes
``benchmarks/results/trials/14-parse-cost.json`` (``--out`` for another file).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from ablation import ORDER, PARTITIONS, SPEC, commit, probed, records
from harness import RESULTS

PARSE_STAGES = ORDER[: ORDER.index("reason") + 1]
OUT = RESULTS / "trials" / "14-parse-cost.json"


def values(n: int, bad_fraction: float, rescued_fraction: float) -> list[bytes | None]:
    """The ablation's records (:func:`ablation.records`, repeated as :func:`ablation.fill` sends them), as bytes."""
    pool = [value for value, _good in records(min(n, 20_000), bad_fraction, rescued_fraction)]
    return [pool[i % len(pool)] for i in range(n)]


def variant_alone(raw: Any, pipeline: Any) -> Any:
    """The typed columns read from one VARIANT parse, with no ``from_json``."""
    from pyspark.sql import functions as F

    from sluice.spec import eventtime
    from sluice.spec import quarantine as q
    from sluice.spec.columns import VARIANT
    from sluice.spec.flatten import PARSED

    ddl = q._ddl(pipeline.schema, set())
    et = pipeline.event_time
    event_field = pipeline.schema.find(et.field)
    df = raw.select(F.expr("try_parse_json(CAST(value AS STRING))").alias(VARIANT))
    df = df.withColumn(PARSED, F.expr(f"try_variant_get({VARIANT}, '$', {q.lit(ddl)})"))
    df = df.withColumn(
        q.EVENT_TS, F.expr(eventtime.event_time_sql(q.parsed_sql(et.field), et.format, event_field.type))
    )
    dp = pipeline.spec.date_partition
    return df.select(
        *[F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns],
        F.expr(eventtime.date_sql(q.EVENT_TS, dp.timezone)).alias(dp.column),
    )


def sluice_parse(raw: Any, pipeline: Any, one_pass_first: bool = True) -> Any:
    """:func:`jobs.stream.parse.parse` with every column the writer reads from it: the output
    columns, the reason and the rescued fields; ``one_pass_first=False``: the reference
    parse for every record, as before the one pass."""
    from pyspark.sql import functions as F

    from jobs.stream.parse import parse, rescued_json
    from sluice.spec import eventtime
    from sluice.spec import quarantine as q
    from sluice.spec.columns import REASON, RESCUED

    dp = pipeline.spec.date_partition
    return parse(raw, pipeline, one_pass_first).select(
        *[F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns],
        F.col(REASON),
        F.expr(rescued_json()).alias(RESCUED),
        F.expr(eventtime.date_sql(q.EVENT_TS, dp.timezone)).alias(dp.column),
    )


def one_pass(raw: Any, pipeline: Any) -> Any:
    """The typed columns and the rescued fields from one pass of ``sluice.parse.OnePass``
    (:mod:`jobs.stream.one_pass`) over each value's bytes; a record it leaves to the reference parse
    is NULL here (the 1 % bad and nothing else, on this data)."""
    from pyspark.sql import functions as F

    from jobs.stream import one_pass
    from sluice.spec import eventtime
    from sluice.spec import quarantine as q
    from sluice.spec.columns import RESCUED
    from sluice.spec.flatten import PARSED

    one_pass.register(raw.sparkSession, pipeline)
    et = pipeline.event_time
    event_field = pipeline.schema.find(et.field)
    df = raw.select(one_pass.read("value", pipeline).alias("__one"))
    df = df.select(F.col("__one.data").alias(PARSED), F.col("__one.rescued").alias("__rescued_text"))
    df = df.withColumn(
        q.EVENT_TS, F.expr(eventtime.event_time_sql(q.parsed_sql(et.field), et.format, event_field.type))
    )
    dp = pipeline.spec.date_partition
    return df.select(
        *[F.expr(c.expr).alias(c.name) for c in pipeline.plan.columns],
        F.expr(one_pass.rescued_json("__rescued_text")).alias(RESCUED),
        F.expr(eventtime.date_sql(q.EVENT_TS, dp.timezone)).alias(dp.column),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bad-fraction", type=float, default=0.01)
    ap.add_argument("--rescued-fraction", type=float, default=0.05)
    ap.add_argument("--only", help="comma-separated variants to run (plain is always run)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    from jobs.session import local_session
    from sluice.spec import load_pipeline

    spark = local_session("bench-parse-cost", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    pipeline = load_pipeline(str(SPEC))
    rows = [
        (None, v, "signals", i % PARTITIONS, i // PARTITIONS, datetime(2026, 11, 28, tzinfo=UTC))
        for i, v in enumerate(values(args.records, args.bad_fraction, args.rescued_fraction))
    ]
    schema = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
    raw = spark.createDataFrame(rows, schema).repartition(2).cache()
    raw.count()
    del rows

    variants: dict[str, Any] = {stage: probed(raw, pipeline, stage) for stage in PARSE_STAGES}
    variants["reference parse"] = sluice_parse(raw, pipeline, one_pass_first=False)
    variants["sluice parse"] = sluice_parse(raw, pipeline)
    variants["VARIANT alone"] = variant_alone(raw, pipeline)
    variants["JVM one pass"] = one_pass(raw, pipeline)
    if args.only:
        keep = {"plain", *args.only.split(",")}
        variants = {name: df for name, df in variants.items() if name in keep}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for n in range(args.rounds):
        for name in names if n % 2 == 0 else reversed(names):
            t = time.perf_counter()
            variants[name].write.format("noop").mode("overwrite").save()
            seconds[name].append(round(time.perf_counter() - t, 3))
            print(f"round {n}: {name}: {seconds[name][-1]:.2f} s", flush=True)
    median = {name: round(statistics.median(s[1:] or s), 3) for name, s in seconds.items()}
    result = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit("HEAD"),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "settings": {
            "records": args.records,
            "rounds": args.rounds,
            "bad_fraction": args.bad_fraction,
            "rescued_fraction": args.rescued_fraction,
            "master": "local[2]",
        },
        "seconds": seconds,
        "median_s": median,
        "ratio_to_plain": {name: round(s / median["plain"], 2) for name, s in median.items()},
    }
    with open(args.out, "w") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    for name in names:
        print(f"{name:24s} {median[name]:7.2f} s  x{result['ratio_to_plain'][name]:.2f} plain")


if __name__ == "__main__":
    main()
