"""``sluice demo``: the pipelines end to end, and their tables shown."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sluice.cli.broker import print_report
from sluice.cli.output import console, fail, load, warn
from sluice.cli.quality import validate_and_show

if TYPE_CHECKING:
    from sluice.spec import Pipeline


def _show(df: Any, limit: int, title: str | None = None) -> None:
    from rich.table import Table

    rows = df.limit(limit + 1).collect()
    table = Table(*df.columns, title=title)
    for r in rows[:limit]:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)
    if len(rows) > limit:
        console.print(f"(first {limit} rows shown)")


# --- demo --------------------------------------------------------------------------------

DEMO = (("device_signals", 2000), ("payments", 1000))


def demo(
    bad_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of bad records.")] = 0.02,
    keep_broker: Annotated[bool, typer.Option(help="Leave the broker running afterwards.")] = False,
) -> None:
    """End to end on the embedded broker: produce, ingest, report, stop.

    Starts Kafka, creates the topics, produces device signals and payments (with a few bad
    records), runs both ingest pipelines with spark-submit until they have caught up,
    then prints rows per date partition, quarantined records by reason and a query, and
    validates the tables that declare expectations with Great Expectations.
    """
    from sluice.dev.broker import BrokerError, EmbeddedBroker
    from sluice.dev.generate import EventGenerator
    from sluice.dev.produce import ProduceError, send, synthetic
    from sluice.ops.submit import ingest_submission
    from sluice.ops.target import LocalTarget
    from sluice.records.validation import Selection
    from sluice.topics import create_topics

    broker = EmbeddedBroker.default()
    try:
        with console.status(f"starting Kafka on {broker.bootstrap}"):
            broker.start()
        console.print(f"[bold]1.[/] Kafka up on {broker.bootstrap}")
        pipelines = [load(name) for name, _ in DEMO]
        for p, (_, count) in zip(pipelines, DEMO, strict=True):
            topics = p.kafka.topics or []
            create_topics(p.kafka.bootstrap_servers, topics, partitions=2)
            gen = EventGenerator(p, seed=time.time_ns() % 2**32)
            report = send(p.kafka.bootstrap_servers, topics[0], synthetic(gen, count, bad_fraction))
            console.print(f"[bold]2.[/] {p.name}: ", end="")
            print_report(report)
        for p in pipelines:
            console.print(f"[bold]3.[/] running {p.name} ({p.spec.sink.format}) with spark-submit, available-now")
            LocalTarget().run(ingest_submission(p.spec_path, pipeline_name=p.name, available_now=True))
        _demo_report(pipelines)
        for p in pipelines:
            if p.spec.expectations.declared:
                console.print(f"[bold]5.[/] sluice validate {p.name}: Great Expectations on the newest partition")
                if not validate_and_show(p, Selection(latest=1)).passed:
                    fail(f"{p.name}: a critical expectation failed", 1)
    except (BrokerError, ProduceError) as exc:
        fail(str(exc))
    finally:
        if not keep_broker:
            broker.stop()
            console.print("Kafka stopped")


def _demo_report(pipelines: list[Pipeline]) -> None:
    from jobs.session import local_session
    from jobs.sql.session import register_tables

    with console.status("starting Spark for the report"):
        spark = local_session("sluice-demo-report")
        register_tables(spark, pipelines, warn)
    try:
        for p in pipelines:
            col = p.spec.date_partition.column
            per_day = spark.table(p.name).groupBy(col).count().withColumnRenamed("count", "rows").orderBy(col)
            _show(per_day, 50, f"{p.name}: rows per {col} partition")
            if spark.catalog.tableExists(p.quarantine_table):
                by_reason = spark.table(p.quarantine_table).groupBy("reason").count().orderBy("count", ascending=False)
                _show(by_reason, 20, f"{p.quarantine_table}: records by reason")
            else:
                console.print(f"{p.quarantine_table}: nothing quarantined")
        query = (
            "SELECT device_type, count(*) AS readings, round(avg(signal), 1) AS avg_signal_dbm, "
            "min(date) AS first_day, max(date) AS last_day FROM device_signals GROUP BY device_type "
            "ORDER BY readings DESC"
        )
        console.print(f'[bold]4.[/] sluice sql "{query}"')
        _show(spark.sql(query), 10)
    finally:
        spark.stop()
