"""What a continuous branch may declare: refused early, with the part named and micro-batch suggested."""

from __future__ import annotations

import pytest
import yaml

from sluice import config
from sluice.spec import SpecError, load_pipeline
from sluice.spec.continuous import (
    SOURCE_DEFAULTS,
    ContinuousError,
    check_expression,
    check_slots,
    explain_spark_error,
    required_slots,
    source_options,
)

SHIPPED = config.PROJECT_ROOT / "pipelines" / "payments_fraud.yaml"


def variant(tmp_path, change) -> str:
    spec = yaml.safe_load(SHIPPED.read_text())
    spec["schema"] = str(config.PROJECT_ROOT / "schemas" / "payment" / "v1.json")
    change(spec)
    path = tmp_path / "branch.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def refused(tmp_path, change) -> str:
    with pytest.raises(SpecError) as err:
        load_pipeline(variant(tmp_path, change))
    return str(err.value)


def test_the_shipped_fraud_branch_is_valid() -> None:
    p = load_pipeline(SHIPPED)
    assert p.spec.mode == "continuous" and p.spec.sink.format == "kafka"
    assert list(p.spec.continuous.rules) == ["large_amount", "cross_border_online", "prepaid_gambling"]
    assert p.sink_path.endswith("/payments-verdicts") and p.quarantine_topic == "payments-verdicts-quarantine"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda s: s["continuous"]["rules"].update(burst="count(*) > 3"),
            "continuous.rules.burst: count() is an aggregation",
        ),
        (lambda s: s["continuous"]["rules"].update(avg="amount > AVG(amount)"), "AVG() is an aggregation"),
        (
            lambda s: s["continuous"].update(filter="created_at > current_timestamp()"),
            "continuous.filter: current_timestamp() is a current-time function",
        ),
        (lambda s: s["continuous"]["rules"].update(r="rank() over (order by amount) = 1"), "window (OVER"),
        (lambda s: s["continuous"]["rules"].update(r="size(explode(array(1))) > 0"), "explode() is an explode"),
        (lambda s: s.update(flatten={"explode": ["x"]}), "flatten.explode: explode turns one record into many rows"),
        (
            lambda s: s.update(sink={"format": "delta", "path": "tables/x"}),
            "sink.format delta: a continuous branch writes to Kafka only",
        ),
        (
            lambda s: s.update(watermark={"column": "created_at", "delay": "1 minute"}),
            "watermark: continuous processing does not support a watermark",
        ),
        (
            lambda s: s.update(deduplicate=["payment_id"]),
            "deduplicate: continuous processing does not support deduplication",
        ),
        (
            lambda s: s.update(join={"topic": "cards"}),
            "join: continuous processing does not support a join with another stream",
        ),
        (lambda s: s.update(trigger={"processing_time": "1 second"}), "no micro-batch trigger"),
        (lambda s: s["continuous"].update(columns=["nope"]), "continuous.columns[0]: no column 'nope'"),
        (lambda s: s["continuous"].update(key="nope"), "continuous.key: no column 'nope'"),
        (lambda s: s.update(mode="micro_batch"), "sink.format kafka is for continuous branches"),
    ],
)
def test_what_continuous_mode_cannot_do_is_refused(tmp_path, change, words) -> None:
    message = refused(tmp_path, change)
    assert words in message
    if "columns" not in words and "key" not in words and "kafka is for" not in words and "trigger" not in words:
        assert "mode: micro_batch" in message  # the way out is always named


def test_map_like_expressions_pass() -> None:
    check_expression("r", "upper(card_country) <> merchant_country AND amount * 1.1 > 2000")
    check_expression("r", "merchant_category = 'count(*)'")  # inside a string literal: not a call
    check_expression("r", "coalesce(amount, 0) > 10 AND channel IN ('online', 'atm')")
    with pytest.raises(ContinuousError):
        check_expression("r", "sum (amount) > 1")


def test_sparks_unsupported_operation_errors_are_translated() -> None:
    msg = explain_spark_error(
        "fraud", "[UNSUPPORTED_FEATURE] Continuous processing does not support Aggregate operations."
    )
    assert msg is not None and "fraud: continuous processing does not support Aggregate operations" in msg
    assert "mode: micro_batch" in msg
    assert explain_spark_error("fraud", "Connection refused") is None


def test_task_slots_against_partitions() -> None:
    assert required_slots("local[4]") == 4
    assert required_slots("local") == 1
    assert required_slots("local[*]") >= 1
    assert required_slots("spark://master:7077") is None
    check_slots("fraud", partitions=2, slots=2)
    with pytest.raises(ContinuousError, match=r"6 partitions but Spark offers 2 task slots.*local\[6\]"):
        check_slots("fraud", partitions=6, slots=2)


def test_a_branch_on_a_cluster_asks_for_a_core_per_partition(monkeypatch) -> None:
    """A shared standalone master gives an application its default share of cores (the
    layout's: one); a continuous branch short of slots would hang, so it asks for its own."""
    from sluice.ops import stream

    monkeypatch.setattr(stream, "total_partitions", lambda bootstrap, topics: 3)
    fraud = load_pipeline(SHIPPED)
    assert stream.continuous_conf(fraud, "spark://master:7077") == {"spark.cores.max": "3"}
    assert stream.continuous_conf(fraud, "local[4]") == {}
    with pytest.raises(ContinuousError, match="3 partitions but Spark offers 2 task slots"):
        stream.continuous_conf(fraud, "local[2]")
    ingest = load_pipeline(config.PROJECT_ROOT / "pipelines" / "device_signals.yaml")
    assert stream.continuous_conf(ingest, "spark://master:7077") == {}


def test_a_continuous_source_gets_a_short_fetch_wait_unless_the_spec_sets_one() -> None:
    fraud = load_pipeline(SHIPPED)
    opts = source_options(fraud.spec.source.spark_options())
    assert opts["kafka.fetch.max.wait.ms"] == SOURCE_DEFAULTS["kafka.fetch.max.wait.ms"] == "5"
    assert opts["subscribe"] == "payments"
    assert source_options({"kafka.fetch.max.wait.ms": "50"})["kafka.fetch.max.wait.ms"] == "50"


def test_continuous_branches_accept_absolute_event_time_bounds_only(tmp_path) -> None:
    # No current time in continuous mode: the default relative not_after is dropped...
    assert load_pipeline(variant(tmp_path, lambda s: None)).accepted_times.describe() == (
        "1970-01-01T00:00:00Z to 9999-12-30T23:59:59.999999Z"
    )
    # ...and one the spec asks for is refused, with the field named.
    with pytest.raises(SpecError, match="event_time.accept.not_after: '2 days' is relative to the ingestion time"):
        load_pipeline(variant(tmp_path, lambda s: s["event_time"].update(accept={"not_after": "2 days"})))
    dated = variant(tmp_path, lambda s: s["event_time"].update(accept={"not_after": "2100-01-01"}))
    assert load_pipeline(dated).accepted_times.describe().endswith("to 2100-01-01T00:00:00Z")


def test_a_branch_picks_its_engine_and_real_time_mode_checkpoints_no_faster_than_spark_allows(tmp_path) -> None:
    continuous = load_pipeline(variant(tmp_path, lambda s: s["continuous"].pop("checkpoint_interval", None)))
    assert (continuous.spec.continuous.engine, continuous.spec.continuous.interval) == ("continuous", "1 second")
    real_time = load_pipeline(
        variant(tmp_path, lambda s: s["continuous"].update(engine="real_time", checkpoint_interval=None))
    )
    assert (real_time.spec.continuous.engine, real_time.spec.continuous.interval) == ("real_time", "30 seconds")

    words = refused(tmp_path, lambda s: s["continuous"].update(engine="real_time", checkpoint_interval="1 second"))
    assert "continuous.checkpoint_interval" in words and "at most every 5 seconds" in words
    words = refused(
        tmp_path,
        lambda s: (
            s["continuous"].update(engine="real_time", checkpoint_interval=None),
            s["source"].update(max_offsets_per_trigger=100),
        ),
    )
    assert "source.max_offsets_per_trigger" in words and "Real-Time Mode" in words
    words = refused(tmp_path, lambda s: s["continuous"].update(engine="flink"))
    assert "continuous.engine" in words and "'continuous' or 'real_time'" in words
