"""Validate a pipeline's written table with Great Expectations: one batch per date partition.

The suite comes from the spec (:mod:`jobs.quality.gx_suite`); GX's Spark data source reads each
selected date partition of the Delta or Parquet table as a batch, a checkpoint validates
it, stores the result and rebuilds the Data Docs. The job writes a report (see
:mod:`sluice.records.validation`) and exits 0 once it has validated; whoever reads the report
decides (``sluice validate``, the data-quality DAG). Run by them, or by hand::

    spark-submit ... jobs/validate.py --spec pipelines/payments.yaml --dates latest:2 --report r.json
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.quality import docs_verdict, offline_docs
from jobs.tables.readers import read_table, table_exists
from sluice import registry
from sluice.errors import SluiceError
from sluice.records.validation import (
    Outcome,
    Partition,
    Report,
    Selection,
    pull_stores,
    push_changed,
    quality_home,
    shared_quality,
)
from sluice.spec import Pipeline, SpecError, load_pipeline

log = logging.getLogger("sluice.validate")

# GX reports usage to its servers unless told not to; jobs must not call out.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

#: The GX data source every Sluice table is an asset of (a DataFrame asset per pipeline).
DATASOURCE = "sluice"


class ValidationError(Exception):
    """The table cannot be validated (no table, nothing declared)."""


def table(spark: SparkSession, pipeline: Pipeline) -> DataFrame:
    fmt, path = pipeline.spec.sink.format, pipeline.sink_path
    if not table_exists(spark, fmt, path):
        raise ValidationError(f"{pipeline.name}: no {fmt} table at {path} yet (has the pipeline run?)")
    return read_table(spark, fmt, path)


def partitions(df: DataFrame, column: str, selection: Selection) -> list[date]:
    """The dates to validate, oldest first."""
    if selection.latest is None:
        return selection.days()
    rows = df.select(column).distinct().orderBy(F.col(column).desc()).limit(selection.latest).collect()
    return sorted(r[0] for r in rows)


def context(root: Path) -> Any:
    """A GX context whose stores and Data Docs are files under ``root``, shared by every
    pipeline. Ephemeral, so data sources live in memory and concurrent validations of
    different tables never rewrite one great_expectations.yml."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        FilesystemStoreBackendDefaults,
        ProgressBarsConfig,
    )

    stores = FilesystemStoreBackendDefaults(root_directory=str(root))
    # Its "how to" buttons link to GX's tutorials, which a user of Sluice's pages has no use for.
    stores.data_docs_sites[stores.data_docs_site_name]["show_how_to_buttons"] = False
    return gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=stores,
            progress_bars=ProgressBarsConfig(globally=False),
            analytics_enabled=False,
        ),
    )


def checkpoint(ctx: Any, pipeline: Pipeline, now: datetime) -> Any:
    """Suite, batch definition, validation definition and checkpoint, stored (or updated)."""
    import great_expectations as gx

    from jobs.quality.gx_suite import suite

    name = f"sluice.{pipeline.name}"
    batches = (
        ctx.data_sources.add_or_update_spark(name=DATASOURCE)
        .add_dataframe_asset(name=pipeline.name)
        .add_batch_definition_whole_dataframe("date_partition")
    )
    definition = ctx.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=name, data=batches, suite=ctx.suites.add_or_update(suite(pipeline, now)))
    )
    return ctx.checkpoints.add_or_update(
        gx.Checkpoint(
            name=name,
            validation_definitions=[definition],
            actions=[],  # validate() builds the Data Docs once each result carries Sluice's verdict
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5},
        )
    )


def _text(value: Any) -> str:
    return value.isoformat(sep=" ") if isinstance(value, datetime) else str(value)


def outcome(partition: str, rows: int, result: Any) -> Outcome:
    """One GX expectation result as the report's row."""
    config, r = result.expectation_config, result.result or {}
    error = (result.exception_info or {}).get("exception_message") if not result.success else None
    observed, checked, failed = r.get("observed_value"), r.get("element_count"), r.get("unexpected_count")
    if config.type == "unexpected_rows_expectation":  # a SQL rule: GX observes the count of failing rows
        checked, failed, observed = rows, observed, None
    return Outcome(
        partition=partition,
        rule=(config.meta or {}).get("sluice_rule", config.type),
        expectation=config.type,
        severity=docs_verdict.severity(config),
        success=bool(result.success),
        checked=checked,
        failed=failed,
        observed=None if observed is None else _text(observed),
        examples=[_text(v) for v in r.get("partial_unexpected_list") or []],
        error=error,
    )


def publish(ctx: Any, key: Any, validation: Any, asset: str, passed: bool, index: bool) -> str:
    """Store one result with Sluice's verdict, build its Data Docs page (and the index if
    asked), and mark its failed warnings there; the page's URL."""
    validation.success = passed
    # A dataframe's batch has no asset name of its own: the page said "Data asset: None".
    validation.meta.setdefault("batch_spec", {})["data_asset_name"] = asset
    ctx.validation_results_store.set(key, validation)
    ctx.build_data_docs(resource_identifiers=[key, key.expectation_suite_identifier], build_index=index)
    page = str(ctx.get_docs_sites_urls(resource_identifier=key)[0]["site_url"])
    warnings = sum(docs_verdict.is_failed_warning(r) for r in validation.results)
    try:  # the verdict stands without the marks, as it does without the pages' own assets
        marked = docs_verdict.mark_warnings(Path(unquote(urlparse(page).path)), validation.results)
    except OSError as exc:
        log.warning("Data Docs: failed warnings not marked on %s: %s", page, exc)
    else:
        if marked != warnings:  # e.g. a GX whose pages are laid out otherwise
            log.warning("Data Docs: %d of %d failed warnings marked on %s", marked, warnings, page)
    return page


def validate(spark: SparkSession, pipeline: Pipeline, selection: Selection, now: datetime | None = None) -> Report:
    """Validate each selected date partition as its own batch; results go to the GX stores."""
    from great_expectations.core.run_identifier import RunIdentifier

    if not pipeline.spec.expectations.declared:
        raise ValidationError(f"{pipeline.name} declares no expectations; nothing to validate")
    now = now or datetime.now(UTC)
    column = pipeline.spec.date_partition.column
    df = table(spark, pipeline)
    dates = partitions(df, column, selection)
    shared = shared_quality()
    if shared is not None:
        try:
            pulled, refused = pull_stores(shared, quality_home())
            log.info("Data Docs: %d store files taken from %s", pulled, shared)
            if refused:
                log.warning(
                    "Data Docs: %d files of %s are not GX store files, left there: %s",
                    len(refused),
                    shared,
                    refused[:5],
                )
        except (OSError, SluiceError) as exc:  # the verdict does not need them; the index will miss them
            log.warning("Data Docs: the other hosts' results not taken from %s: %s", shared, exc)
    started = time.time()
    ctx = context(quality_home())
    check = checkpoint(ctx, pipeline, now)
    parts, outcomes = [], []
    for day in dates:
        batch = df.where(F.col(column) == F.lit(day))
        result = check.run(batch_parameters={"dataframe": batch}, run_id=RunIdentifier(run_name=f"{column}={day}"))
        ((key, validation),) = result.run_results.items()
        rows = batch.count()
        found = [outcome(day.isoformat(), rows, r) for r in validation.results]
        # GX fails a run on any failed expectation; Sluice (and so Airflow) only on a critical
        # one. The stored result says Sluice's verdict, so the Data Docs agree with the task.
        passed = not any(not o.success and o.severity == "critical" for o in found)
        # The index once, after the last partition: it reads every stored result.
        page = publish(ctx, key, validation, pipeline.name, passed, index=day == dates[-1])
        parts.append(Partition(date=day.isoformat(), rows=rows, success=passed, docs=page))
        failed = [o for o in found if not o.success]
        log.info(
            "%s %s=%s: %d rows, %d of %d expectations failed (%d critical)",
            pipeline.name,
            column,
            day,
            rows,
            len(failed),
            len(found),
            sum(o.severity == "critical" for o in failed),
        )
        outcomes += found
    docs = ctx.get_docs_sites_urls()[0]["site_url"]
    try:
        pages = offline_docs.localize(Path(urlparse(docs).path).parent, offline_docs.assets_dir())
        log.info("Data Docs: %d pages now load their CSS and JavaScript from the site itself", pages)
    except OSError as exc:  # the report stands without them; the pages then need the internet
        log.warning("Data Docs keep their CDN links: %s", exc)
    if shared is not None:
        try:
            log.info("Data Docs: %d files written to %s", push_changed(quality_home(), shared, started), shared)
        except (OSError, SluiceError) as exc:  # the verdict stands; the pages stay on this host
            log.warning("Data Docs not shared: Airflow cannot show them from %s: %s", shared, exc)
    return Report(
        pipeline=pipeline.name,
        table=pipeline.sink_path,
        suite=f"sluice.{pipeline.name}",
        selection=str(selection),
        validated_at=now,
        docs=docs,
        partitions=parts,
        outcomes=outcomes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="validate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="pipeline spec file (or a pipeline name)")
    parser.add_argument("--dates", default="", help="latest[:N], YYYY-MM-DD or FROM..TO (default: the spec's)")
    parser.add_argument("--report", required=True, help="where to write the report (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("py4j", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        pipeline = load_pipeline(args.spec, schemas=registry.schema_file)
        dates = args.dates or f"latest:{pipeline.spec.expectations.validation.partitions}"
        selection = Selection.parse(dates)
    except (SpecError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    spark = SparkSession.builder.appName(f"sluice-{pipeline.name}-validate").getOrCreate()
    try:
        report = validate(spark, pipeline, selection)
    except ValidationError as exc:
        log.error("%s", exc)
        return 2
    out = Path(args.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    for line in report.summary():
        log.info("%s", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
