from __future__ import annotations

from pathlib import Path

import pytest

from sluice.spec import SpecError, all_pipelines, duration_seconds, load_pipeline
from sluice.spec.pipeline import KAFKA_DEFAULTS
from tests.conftest import ROOT

GOOD = """
name: signals
source:
  bootstrap_servers: localhost:9092
  topics: [device-signals]
schema: {schema}
event_time: {field: timestamp, format: epoch_seconds}
sink: {format: delta, path: tables/signals}
checkpoint: checkpoints/signals
"""


def write(tmp_path: Path, text: str, schema: str | None = None) -> Path:
    schema = schema or str(ROOT / "schemas/device_signal/v1.json")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text.replace("{schema}", schema))
    return spec


def test_all_shipped_specs_are_valid() -> None:
    names = {p.name for p in all_pipelines()}
    assert {"device_signals", "payments", "github_events", "wikimedia_recentchange"} <= names


def test_a_spec_and_schema_outside_the_repository(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    schema = tmp_path / "s.ddl"
    schema.write_text("timestamp BIGINT NOT NULL, device STRUCT<id: STRING>")
    p = load_pipeline(write(tmp_path, GOOD, schema="s.ddl"))
    assert p.schema_file == schema
    assert p.sink_path == str(tmp_path / "home/tables/signals")
    assert p.quarantine_path == str(tmp_path / "home/tables/signals_quarantine")
    assert p.plan.names == ["timestamp", "device_id"]
    assert p.spec.trigger.spark_kwargs() == {"processingTime": "10 seconds"}


def test_relative_paths_resolve_under_a_shared_store(tmp_path, monkeypatch) -> None:
    """On a cluster, SLUICE_STORE puts every host's tables and checkpoints in one place."""
    monkeypatch.setenv("SLUICE_STORE", "s3a://sluice/prod/")
    p = load_pipeline(write(tmp_path, GOOD))
    assert p.sink_path == "s3a://sluice/prod/tables/signals"
    assert p.quarantine_path == "s3a://sluice/prod/tables/signals_quarantine"
    assert p.checkpoint_path.startswith("s3a://sluice/prod/")
    with pytest.raises(SpecError, match="leads outside SLUICE_STORE"):
        load_pipeline(write(tmp_path, GOOD.replace("tables/signals", "../elsewhere/signals")))


def test_defaults_and_spark_options(tmp_path) -> None:
    p = load_pipeline(write(tmp_path, GOOD))
    assert p.spec.sink.format == "delta"
    assert p.spec.date_partition.column == "date"
    assert p.spec.source.spark_options() == KAFKA_DEFAULTS | {
        "kafka.bootstrap.servers": "localhost:9092",
        "subscribe": "device-signals",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
    }


def test_kafka_timeouts_default_short_and_stay_consistent(tmp_path) -> None:
    def options(extra: str) -> dict[str, str]:
        text = GOOD.replace("topics: [device-signals]", f"topics: [a]\n  options: {{{extra}}}")
        return load_pipeline(write(tmp_path, text)).spec.source.spark_options()

    api, request = "kafka.default.api.timeout.ms", "kafka.request.timeout.ms"
    assert int(KAFKA_DEFAULTS[api]) < 60_000, "shorter than Kafka's minute, which stalled a lost leader's stream"
    assert options(f"{request}: '40000'")[api] == "40000"  # a longer request timeout set alone still fits
    assert options(f"{request}: '5000'")[api] == KAFKA_DEFAULTS[api]
    assert options(f"{api}: '90000'")[api] == "90000"
    with pytest.raises(SpecError, match="must be at least options.kafka.request.timeout.ms"):
        options(f"{request}: '40000', {api}: '20000'")
    with pytest.raises(SpecError, match="'soon': give a positive number of milliseconds"):
        options(f"{api}: soon")


def test_environment_interpolation(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BROKERS", "kafka-1:9092,kafka-2:9092")
    text = GOOD.replace("localhost:9092", "${BROKERS}").replace("tables/signals", "'${TABLES:-/data}/signals'")
    text += "allow_external_paths: true\n"
    p = load_pipeline(write(tmp_path, text))
    assert p.spec.source.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert p.sink_path == "/data/signals"
    with pytest.raises(SpecError, match=r"source.bootstrap_servers: \$\{NOPE\} is not set"):
        load_pipeline(write(tmp_path, GOOD.replace("localhost:9092", "${NOPE}")))


def test_a_source_without_brokers_takes_the_platforms_from_the_loader_not_the_model(tmp_path, monkeypatch) -> None:
    import yaml
    from pydantic import ValidationError

    from sluice.spec.pipeline import PipelineSpec

    monkeypatch.setenv("SLUICE_KAFKA_BOOTSTRAP", "platform-1:9092")
    text = GOOD.replace("  bootstrap_servers: localhost:9092\n", "")
    assert load_pipeline(write(tmp_path, text)).spec.source.bootstrap_servers == "platform-1:9092"
    # The model alone reads no environment: validated without the loader, it asks for them.
    data = yaml.safe_load(text.replace("{schema}", str(ROOT / "schemas/device_signal/v1.json")))
    with pytest.raises(ValidationError, match="no Kafka brokers: give source.bootstrap_servers"):
        PipelineSpec.model_validate(data)
    with pytest.raises(SpecError, match="source.bootstrap_servers"):  # given, but empty
        load_pipeline(write(tmp_path, GOOD.replace("localhost:9092", "''")))


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("format: delta", "format: csv", "sink.format", "'delta', 'parquet' or 'kafka'"),
        (
            "topics: [device-signals]",
            "topic_pattern: 'dev.*'\n  topics: [x]",
            "source",
            "exactly one of 'topics'",
        ),
        ("name: signals", "name: Signals!", "name", "should match pattern"),
        ("format: epoch_seconds", "format: yesterday", "event_time.format", "neither one of iso8601"),
        ("field: timestamp", "field: nope", "event_time.field", "no field 'nope'"),
        ("field: timestamp", "field: device", "event_time.field", "is a struct"),
        ("format: epoch_seconds", "format: iso8601", "event_time.format", "needs a string field"),
        ("checkpoint: checkpoints/signals", "", "checkpoint", "Field required"),
        ("name: signals", "name: signals\nsurprise: 1", "surprise", "Extra inputs are not permitted"),
        (
            "topics: [device-signals]",
            "topics: [a]\n  options: {subscribe: b}",
            "source",
            "set by source.topics",
        ),
        (
            "topics: [device-signals]",
            "topics: [a]\n  options: {foo: b}",
            "source",
            "not a Kafka client setting",
        ),
        ("sink:", "coerce: {signal: {json_text: true}}\nsink:", "coerce.signal.json_text", "applies to STRING"),
        ("sink:", "coerce: {battery: {round: half_up}}\nsink:", "coerce.battery.round", "applies to DECIMAL"),
        ("sink:", "coerce: {nope: {round: half_up}}\nsink:", "coerce.nope", "no field 'nope'"),
        ("sink:", "coerce: {device: {json_text: true}}\nsink:", "coerce.device", "only simple types"),
        ("sink:", "coerce: {timestamp: {from_string: true}}\nsink:", "coerce.timestamp", "event_time.format"),
        ("sink:", "coerce: {signal: {round: half_down}}\nsink:", "coerce.signal.round", "half_up"),
    ],
)
def test_bad_specs_name_file_field_and_expectation(tmp_path, old, new, field, message) -> None:
    spec = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(SpecError) as err:
        load_pipeline(spec)
    assert err.value.file == str(spec)
    assert err.value.field == field
    assert message in err.value.message


def test_passthrough_security_options(tmp_path) -> None:
    text = GOOD.replace(
        "topics: [device-signals]",
        "topics: [a]\n  options: {kafka.security.protocol: SASL_SSL, kafka.sasl.mechanism: PLAIN}",
    )
    opts = load_pipeline(write(tmp_path, text)).spec.source.spark_options()
    assert opts["kafka.security.protocol"] == "SASL_SSL"


def test_timezone_and_trigger_checks(tmp_path) -> None:
    with pytest.raises(SpecError, match="date_partition.timezone: .*IANA"):
        load_pipeline(write(tmp_path, GOOD + "date_partition: {timezone: Mars/Olympus}\n"))
    with pytest.raises(SpecError, match="trigger.processing_time: .*not a duration"):
        load_pipeline(write(tmp_path, GOOD + "trigger: {processing_time: soon}\n"))
    with pytest.raises(SpecError, match="trigger: .*not both"):
        load_pipeline(write(tmp_path, GOOD + "trigger: {processing_time: 1 second, available_now: true}\n"))


def test_flatten_collision_is_a_spec_error(tmp_path) -> None:
    schema = tmp_path / "s.ddl"
    schema.write_text("timestamp BIGINT, a STRUCT<b_c: INT>, a_b STRUCT<c: INT>")
    with pytest.raises(SpecError, match=r"spec.yaml: flatten: column name 'a_b_c'"):
        load_pipeline(write(tmp_path, GOOD, schema=str(schema)))


def test_missing_schema_and_bad_yaml(tmp_path) -> None:
    with pytest.raises(SpecError, match="schema: .*nowhere.json: cannot read it"):
        load_pipeline(write(tmp_path, GOOD, schema="nowhere.json"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_pipeline(bad)


def test_unknown_pipeline_name_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match="known: .*device_signals"):
        load_pipeline("no_such_pipeline")


def test_supervision_and_maintenance_settings(tmp_path) -> None:
    p = load_pipeline(write(tmp_path, GOOD))
    assert p.spec.supervision.schedule == "*/5 * * * *"
    assert p.spec.maintenance.vacuum_retain_hours == 168
    custom = GOOD + "supervision: {schedule: null, max_stall: 90 seconds, max_lag: 5000}\n"
    s = load_pipeline(write(tmp_path, custom)).spec.supervision
    assert (s.schedule, duration_seconds(s.max_stall), s.max_lag) == (None, 90.0, 5000)
    with pytest.raises(SpecError, match="supervision.max_stall: .*not a duration"):
        load_pipeline(write(tmp_path, GOOD + "supervision: {max_stall: a while}\n"))
    with pytest.raises(SpecError, match="maintenance.vacuum_retain_hours: .*greater than or equal to 168"):
        load_pipeline(write(tmp_path, GOOD + "maintenance: {vacuum_retain_hours: 1}\n"))


@pytest.mark.parametrize("schedule", ["*/5 * * * *", "0 3 * * MON-FRI", "@hourly", "@daily", "0 0 1 */3 * 30"])
def test_schedules_that_airflow_accepts(tmp_path, schedule: str) -> None:
    p = load_pipeline(write(tmp_path, GOOD + f"maintenance: {{schedule: '{schedule}'}}\n"))
    assert p.spec.maintenance.schedule == schedule


@pytest.mark.parametrize(
    ("section", "schedule"),
    [("supervision", "every 5 minutes"), ("maintenance", "@nightly"), ("maintenance", "* * *")],
)
def test_a_bad_schedule_is_a_spec_error_not_a_broken_dag_file(tmp_path, section: str, schedule: str) -> None:
    with pytest.raises(SpecError, match=f"{section}.schedule: .*not a cron expression such as"):
        load_pipeline(write(tmp_path, GOOD + f"{section}: {{schedule: '{schedule}'}}\n"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250 ms", 0.25), ("500 milliseconds", 0.5), ("10 seconds", 10), ("2 min", 120), ("5 minutes", 300), ("1h", 3600)],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def test_event_times_are_bounded_by_default_and_bounds_are_checked(tmp_path) -> None:
    p = load_pipeline(write(tmp_path, GOOD))
    assert p.accepted_times.describe() == "1970-01-01T00:00:00Z to 1 day after ingestion"
    custom = GOOD.replace(
        "format: epoch_seconds}",
        "format: epoch_seconds, accept: {not_before: 30 days, not_after: 2100-01-01T00:00:00+01:00}}",
    )
    assert load_pipeline(write(tmp_path, custom)).accepted_times.describe() == (
        "30 days before ingestion to 2099-12-31T23:00:00Z"
    )
    open_ended = GOOD.replace("format: epoch_seconds}", "format: epoch_seconds, accept: {not_before: null}}")
    assert load_pipeline(write(tmp_path, open_ended)).accepted_times.describe() == (
        "0001-01-02T00:00:00Z to 1 day after ingestion"
    )
    for accept, message in (
        ("{not_after: +99999-01-01}", "neither a date or date-time"),
        ("{not_after: 10000-01-01}", "neither a date or date-time"),
        ("{not_before: 2020-01-01, not_after: 2019-01-01}", "must be earlier than not_after"),
        ("{not_after: soon}", "nor a duration from ingestion"),
    ):
        bad = GOOD.replace("format: epoch_seconds}", f"format: epoch_seconds, accept: {accept}}}")
        with pytest.raises(SpecError, match=message) as err:
            load_pipeline(write(tmp_path, bad))
        assert err.value.field.startswith("event_time.accept")
