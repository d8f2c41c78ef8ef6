"""What a new user may feed the spec loader: each case is refused at once, in one line that
names the file and the field, and never as a traceback (issue 13's table, row by row)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.spec import SpecError, all_pipelines, load_all, load_pipeline, valid_pipelines
from sluice.spec.model import normalize_duration

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "device_signal" / "v1.json"


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "doors",
        "source": {"topics": ["doors"]},
        "schema": str(SCHEMA),
        "event_time": {"field": "timestamp", "format": "epoch_seconds"},
        "sink": {"path": "tables/doors"},
        "checkpoint": "checkpoints/doors",
    }
    for key, value in overrides.items():
        base[key] = base[key] | value if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_PIPELINES", str(tmp_path / "pipelines"))
    (tmp_path / "pipelines").mkdir()
    return tmp_path


def write(home: Path, data: dict[str, Any] | str | bytes, name: str = "doors.yaml") -> Path:
    path = home / "pipelines" / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


def refused(path: Path) -> str:
    with pytest.raises(SpecError) as exc:
        load_pipeline(path)
    text = str(exc.value)
    assert str(path) in text and "\n" not in text and "Traceback" not in text
    return text


def test_a_valid_spec_loads(home: Path) -> None:
    assert load_pipeline(write(home, spec())).name == "doors"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        ("name: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9)"),
    ],
)
def test_a_spec_that_is_not_utf8_text(home: Path, content: bytes, words: str) -> None:
    assert words in refused(write(home, content))


def test_a_schema_that_is_not_utf8_text(home: Path) -> None:
    schema = home / "latin1.json"
    schema.write_bytes('{"type": "struct", "fields": [{"name": "caf\xe9"}]}'.encode("latin-1"))
    text = refused(write(home, spec(schema=str(schema))))
    assert "schema" in text and str(schema) in text and "UTF-8" in text


def test_a_yaml_alias_bomb_is_refused_at_once(home: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    started = time.monotonic()
    assert "aliases" in refused(write(home, "\n".join(lines) + "\nname: bomb\n"))
    assert time.monotonic() - started < 1


def test_a_key_given_twice_is_refused(home: Path) -> None:
    text = yaml.safe_dump(spec()) + "name: other\n"
    assert "'name' is given twice" in refused(write(home, text))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"sink": {"path": "../../etc"}}, "outside SLUICE_HOME"),
        ({"checkpoint": "/"}, "allow_external_paths"),
        ({"sink": {"path": "/tmp/elsewhere"}}, "allow_external_paths"),
        ({"sink": {"path": "tables/x", "quarantine_path": "../q"}}, "outside SLUICE_HOME"),
    ],
)
def test_paths_outside_sluice_home_are_refused(home: Path, change: dict[str, Any], words: str) -> None:
    assert words in refused(write(home, spec(**change)))


def test_external_paths_when_the_spec_says_so_and_uris_always(home: Path) -> None:
    external = load_pipeline(write(home, spec(sink={"path": "/data/doors"}, allow_external_paths=True)))
    assert external.sink_path == "/data/doors"
    uri = load_pipeline(write(home, spec(sink={"path": "s3a://bucket/doors"}, checkpoint="s3a://bucket/cp")))
    assert uri.sink_path == "s3a://bucket/doors"
    inside = load_pipeline(write(home, spec(checkpoint=str(home / "home" / "cp"))))
    assert inside.checkpoint_path == str(home / "home" / "cp")


@pytest.mark.parametrize("topic", ["..", ".", "x" * 250, "bad topic", "[bold]x"])
def test_kafka_topic_rules(home: Path, topic: str) -> None:
    assert "source.topics[0]" in refused(write(home, spec(source={"topics": [topic]})))


def test_the_longest_legal_topic_is_accepted(home: Path) -> None:
    assert load_pipeline(write(home, spec(source={"topics": ["t" * 249]}))).spec.source.topics == ["t" * 249]


@pytest.mark.parametrize(
    ("given_", "normal"),
    [("1h", "1 hour"), ("1.5 minutes", "90 seconds"), ("1 day", "1 day"), ("500ms", "500 milliseconds")],
)
def test_durations_are_normalised_before_spark_or_a_form_sees_them(home: Path, given_: str, normal: str) -> None:
    p = load_pipeline(write(home, spec(trigger={"processing_time": given_}, supervision={"max_stall": given_})))
    assert p.spec.trigger.processing_time == normal == p.spec.supervision.max_stall == normalize_duration(normal)


@pytest.mark.parametrize("bad", ["1 week", "1.0005 seconds", "fast", "-1 seconds"])
def test_durations_outside_the_grammar_are_refused(home: Path, bad: str) -> None:
    assert "trigger.processing_time" in refused(write(home, spec(trigger={"processing_time": bad})))


@pytest.mark.parametrize("cron", ["99 99 99 99 99", "* * * *", "0 25 * * *"])
def test_cron_schedules_are_checked(home: Path, cron: str) -> None:
    assert "supervision.schedule" in refused(write(home, spec(supervision={"schedule": cron})))


@pytest.mark.parametrize(
    ("sql", "words"),
    [("signal >", "not valid Spark SQL"), ("no_such_column > 3", "no column 'no_such_column'")],
)
def test_sql_rules_are_parsed_and_their_columns_checked(home: Path, sql: str, words: str) -> None:
    text = refused(write(home, spec(expectations={"rows": {"strong": {"sql": sql}}})))
    assert "expectations.rows.strong" in text and words in text


def test_specs_that_share_a_name_table_or_checkpoint_are_refused_naming_both(home: Path) -> None:
    first = write(home, spec(), "a.yaml")
    write(home, spec(sink={"path": "tables/other"}, checkpoint="checkpoints/other"), "b.yaml")  # same name
    write(home, spec(name="third", checkpoint="checkpoints/other3"), "c.yaml")  # same table as a.yaml
    loaded = load_all()
    assert [type(x).__name__ for _, x in loaded] == ["Pipeline", "SpecError", "SpecError"]
    for path, error in loaded[1:]:
        assert str(first) in str(error) and str(path) in str(error)
    good, bad = valid_pipelines()
    assert [p.name for p in good] == ["doors"] and len(bad) == 2
    with pytest.raises(SpecError):
        all_pipelines()


def test_every_problem_of_a_spec_is_reported(home: Path) -> None:
    with pytest.raises(SpecError) as exc:
        load_pipeline(write(home, spec(name="Bad Name", sink={"format": "csv"}, checkpoint="")))
    fields = [field for field, _ in exc.value.problems]
    assert fields == ["name", "sink.format", "checkpoint"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_spec_error(home: Path, content: bytes) -> None:
    path = write(home, content, "random.yaml")
    try:
        load_pipeline(path)
    except SpecError as exc:  # anything else fails the test; this one must name the file
        assert str(path) in str(exc)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from([*sorted(spec()), "mode", "trigger", "extra"]), yaml_values, max_size=8))
def test_random_yaml_only_ever_raises_spec_error(home: Path, data: dict[str, Any]) -> None:
    path = write(home, yaml.safe_dump(spec() | data), "random.yaml")
    try:
        load_pipeline(path)
    except SpecError as exc:  # anything else fails the test; this one must name the file
        assert str(path) in str(exc)
