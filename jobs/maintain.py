"""Delta table maintenance for one pipeline: compact recent partitions, vacuum old files.

Streaming appends a few small files per batch to today's partition; ``OPTIMIZE`` on the
last ``maintenance.optimize_days`` date partitions compacts them (it only conflicts with
deletes, so the stream keeps appending meanwhile). ``VACUUM`` then removes files that
no version younger than ``maintenance.vacuum_retain_hours`` (at least Delta's 7-day
floor) still references. Run by the pipeline's maintenance DAG, or by hand::

    spark-submit ... jobs/maintain.py --spec pipelines/device_signals.yaml
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from typing import Any
from zoneinfo import ZoneInfo

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from jobs.lifecycle import configure_logging
from sluice import config, registry
from sluice.errors import first_line
from sluice.spec import Pipeline, SpecError, load_pipeline

log = logging.getLogger("sluice.maintain")


def maintain_table(
    spark: SparkSession, path: str, date_column: str, since: dt.date, retain_hours: int
) -> dict[str, Any]:
    table = DeltaTable.forPath(spark, path)
    files_before = table.detail().first()["numFiles"]  # type: ignore[index]
    metrics = table.optimize().where(f"`{date_column}` >= DATE'{since.isoformat()}'").executeCompaction()
    m = metrics.first()["metrics"]  # type: ignore[index]
    table.vacuum(float(retain_hours))
    files_after = table.detail().first()["numFiles"]  # type: ignore[index]
    return {
        "path": path,
        "optimized_since": since.isoformat(),
        "files_before": files_before,
        "files_after": files_after,
        "files_added": m["numFilesAdded"],
        "files_removed": m["numFilesRemoved"],
        "vacuum_retain_hours": retain_hours,
    }


def maintain(spark: SparkSession, pipeline: Pipeline, today: dt.date | None = None) -> list[dict[str, Any]]:
    """Maintain the output table and its quarantine table; skip one that does not exist yet."""
    m, dp = pipeline.spec.maintenance, pipeline.spec.date_partition
    today = today or dt.datetime.now(ZoneInfo(dp.timezone)).date()
    since = today - dt.timedelta(days=m.optimize_days - 1)
    done = []
    for path in (pipeline.sink_path, pipeline.quarantine_path):
        if not DeltaTable.isDeltaTable(spark, path):
            log.info("%s: no Delta table yet, nothing to maintain", path)
            continue
        result = maintain_table(spark, path, dp.column, since, m.vacuum_retain_hours)
        log.info(
            "%s: OPTIMIZE %s >= %s: %d files -> %d (added %d, removed %d); VACUUM RETAIN %d HOURS",
            path,
            dp.column,
            result["optimized_since"],
            result["files_before"],
            result["files_after"],
            result["files_added"],
            result["files_removed"],
            m.vacuum_retain_hours,
        )
        done.append(result)
    # The event log every stream appends to is compacted by its writers (jobs/stream/events.py);
    # the files that compaction replaced are deleted here, by whichever pipeline's maintenance runs.
    events = config.events_table()
    try:
        if DeltaTable.isDeltaTable(spark, events):
            DeltaTable.forPath(spark, events).vacuum(float(m.vacuum_retain_hours))
            log.info("%s: VACUUM RETAIN %d HOURS", events, m.vacuum_retain_hours)
    except Exception as exc:  # the shared log is not this pipeline's table: its failure is not this run's
        log.warning("%s: not vacuumed: %s", events, first_line(exc))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="maintain.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="pipeline spec file (or a pipeline name)")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        pipeline = load_pipeline(args.spec, schemas=registry.schema_file)
    except SpecError as exc:
        log.error("invalid spec: %s", exc)
        return 2
    if not (pipeline.table_format and pipeline.table_format.maintained):
        log.error("%s writes %s: it has no OPTIMIZE or VACUUM", pipeline.name, pipeline.spec.sink.format)
        return 2
    spark = SparkSession.builder.appName(f"sluice-{pipeline.name}-maintenance").getOrCreate()
    print(json.dumps({"pipeline": pipeline.name, "tables": maintain(spark, pipeline)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
