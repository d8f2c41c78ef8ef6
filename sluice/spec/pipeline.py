"""The pipeline spec's model: each section, what it accepts, and the validated Pipeline.

This is the contract between the Airflow side (``sluice/airflow``) and the Spark side
(``jobs/``); :mod:`sluice.spec.loader` reads spec files into it. It is pure Python (pydantic,
no pyspark), so a bad spec fails in milliseconds with the file, the field and what was expected.

Example::

    pipeline = load_pipeline("pipelines/device_signals.yaml")
    pipeline.spec.sink.format          # 'delta'
    pipeline.plan.names                # ['timestamp', 'device_id', ...]

Relative sink and checkpoint paths are taken under ``SLUICE_HOME``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    PositiveInt,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sluice import config
from sluice.errors import InvalidInput
from sluice.spec import eventtime, strict
from sluice.spec.continuous import MICRO_BATCH_HINT, REAL_TIME_MIN_MS, ContinuousError, check_expression
from sluice.spec.derived import Deduplicate, Derivation, State, TableSource, Window
from sluice.spec.expectations import Expectations
from sluice.spec.flatten import METADATA_COLUMNS, FlattenPlan, plan_flatten
from sluice.spec.formats import TableFormat, table_format
from sluice.spec.model import Duration, Schedule, StrictModel, duration_ms
from sluice.spec.registry import RegistrySchema
from sluice.spec.schema import Struct


class SpecError(InvalidInput):
    """A spec that cannot run: which file, which field, and what was expected.

    ``problems`` holds every (field, message) found; the message names the first and counts
    the rest, and ``sluice check`` lists them all."""

    def __init__(self, file: str | Path, field: str, message: str, more: list[tuple[str, str]] | None = None) -> None:
        self.file, self.field, self.message = str(file), field, message
        self.problems = [(field, message), *(more or [])]
        extra = f" [+{len(self.problems) - 1} more: sluice check {file}]" if len(self.problems) > 1 else ""
        super().__init__((f"{file}: {field}: {message}" if field else f"{file}: {message}") + extra)


# Options the typed fields already cover: they must not be set twice.
_TYPED_SOURCE_OPTIONS = {
    "kafka.bootstrap.servers": "source.bootstrap_servers",
    "subscribe": "source.topics",
    "subscribePattern": "source.topic_pattern",
    "assign": "source.topics",
    "startingOffsets": "source.starting_offsets",
    "maxOffsetsPerTrigger": "source.max_offsets_per_trigger",
    "failOnDataLoss": "source.fail_on_data_loss",
}
# Spark Kafka source options that may be passed through besides the kafka.* ones.
_PASSTHROUGH_SOURCE_OPTIONS = {
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "groupIdPrefix",
    "includeHeaders",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
}
#: The Kafka source's defaults where a spec sets none. Spark looks up offsets with an admin
#: client that keeps asking a partition leader which died until ``default.api.timeout.ms``
#: (a minute) runs out, while KRaft elects a new leader within ``broker.session.timeout.ms``
#: (9 s): the stream stalled for a minute (tests/e2e/test_cluster.py's leader drill). A
#: lookup that times out is retried with a new client, which asks for the new leader.
KAFKA_DEFAULTS = {
    "kafka.request.timeout.ms": "10000",
    "kafka.default.api.timeout.ms": "15000",
    "fetchOffset.numRetries": "10",  # ~160 s to wait for the brokers, as Spark's 3 x 61 s did
}
_API_TIMEOUT, _REQUEST_TIMEOUT = "kafka.default.api.timeout.ms", "kafka.request.timeout.ms"


def check_topic(name: str) -> str:
    """Kafka's own rules for a topic name, checked here rather than by the broker later."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not a topic name: Kafka refuses '.' and '..'")
    if not 1 <= len(name) <= 249:
        raise ValueError(f"a topic name has 1 to 249 characters (this one has {len(name)})")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"{name!r} is not a topic name: letters, digits, '.', '_' and '-' only")
    return name


Topic = Annotated[str, AfterValidator(check_topic)]

#: The validation context's key for the brokers a Kafka source that names none reads.
BROKERS = "bootstrap_servers"


class Source(StrictModel):
    """Where events come from: Kafka topics (a list or a pattern) and consumer options."""

    # Left out, the loader gives the platform's brokers in the validation context: the
    # model reads no environment.
    bootstrap_servers: str = Field("", min_length=1, json_schema_extra={"default": "$SLUICE_KAFKA_BOOTSTRAP"})
    """The Kafka brokers, host:port[,host:port] [default: $SLUICE_KAFKA_BOOTSTRAP, the embedded broker's]."""
    topics: list[Topic] | None = None
    """The topics to read; give this or ``topic_pattern``."""
    topic_pattern: str | None = None
    """A regular expression of topic names to read (topics created later are picked up)."""
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[str, int]] = "earliest"
    """Where a new checkpoint starts: ``earliest``, ``latest``, or per topic and partition, e.g. ``{"orders": {"0":
    42}}``. A stream with a checkpoint goes on from it."""
    max_offsets_per_trigger: PositiveInt | None = None
    """At most this many records per micro-batch, spread over the partitions [default: all that wait]."""
    fail_on_data_loss: bool = True
    """Fail when offsets the checkpoint expects are gone from Kafka (retention, a deleted topic) rather than go on
    past them."""
    options: dict[str, str] = Field(default_factory=dict)
    """Passed through to Spark's Kafka source: ``kafka.*`` client settings (security, SASL, SSL...) and the source
    options Sluice does not type itself."""

    @model_validator(mode="before")
    @classmethod
    def _platform_brokers(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and data.get("bootstrap_servers") is None:
            brokers = (info.context or {}).get(BROKERS)
            if not brokers:
                raise ValueError("no Kafka brokers: give source.bootstrap_servers, or set SLUICE_KAFKA_BOOTSTRAP")
            data = {**data, "bootstrap_servers": brokers}
        return data

    @model_validator(mode="after")
    def _one_subscription(self) -> Source:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("give exactly one of 'topics' (a list) or 'topic_pattern' (a regex)")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern is not a valid regex: {exc}") from exc
        for key in self.options:
            if key in _TYPED_SOURCE_OPTIONS:
                raise ValueError(f"options.{key} is set by {_TYPED_SOURCE_OPTIONS[key]}; set it there")
            if not key.startswith("kafka.") and key not in _PASSTHROUGH_SOURCE_OPTIONS:
                raise ValueError(
                    f"options.{key} is not a Kafka client setting (kafka.*) nor a Spark Kafka "
                    f"source option Sluice passes through ({', '.join(sorted(_PASSTHROUGH_SOURCE_OPTIONS))})"
                )
        timeouts = {k: self.options[k] for k in (_REQUEST_TIMEOUT, _API_TIMEOUT) if k in self.options}
        for key, value in timeouts.items():
            if not value.isdigit() or int(value) == 0:
                raise ValueError(f"options.{key} is {value!r}: give a positive number of milliseconds")
        if len(timeouts) == 2 and int(timeouts[_API_TIMEOUT]) < int(timeouts[_REQUEST_TIMEOUT]):
            raise ValueError(f"options.{_API_TIMEOUT} must be at least options.{_REQUEST_TIMEOUT} (Kafka's rule)")
        return self

    def spark_options(self) -> dict[str, str]:
        """The options of ``spark.readStream.format("kafka")``."""
        import json

        opts = {"kafka.bootstrap.servers": self.bootstrap_servers}
        if self.topics:
            opts["subscribe"] = ",".join(self.topics)
        else:
            opts["subscribePattern"] = str(self.topic_pattern)
        so = self.starting_offsets
        opts["startingOffsets"] = so if isinstance(so, str) else json.dumps(so)
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        opts["failOnDataLoss"] = str(self.fail_on_data_loss).lower()
        opts = KAFKA_DEFAULTS | opts | dict(self.options)
        if _API_TIMEOUT not in self.options:  # a longer request timeout set alone must still fit
            opts[_API_TIMEOUT] = str(max(int(opts[_API_TIMEOUT]), int(opts[_REQUEST_TIMEOUT])))
        return opts


class Accept(StrictModel):
    """Which event times are believable; a record outside is quarantined with the reason
    ``event time out of range``. Each end is a date or date-time (UTC unless it says
    otherwise), a duration from the ingestion time ('1 day' after it, '30 days' before it),
    or null for no bound (years 0001 to 9999 are always the limit: what readers can hold)."""

    # YAML reads 1970-01-01 as a date and a time with an offset as a datetime: keep both whole.
    not_before: str | datetime | date | None = "1970-01-01"
    """The earliest believable event time: a date or date-time, a duration before ingestion ('30 days'), or null."""
    not_after: str | datetime | date | None = "1 day"
    """The latest believable event time: a date or date-time, a duration after ingestion ('1 day'), or null."""

    @field_validator("not_before", "not_after", mode="after")
    @classmethod
    def _bound(cls, v: str | date | None, info: Any) -> str | None:
        if v is None:
            return None
        return eventtime.parse_bound(v, before=info.field_name == "not_before").text

    @model_validator(mode="after")
    def _ordered(self) -> Accept:
        low, high = self.bounds().not_before, self.bounds().not_after
        if low and high and low.at and high.at and low.at >= high.at:
            raise ValueError(f"not_before ({low.text}) must be earlier than not_after ({high.text})")
        return self

    def bounds(self, continuous: bool = False) -> eventtime.Bounds:
        """The range; a continuous branch has no current time, so it drops a relative bound it
        did not ask for (one it asked for is refused when the spec loads)."""

        def bound(name: str, value: str | date | None) -> eventtime.Bound | None:
            b = None if value is None else eventtime.parse_bound(value, before=name == "not_before")
            return None if b is not None and b.relative and continuous else b

        return eventtime.Bounds(bound("not_before", self.not_before), bound("not_after", self.not_after))


class EventTime(StrictModel):
    """The field that carries the event's time, how to read it, and which times to accept."""

    field: str = Field(min_length=1)
    """The field (dotted path) that carries the event's time; a record without it is quarantined."""
    format: str = "iso8601"
    """How to read it: ``iso8601``, ``date``, ``epoch_seconds``, ``epoch_millis``, ``epoch_micros``, or a Spark datetime
    pattern."""
    accept: Accept = Accept()
    """Which event times are believable; the others are quarantined."""

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        eventtime.check_format(v)
        return v


class DatePartition(StrictModel):
    """The date column the table is partitioned by: the event time's calendar date in a time zone."""

    column: str = Field(default="date", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The name of the date column the table is partitioned by."""
    timezone: str = "UTC"
    """The time zone whose calendar date of the event time names the partition (an IANA name)."""

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        eventtime.check_timezone(v)
        return v


class Flatten(StrictModel):
    """Flattening rules; see :mod:`sluice.spec.flatten` for the naming rule."""

    separator: str = Field(default="_", pattern=r"^[A-Za-z0-9_]{1,3}$")
    """Joins the parts of a nested field's path into its column name."""
    rename: dict[str, str] = Field(default_factory=dict)
    """Field path or prefix -> the name its column (or its columns' prefix) gets instead."""
    explode: list[str] = Field(default_factory=list)
    """Array fields to explode: one row per element (arrays stay arrays otherwise)."""
    keep: list[str] = Field(default_factory=list)
    """Struct fields kept whole as one struct column instead of flattened."""


class Sink(StrictModel):
    """The output: a table (Delta, the default, or Parquet) partitioned by the date column,
    or, for continuous branches, a Kafka topic."""

    format: Literal["delta", "parquet", "kafka"] = "delta"
    """``delta`` (the default), ``parquet``, or ``kafka`` (continuous branches)."""
    path: str | None = Field(default=None, min_length=1)
    """The table's location: relative to $SLUICE_STORE (default: $SLUICE_HOME), an absolute path (with ``allow_external_paths``), or a URI
    such as ``s3a://bucket/tables/orders``."""
    quarantine_path: str | None = None
    """Where rejected records go, in the same format. Defaults to ``<path>_quarantine``."""
    topic: Topic | None = None
    """Kafka sinks: the topic for output records."""
    quarantine_topic: Topic | None = None
    """Kafka sinks: the topic for records that cannot be parsed, with their reason [default: ``<topic>-quarantine``]."""
    bootstrap_servers: str | None = None
    """Kafka sinks: the brokers to write to [default: the source's]."""

    @model_validator(mode="after")
    def _target(self) -> Sink:
        if self.format == "kafka":
            if not self.topic:
                raise ValueError("a kafka sink needs 'topic'")
            if self.path or self.quarantine_path:
                raise ValueError("a kafka sink writes to 'topic' and 'quarantine_topic', not to a path")
        else:
            if not self.path:
                raise ValueError(f"a {self.format} sink needs 'path'")
            if self.topic or self.quarantine_topic or self.bootstrap_servers:
                raise ValueError(
                    f"'topic', 'quarantine_topic' and 'bootstrap_servers' are for kafka sinks, not {self.format}"
                )
        return self


class Trigger(StrictModel):
    """When micro-batches run: every ``processing_time``, or once over what is there."""

    processing_time: Duration | None = None
    """Start a micro-batch every this long [default: 10 seconds]."""
    available_now: bool = False
    """Process what is in Kafka when the run starts, then stop."""

    @model_validator(mode="after")
    def _one(self) -> Trigger:
        if self.available_now and self.processing_time:
            raise ValueError("give either processing_time or available_now: true, not both")
        return self

    def spark_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``DataStreamWriter.trigger``."""
        if self.available_now:
            return {"availableNow": True}
        return {"processingTime": self.processing_time or "10 seconds"}


class Supervision(StrictModel):
    """What the scheduled supervision run of the pipeline's DAG enforces."""

    schedule: Schedule | None = "*/5 * * * *"
    """Cron expression or preset for the supervision run; null for manual runs only."""
    autostart: bool = False
    """Whether a scheduled supervision also starts a stream that nobody started yet. By default it only keeps up a
    stream someone started (``action=start``, ``sluice start``), so unpausing a DAG starts nothing; true suits
    deployments that unpause DAGs from code."""
    max_stall: Duration = "10 minutes"
    """The stream is stalled when it is behind the broker and has committed no batch for this long."""
    max_lag: PositiveInt | None = None
    """Fail when more records than this wait in Kafka (end offsets minus committed offsets)."""
    max_failures: PositiveInt = 3
    """Stop restarting a stream that failed this many times in a row on the same batch."""
    backoff: Duration = "30 seconds"
    """Wait this long before restarting a stream that failed, doubled after each failure in a row."""


class Maintenance(StrictModel):
    """Small-file compaction and clean-up of a Delta table (its maintenance DAG)."""

    schedule: Schedule | None = "@daily"
    """Cron expression or preset for the maintenance DAG; null for manual runs only."""
    optimize_days: PositiveInt = 3
    """OPTIMIZE the date partitions of the last N days (streaming writes many small files there)."""
    vacuum_retain_hours: int = Field(default=168, ge=168)
    """VACUUM keeps files younger than this; Delta's own safety floor is 7 days (168 h)."""


class Continuous(StrictModel):
    """A latency-critical branch: Kafka in, map-like rules, Kafka out, record by record.

    Each good event becomes one verdict record: the chosen ``columns`` plus ``flagged``
    (true when any rule holds) and ``rules`` (the names of those that hold). Records that
    cannot be parsed go to the quarantine topic with their reason.
    """

    engine: Literal["continuous", "real_time"] = "continuous"
    """The Spark engine that runs it: ``continuous`` processing, or ``real_time``, Spark 4.1's Real-Time Mode
    (long-running micro-batches that pass each record on as it is read; lower and steadier latency, see
    benchmarks/latency.py). Both deliver at least once."""
    checkpoint_interval: Duration | None = None
    """How often the long-running tasks record their offsets (the at-least-once boundary) [default: 1 second for
    ``continuous``, 30 seconds for ``real_time``, which takes at least 5 seconds]."""
    rules: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)
    """Rule name -> SQL boolean over the flattened columns, e.g. ``amount > 2000``."""
    emit: Literal["flagged", "all"] = "flagged"
    """Which verdicts to write: only the flagged ones, or one per event."""
    columns: list[str] = Field(default_factory=list)
    """Flattened columns copied into each verdict [default: all of them]."""
    key: str | None = None
    """A flattened column used as the output record's Kafka key (keeps an entity on one partition)."""
    filter: str | None = None
    """Optional SQL boolean: events for which it is false are not considered at all."""

    @property
    def interval(self) -> str:
        """The checkpoint interval, given or the engine's default."""
        if self.checkpoint_interval is not None:
            return self.checkpoint_interval
        return "30 seconds" if self.engine == "real_time" else "1 second"


def _source_kind(value: Any) -> str:
    if isinstance(value, TableSource) or (isinstance(value, dict) and "table" in value):
        return "table"
    return "kafka"


#: Kafka topics, or another pipeline's table (a derived pipeline, see sluice.spec.derived).
AnySource = Annotated[
    Annotated[Source, Tag("kafka")] | Annotated[TableSource, Tag("table")], Discriminator(_source_kind)
]


class PipelineSpec(StrictModel):
    """One pipeline: Kafka topics (or another pipeline's table) in, one date-partitioned
    table (and its quarantine) out."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    """The pipeline's name: its table and view name, and its Airflow DAG id ``sluice_<name>``."""
    description: str = ""
    """Free text, shown as the DAG's description."""
    mode: Literal["micro_batch", "continuous"] = "micro_batch"
    """``micro_batch`` (tables, exactly once) or ``continuous`` (Kafka to Kafka, milliseconds, at least once)."""
    owner: str = "data-engineering"
    """The DAG's owner in Airflow."""
    tags: list[str] = Field(default_factory=list)
    """Extra Airflow tags of the pipeline's DAGs."""
    source: AnySource
    """Kafka topics, or another pipeline's table (a derived pipeline)."""
    schema_path: str | RegistrySchema | None = Field(default=None, alias="schema")
    """Required for Kafka sources; a derived pipeline reads its upstream table's columns. A schema file, or a
    registry subject (see :mod:`sluice.spec.registry`)."""
    event_time: EventTime | None = None
    """The event's time, which names its date partition; required for Kafka sources."""
    date_partition: DatePartition = DatePartition()
    """The date column the table is partitioned by."""
    flatten: Flatten = Flatten()
    """How nested records become columns."""
    on_type_mismatch: dict[str, Literal["quarantine", "rescue"]] = Field(default_factory=dict)
    """Field path -> what a value that does not fit the field's type does: ``quarantine`` the record (the default for
    every field) or ``rescue`` it: the row is written with the field NULL and the value kept in ``_rescued``."""
    coerce: dict[str, strict.Coerce] = Field(default_factory=dict)
    """Field path -> the coercions it takes (strict by default; see :mod:`sluice.spec.strict`)."""
    sink: Sink
    """Where rows go: a table, or a Kafka topic for a continuous branch."""
    checkpoint: str = Field(min_length=1)
    """The stream's checkpoint location (same rules as ``sink.path``); it is what makes the writes exactly once."""
    allow_external_paths: bool = False
    """Tables and checkpoints live under $SLUICE_HOME unless this is true (then absolute paths anywhere are allowed;
    URIs such as s3a://... always are)."""
    trigger: Trigger = Trigger()
    """When micro-batches run."""
    supervision: Supervision = Supervision()
    """What the DAG's scheduled supervision enforces."""
    maintenance: Maintenance = Maintenance()
    """Compaction and clean-up of a Delta table."""
    continuous: Continuous | None = None
    """The rules and engine of a continuous branch (``mode: continuous``)."""
    expectations: Expectations = Expectations()
    """Data-quality rules on the rows (in the stream) and on the table (the validation job)."""
    # Derived pipelines (source: {table: ...}); see sluice.spec.derived.
    filter: str | None = None
    """SQL condition on the upstream rows; the others are counted as filtered, not kept."""
    deduplicate: Deduplicate | None = None
    """Derived pipelines: drop repeated rows per key."""
    window: Window | None = None
    """Derived pipelines: the event-time window ``aggregate`` counts in."""
    aggregate: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)
    """Output column -> SQL aggregate, per window and group_by columns."""
    group_by: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(default_factory=list)
    """Derived pipelines: the columns ``aggregate`` groups by, besides the window."""
    watermark: Duration | None = None
    """How late an event may be, behind the latest event time seen, before it is late."""
    output_mode: Literal["append", "update"] = "append"
    """append: a window is written once, when the watermark passes its end; update: written (merged into the Delta
    table) every batch it changes in."""
    state: State | None = None
    """Derived pipelines: per-key state (sessions, or a custom processor)."""

    @model_validator(mode="before")
    @classmethod
    def _stateful_parts(cls, data: Any) -> Any:
        # Named here, before "extra inputs are not permitted", so the message says why.
        if isinstance(data, dict) and data.get("mode") == "continuous":
            for key, what in (
                ("watermark", "a watermark (event-time state)"),
                ("deduplicate", "deduplication (state across records)"),
                ("join", "a join with another stream (state across records)"),
                ("aggregate", "an aggregation (state across records)"),
                ("window", "event-time windows (state across records)"),
                ("state", "per-key state (state across records)"),
            ):
                if key in data:
                    raise ValueError(f"{key}: continuous processing does not support {what}; {MICRO_BATCH_HINT}")
        return data

    @property
    def reads_table(self) -> bool:
        return isinstance(self.source, TableSource)

    @property
    def derives(self) -> bool:
        """Does it do event-time work (or read a table)? Then the derive job runs it."""
        sections = (self.filter, self.deduplicate, self.window, self.state, self.watermark, self.aggregate)
        return self.reads_table or any(bool(s) for s in sections)

    @model_validator(mode="after")
    def _inputs(self) -> PipelineSpec:
        if not self.reads_table:
            if self.schema_path is None or self.schema_path == "":
                raise ValueError("schema: a pipeline that reads Kafka needs the events' schema file")
            if self.event_time is None:
                raise ValueError("event_time: a pipeline that reads Kafka needs event_time.field")
        elif self.schema_path is not None or self.event_time is not None:
            raise ValueError(
                "schema/event_time: a derived pipeline reads its upstream table's columns and event time; "
                "pick the time column with window.time or state.time"
            )
        return self

    @model_validator(mode="after")
    def _mode(self) -> PipelineSpec:
        if self.mode == "micro_batch":
            if self.sink.format == "kafka":
                raise ValueError("sink.format kafka is for continuous branches (mode: continuous)")
            if self.continuous is not None:
                raise ValueError("the 'continuous' section needs mode: continuous")
            return self
        if self.sink.format != "kafka":
            raise ValueError(
                f"sink.format {self.sink.format}: a continuous branch writes to Kafka only; table sinks need "
                f"foreachBatch or the file sink, which continuous processing does not support; {MICRO_BATCH_HINT}"
            )
        if self.flatten.explode:
            raise ValueError(f"flatten.explode: explode turns one record into many rows; {MICRO_BATCH_HINT}")
        if self.continuous is not None and self.continuous.engine == "real_time":
            if duration_ms(self.continuous.interval) < REAL_TIME_MIN_MS:
                raise ValueError(
                    f"continuous.checkpoint_interval: Real-Time Mode records offsets at most every "
                    f"{REAL_TIME_MIN_MS // 1000} seconds (Spark's shortest batch), not every "
                    f"{self.continuous.interval}; latency does not depend on it"
                )
            src = self.source
            if isinstance(src, Source) and src.max_offsets_per_trigger is not None:
                raise ValueError(
                    "source.max_offsets_per_trigger: Real-Time Mode reads each record as it arrives, with no "
                    "batch to cap; remove it"
                )
        if self.trigger.processing_time or self.trigger.available_now:
            raise ValueError(
                "trigger: a continuous branch has no micro-batch trigger; set continuous.checkpoint_interval"
            )
        if self.event_time is None:
            raise ValueError("event_time: a continuous branch reads Kafka and needs event_time.field")
        accept = self.event_time.accept
        for end in ("not_before", "not_after"):
            bound = getattr(accept.bounds(), end)
            if end in accept.model_fields_set and bound is not None and bound.relative:
                raise ValueError(
                    f"event_time.accept.{end}: {bound.text!r} is relative to the ingestion time, and continuous processing "
                    "has no current time; give a date, or null"
                )
        c = self.continuous or Continuous()
        for field, expr in [
            ("continuous.filter", c.filter),
            *((f"continuous.rules.{k}", v) for k, v in c.rules.items()),
        ]:
            if expr:
                try:
                    check_expression(field, expr)
                except ContinuousError as exc:
                    raise ValueError(f"{exc.field}: {exc}") from None
        return self


@dataclass(frozen=True)
class Pipeline:
    """A validated spec with its schema read and its flattening planned."""

    spec: PipelineSpec
    spec_path: Path
    #: A derived pipeline's are its upstream's: the columns it reads come from there.
    schema_file: Path
    schema: Struct
    #: The pipeline whose table a derived pipeline reads (None for Kafka sources).
    upstream: Pipeline | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def derived(self) -> bool:
        """Run by the derive job: it reads a table, or does event-time work on its events."""
        return self.spec.derives

    @cached_property
    def derivation(self) -> Derivation:
        """A derived pipeline's sections, with the columns of the table it reads."""
        from sluice.spec import compatibility
        from sluice.spec.columns import EVENT_TIME

        if not self.derived:
            raise ValueError(f"{self.name} does no event-time work; it derives nothing")
        s = self.spec
        inputs = (
            compatibility.expected(self.upstream)[0].columns
            if self.upstream is not None
            else compatibility.plain_columns(self)
        )
        return Derivation(
            filter=s.filter,
            deduplicate=s.deduplicate,
            window=s.window,
            aggregate=s.aggregate,
            group_by=s.group_by,
            watermark=s.watermark,
            output_mode=s.output_mode,
            state=s.state,
            sink_format=s.sink.format,
            inputs=inputs,
            default_time=EVENT_TIME,
        )

    @property
    def rescue_fields(self) -> list[str]:
        """The fields whose mismatched values are rescued instead of quarantined."""
        return sorted(f for f, action in self.spec.on_type_mismatch.items() if action == "rescue")

    @property
    def kafka(self) -> Source:
        """The Kafka source; only pipelines that read Kafka have one."""
        if not isinstance(self.spec.source, Source):
            raise InvalidInput(f"{self.name} reads the table of {self.spec.source.table}, not Kafka")
        return self.spec.source

    @property
    def event_time(self) -> EventTime:
        """How the Kafka events' time is read (a derived pipeline's upstream has it)."""
        if self.upstream is not None:
            return self.upstream.event_time
        assert self.spec.event_time is not None  # checked by PipelineSpec
        return self.spec.event_time

    @cached_property
    def plan(self) -> FlattenPlan:
        f = self.spec.flatten
        return plan_flatten(
            self.schema,
            separator=f.separator,
            rename=f.rename,
            explode=f.explode,
            keep=f.keep,
            reserved=(*METADATA_COLUMNS, self.spec.date_partition.column),
        )

    @property
    def table_format(self) -> TableFormat | None:
        """What the output table can do (None when the sink is a Kafka topic)."""
        return table_format(self.spec.sink.format)

    @property
    def sink_path(self) -> str:
        """Where output goes: a table path, or ``kafka://<brokers>/<topic>`` for Kafka sinks."""
        sink = self.spec.sink
        if sink.format == "kafka":
            return f"kafka://{self.sink_bootstrap}/{sink.topic}"
        assert sink.path is not None  # checked by Sink
        return _under_home(sink.path)

    @property
    def quarantine_path(self) -> str:
        sink = self.spec.sink
        if sink.format == "kafka":
            return f"kafka://{self.sink_bootstrap}/{self.quarantine_topic}"
        assert sink.path is not None
        return _under_home(sink.quarantine_path or sink.path.rstrip("/") + "_quarantine")

    @property
    def sink_bootstrap(self) -> str:
        return self.spec.sink.bootstrap_servers or self.kafka.bootstrap_servers

    @property
    def quarantine_topic(self) -> str:
        return self.spec.sink.quarantine_topic or f"{self.spec.sink.topic}-quarantine"

    @property
    def checkpoint_path(self) -> str:
        return _under_home(self.spec.checkpoint)

    @property
    def audit_path(self) -> str:
        """Per-batch counts (records in, rows out, rows quarantined) as JSON files."""
        return self.checkpoint_path.rstrip("/") + "/sluice_audit"

    def backfill_checkpoint_path(self, backfill_id: str) -> str:
        """Each backfill is its own available-now query, so it has its own checkpoint."""
        return f"{self.checkpoint_path.rstrip('/')}_backfills/{backfill_id}"

    @property
    def accepted_times(self) -> eventtime.Bounds:
        """The event times this pipeline accepts (a continuous branch has no relative bounds)."""
        return self.event_time.accept.bounds(continuous=self.spec.mode == "continuous")

    @property
    def quarantine_table(self) -> str:
        return f"{self.name}_quarantine"

    @cached_property
    def split(self) -> dict[str, Any]:
        """What decides whether a record goes to the table or to the quarantine.

        A batch replayed after a crash must be split as it was when it was planned: one of its
        two tables may already hold its part, and the other writes the rest."""
        drops = {n: r.model_dump(mode="json") for n, r in self.spec.expectations.rows.items() if r.action == "drop"}
        return {
            "schema": json.loads(self.schema.to_spark_json()),
            "event_time": self.event_time.model_dump(mode="json"),
            "flatten": self.spec.flatten.model_dump(mode="json") if drops else None,
            "dropping_rules": drops,
            # Only when set, so that checkpoints recorded before these existed still match.
            **({"rescue": self.rescue_fields} if self.rescue_fields else {}),
            **(
                {"coerce": {f: c.model_dump(mode="json") for f, c in self.spec.coerce.items()}}
                if self.spec.coerce
                else {}
            ),
        }


def _under_home(path: str) -> str:
    return config.under_store(path)
