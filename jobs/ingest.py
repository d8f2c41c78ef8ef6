"""The ingest job: one pipeline spec, run in its mode until it ends or is stopped.

Run by ``sluice run SPEC`` and by Airflow, both through spark-submit::

    spark-submit ... jobs/ingest.py --spec pipelines/device_signals.yaml [--available-now]
    spark-submit ... jobs/ingest.py --spec ... --backfill PLAN   (a BackfillPlan as JSON)

The job takes the pipeline's lease, picks its run mode (:mod:`jobs.stream.modes`: micro-batch
ingest, a derived pipeline, a continuous branch) and runs it; the exit code says how it ended
(0 stopped cleanly, 1 failed, 2 bad arguments, 3 refused before writing, 4 another driver
holds the lease, 5 the lease was taken over).

SIGTERM or Ctrl-C stops the query after the batch in progress has committed. While it
runs, the job reports its state every second (:mod:`jobs.stream.status`) for supervision.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable

from pyspark.sql import SparkSession

from jobs.lifecycle import configure_logging, stop_on_signals
from jobs.stream import modes
from jobs.stream.lineage import StreamLineage
from jobs.stream.status import StatusReporter
from sluice import registry
from sluice.errors import root_cause
from sluice.records.backfill import BackfillPlan
from sluice.records.run import Driver
from sluice.spec import Pipeline, SpecError, Trigger, load_pipeline
from sluice.state import lease as leases
from sluice.state.lease import UNFENCED, Fence

log = logging.getLogger("sluice.ingest")

#: The exit code of a driver that stopped because another one took its lease over.
LEASE_LOST = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ingest.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="pipeline spec file (or a pipeline name)")
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then stop")
    parser.add_argument("--processing-time", help="micro-batch interval instead of the spec's, e.g. '30 seconds'")
    parser.add_argument("--backfill", help="a backfill plan as JSON (see sluice.records.backfill.BackfillPlan)")
    parser.add_argument(
        "--rebuild", action="store_true", help="a derived pipeline: delete its checkpoint and tables first"
    )
    args = parser.parse_args(argv)
    configure_logging()

    try:
        pipeline = load_pipeline(args.spec, schemas=registry.schema_file)
        if args.processing_time:
            trigger = Trigger(processing_time=args.processing_time)
            pipeline = dataclasses.replace(pipeline, spec=pipeline.spec.model_copy(update={"trigger": trigger}))
    except (SpecError, ValueError) as exc:
        log.error("invalid spec: %s", exc)
        return 2

    backfill = None
    if args.backfill:
        try:
            backfill = BackfillPlan.from_json(args.backfill)
        except ValueError as exc:
            log.error("invalid backfill: %s", exc)
            return 2
    claims = leases.claims_for(pipeline, backfill.id if backfill else None)
    try:
        # The lease the launcher took for this run is adopted (same owner); a run started by hand takes its own.
        lease = leases.take(pipeline.name, claims, os.environ.get(leases.OWNER_ENV))
    except leases.Claimed as exc:
        log.error("%s", exc)
        return 4
    try:
        return drive(pipeline, backfill, args.available_now, args.processing_time, args.rebuild, lease)
    finally:
        leases.release(lease)


def drive(
    pipeline: Pipeline,
    backfill: BackfillPlan | None,
    available_now: bool,
    processing_time: str | None,
    rebuild: bool = False,
    lease: leases.Lease | None = None,
) -> int:
    """Run the stream (or backfill) until it ends or SIGTERM/Ctrl-C stops it; the exit code.

    The lease is renewed beside it (:class:`~sluice.state.lease.Fence`), which every batch
    and commit checks: a stop asked for on any host, or the lease lost, stops the stream like
    SIGTERM does, and a lost lease also keeps its writers from writing again."""
    stop = stop_on_signals(log)
    fence: Fence = UNFENCED
    if lease is not None:
        fence = Fence(lease, stop, None if backfill else stop_requested(lease)).start()
    try:
        return _drive(pipeline, backfill, available_now, processing_time, rebuild, stop, fence)
    finally:
        fence.close()


def lost_lease(error: Exception | None, fence: Fence) -> str | None:
    """Why this run ends with :data:`LEASE_LOST`, if it does: another driver runs this checkpoint
    now, and this one wrote nothing since. Whether the loss failed a batch (``error``) or was
    seen between batches, where it stops the query as cleanly as a stop request does, the
    supervisor is told the same."""
    return fence.verify() if error is not None else fence.lost


def stop_requested(lease: leases.Lease) -> Callable[[], bool]:
    """Has a stop of this run been asked for, on any host (``sluice stop``, action=stop)?"""

    def asked() -> bool:
        driver = Driver.read(lease.holder.pipeline)
        return driver is not None and driver.owner == lease.holder.owner and driver.desired == "stopped"

    return asked


def _drive(
    pipeline: Pipeline,
    backfill: BackfillPlan | None,
    available_now: bool,
    processing_time: str | None,
    rebuild: bool,
    stop: threading.Event,
    fence: Fence,
) -> int:
    spark = SparkSession.builder.appName(f"sluice-{pipeline.name}").getOrCreate()
    fence.app_id = spark.sparkContext.applicationId
    mode = modes.mode_of(pipeline)
    if rebuild and (not mode.rebuilds or backfill is not None):
        log.error("%s: only a pipeline that reads another pipeline's table is rebuilt", pipeline.name)
        return 2
    lineage = StreamLineage.for_driver(pipeline, spark.version) if backfill is None else None
    reporter = StatusReporter(spark, pipeline.name, lineage, fence) if backfill is None else None
    if reporter is not None:
        reporter.report("starting")
    error: Exception | None
    try:
        error = modes.run(
            spark,
            pipeline,
            available_now=available_now,
            processing_time=processing_time,
            rebuild=rebuild,
            stop=stop,
            backfill=backfill,
            reporter=reporter,
            fence=fence,
        )
    except mode.refusals as exc:
        if reporter is not None:
            reporter.failed(spark, pipeline.checkpoint_path, str(exc))
        log.error("%s", exc)
        return 3
    except Exception as exc:  # anything else: said in one line, and counted, as a failed query is
        if fence.verify() is None:
            if reporter is not None:
                reporter.failed(spark, pipeline.checkpoint_path, str(exc))
            log.exception("%s failed: %s", pipeline.name, root_cause(str(exc)))
            return 1
        error = exc
    finally:
        if lineage is not None:  # its last events, told in the branches above
            lineage.close()
    lost = lost_lease(error, fence)
    if lost is not None:
        log.error("%s", lost)
        return LEASE_LOST
    if error is not None:
        # The whole trace is in this log already, where Spark reported the query's end.
        log.error("%s failed: %s", pipeline.name, root_cause(str(error)))
        return 1
    log.info("%s: stopped cleanly", pipeline.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
