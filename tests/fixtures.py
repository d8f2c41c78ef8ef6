"""One Kafka broker and one Spark session per test session, started only when a test asks.

Both live under a temporary SLUICE_HOME on free loopback ports, so tests never touch the
user's own broker or tables. The jars come from where `make setup` put them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice import config, registry
from sluice.dev.broker import EmbeddedBroker
from sluice.dev.objectstore import ObjectStoreError, S3Server
from sluice.dev.ports import free_port
from sluice.dev.postgres import PostgresServer
from sluice.records import audit
from sluice.spec import Pipeline, load_pipeline
from sluice.topics import create_topics

JARS = Path(os.environ.get("SLUICE_JARS") or config.PROJECT_ROOT / ".sluice" / "jars")


@pytest.fixture(scope="session")
def sluice_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not any((JARS / "spark").glob("*.jar")) or not any((JARS / "kafka").glob("*.jar")):
        pytest.fail(f"no jars under {JARS}: run `make setup` first (the README's test command does)")
    home = tmp_path_factory.mktemp("sluice-home")
    saved = dict(os.environ)
    port = free_port()
    os.environ.update(
        SLUICE_HOME=str(home),
        SLUICE_JARS=str(JARS),
        SLUICE_KAFKA_PORT=str(port),
        SLUICE_KAFKA_CONTROLLER_PORT=str(free_port()),
        SLUICE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    yield home
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def broker(sluice_home: Path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker.default()
    b.start(timeout=120)
    yield b
    b.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server (Debian's) per test session: the run-state store of the tests
    that play several hosts; each takes a database of its own (:func:`shared_state`)."""
    try:
        server = PostgresServer().start()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


def shared_state(server: PostgresServer, monkeypatch: pytest.MonkeyPatch, ttl: float | None = None) -> dict[str, str]:
    """Point this test (and the drivers it starts) at a fresh run-state database; its env."""
    database = f"state_{uuid.uuid4().hex[:12]}"
    server.create_database(database)
    env = {"SLUICE_STATE": server.url(database), "PGPASSFILE": str(server.passfile)}
    if ttl is not None:
        env["SLUICE_LEASE_TTL"] = str(ttl)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3 server (S3Proxy) per test session, with a bucket ``sluice``; tests that put
    tables and checkpoints on s3a:// point their drivers at it with :func:`on_s3`."""
    try:
        server = S3Server(tmp_path_factory.mktemp("s3")).start()
    except ObjectStoreError as exc:
        pytest.fail(str(exc))
    server.create_bucket(BUCKET)
    yield server
    server.stop()


BUCKET = "sluice"


def on_s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """Set this test (and the drivers it starts) up for the S3 server; a fresh folder's URI."""
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    return f"s3a://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def spark(sluice_home: Path) -> Iterator[Any]:
    from jobs.session import local_session

    session = local_session(
        "sluice-tests",
        master="local[2]",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    yield session
    session.stop()


@contextmanager
def delta_checkpoints_every(spark: Any, commits: int) -> Iterator[None]:
    """Tables created inside write a Delta checkpoint every ``commits`` commits (Delta's
    default is 10). A checkpoint costs about 1.8 s here, so only the tests about reading
    through one ask for it early."""
    key = "spark.databricks.delta.properties.defaults.checkpointInterval"
    spark.conf.set(key, str(commits))
    try:
        yield
    finally:
        spark.conf.unset(key)


def new_topic(broker: EmbeddedBroker, partitions: int = 2, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [name], partitions)
    return name


def make_pipeline(
    folder: Path,
    topic: str,
    schema: str | dict[str, Any] = "device_signal/v1.json",
    store: str | None = None,
    **fields: Any,
) -> Pipeline:
    """Write a spec for ``topic`` with its tables and checkpoint under ``store`` (a URI, e.g.
    from :func:`on_s3`) or ``folder``; the spec itself goes in ``folder``."""
    name = fields.pop("name", "p_" + topic.replace("-", "_"))
    where = store or str(folder)
    spec: dict[str, Any] = {
        "name": name,
        "source": {"topics": [topic], "starting_offsets": "earliest"},
        "schema": schema if isinstance(schema, dict) else str(config.PROJECT_ROOT / "schemas" / schema),
        "event_time": {"field": "timestamp", "format": "epoch_seconds"},
        "sink": {"format": "delta", "path": f"{where}/tables/{name}"},
        "checkpoint": f"{where}/checkpoints/{name}",
        "allow_external_paths": True,  # tests keep each test's tables in its own temporary folder
    }
    for key, value in fields.items():
        spec[key] = spec[key] | value if isinstance(value, dict) and key in spec else value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_pipeline(path, schemas=registry.schema_file)  # as the commands and the job do


def _totals(folders: list[Any]) -> dict[str, int]:
    """Sum the per-batch audit files, checking each batch reconciles on its own."""
    totals = {"records_in": 0, "records_out": 0, "records_quarantined": 0}
    for f in audit.audit_files(folders):
        batch = audit.read(f)
        assert batch.reconciles, batch
        for key in totals:
            totals[key] += getattr(batch, key)
    return totals


def audit_totals(pipeline: Pipeline) -> dict[str, int]:
    """The stream's batches, summed (see :func:`_totals`)."""
    return _totals([pipeline.audit_path])


def all_audit_totals(pipeline: Pipeline) -> dict[str, int]:
    """Like :func:`audit_totals`, over the stream's batches and every backfill's."""
    return _totals(audit.folders(pipeline))


def read_without_spark(fmt: str, path: str, columns: list[str] | None = None) -> Any:
    """A pipeline's table as another reader sees it: delta-rs for Delta, pyarrow over the
    files the Parquet log lists; local or on S3. Returns a pyarrow Table (empty if nothing is
    committed)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from sluice import storage
    from sluice.records import parquet_log

    empty = pa.table({c: [] for c in columns or []})
    if fmt == "delta":
        table = storage.delta_table(path)
        return table.to_pyarrow_table(columns=columns) if table is not None else empty
    located = [parquet_log.location(e.path).arrow() for e in parquet_log.committed_files(path)]
    if not located:
        return empty
    import pyarrow.parquet as pq

    fs, base = storage.Location(path).arrow()
    files = [f for _, f in located]
    # Files written before the spec gained a column lack it: read them all under the merged
    # schema, as a reader with schema merging does.
    dataset = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=base, filesystem=fs)
    schemas = [pq.read_schema(f, filesystem=fs) for f in files]
    merged = pa.unify_schemas([dataset.schema, *schemas], promote_options="permissive")
    dataset = ds.dataset(
        files, schema=merged, format="parquet", partitioning="hive", partition_base_dir=base, filesystem=fs
    )
    return dataset.to_table(columns=columns)


def kafka_keys(table: Any) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every row, duplicates kept."""
    cols = [table.column(c).to_pylist() for c in ("_kafka_topic", "_kafka_partition", "_kafka_offset")]
    return list(zip(*cols, strict=True))


KAFKA_KEYS = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]
Sent = set[tuple[str, int, int]]


def written_keys(p: Pipeline) -> list[tuple[str, int, int]]:
    """The Kafka coordinates of every row, table and quarantine, read without Spark
    (locally or from S3); duplicates kept."""
    fmt = p.spec.sink.format
    return kafka_keys(read_without_spark(fmt, p.sink_path, KAFKA_KEYS)) + kafka_keys(
        read_without_spark(fmt, p.quarantine_path, KAFKA_KEYS)
    )


def wait_written(p: Pipeline, count: int, why: Callable[[], str], timeout: float = 240) -> float:
    """Wait until ``count`` distinct records are written; the seconds it took. ``why`` says
    what to show when it times out (a driver's log)."""
    began = time.monotonic()
    while len(set(written_keys(p))) < count:
        assert time.monotonic() - began < timeout, f"{len(set(written_keys(p)))} of {count} written\n{why()}"
        time.sleep(0.5)
    return time.monotonic() - began


def exactly_once(p: Pipeline, sent: Sent) -> dict[str, int]:
    """A drill's verdict: the records the broker acknowledged, and how many of them are
    missing from (lost) or repeated in (duplicated) the table and its quarantine."""
    rows = written_keys(p)
    return {"records": len(sent), "lost": len(sent - set(rows)), "duplicated": len(rows) - len(set(rows))}


def python_driver(started: Any, timeout: float = 120) -> Any:
    """The Python driver (the job) of a launch (a ``sluice.ops.stream.Started``): the child of
    spark-submit's JVM, which a test pauses (SIGSTOP) or resumes."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        for proc in psutil.Process(started.driver.pid).children(recursive=True):
            try:
                if any(part.endswith("ingest.py") for part in proc.cmdline()):
                    return proc
            except psutil.Error:
                continue
        assert time.monotonic() < deadline, "no Python driver under the launch"
        time.sleep(0.2)


def read_verdicts(bootstrap: str, topic: str, expected: int, timeout: float) -> list[dict[str, Any]]:
    """A continuous branch's JSON records on ``topic`` (confluent-kafka, from the start)
    until ``expected`` distinct sources are seen or ``timeout`` passes; duplicates kept."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len({(v["source"]["partition"], v["source"]["offset"]) for v in got}) < expected:
            if time.monotonic() > deadline:
                break
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return got


def run_available_now(spark: Any, pipeline: Pipeline) -> None:
    from jobs.stream.modes import run

    error = run(spark, pipeline, available_now=True)
    assert error is None, error


class Airflow:
    """Airflow 3 in its own venv, pointed at the test broker, SLUICE_HOME and Spark runtime."""

    def __init__(self, home: Path) -> None:
        from sluice.airflow.env import airflow_binary, airflow_env

        self.binary = str(airflow_binary())
        self.pipelines = home / "pipelines"
        self.pipelines.mkdir(exist_ok=True)
        self.env = airflow_env() | {
            "AIRFLOW_HOME": str(home / "airflow"),
            "SLUICE_PIPELINES": str(self.pipelines),
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        }

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args],
            env=os.environ | self.env | (env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        python = str(Path(self.binary).with_name("python"))
        return subprocess.run(
            [python, "-c", code], env=os.environ | self.env | (env or {}), capture_output=True, text=True, timeout=300
        )

    def dags_test(self, dag_id: str, conf: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> DagTest:
        """`airflow dags test`: one whole DAG run, in-process, on the real components."""
        done = self.run(*_dags_test_args(dag_id, conf), env=env)
        return DagTest.of(done.stdout + done.stderr, done.returncode)

    def resident(self, request: pytest.FixtureRequest) -> ResidentAirflow:
        """One Airflow interpreter for a test's many `airflow dags test` commands (see there),
        ended with the test."""
        resident = ResidentAirflow(self)
        request.addfinalizer(resident.close)
        return resident


def _dags_test_args(dag_id: str, conf: dict[str, Any] | None) -> list[str]:
    return ["dags", "test", dag_id] + (["-c", json.dumps(conf)] if conf is not None else [])


#: Runs in the Airflow venv: reads one command line (JSON) at a time, runs it through Airflow's
#: own CLI parser and command, with fds 1 and 2 sent to the file named, and answers the exit code.
_RESIDENT = """
import json, os, sys, traceback
from airflow.cli import cli_parser
answer = os.fdopen(os.dup(1), "w", buffering=1)
parser = cli_parser.get_parser()
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(request["output"], "wb") as output:
        os.dup2(output.fileno(), 1); os.dup2(output.fileno(), 2)
        try:
            args = parser.parse_args(request["args"])
            args.func(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
    answer.write(json.dumps({"code": code}) + "\\n")
"""


class ResidentAirflow:
    """`airflow dags test` commands run one after the other by one Airflow interpreter.

    Each command is what `airflow dags test` runs (Airflow's CLI parser and its ``dag_test``,
    which parses the DAG files again and runs the DAG in-process), and its output is read as
    the command's. What the commands no longer pay each time: importing Airflow, its providers
    and Sluice (about 7 s), and building the in-process execution API, which Airflow keeps for
    the process (about 8 s, docs/measured.md). The environment is the one the interpreter
    started with: a test sets its variables first.
    """

    def __init__(self, airflow: Airflow) -> None:
        python = str(Path(airflow.binary).with_name("python"))
        self.folder = Path(tempfile.mkdtemp(prefix="sluice-airflow-"))
        self.count = 0
        self.proc = subprocess.Popen(
            [python, "-c", _RESIDENT],
            env=os.environ | airflow.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def dags_test(self, dag_id: str, conf: dict[str, Any] | None = None) -> DagTest:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        output = self.folder / f"{self.count}.log"
        request = {"args": _dags_test_args(dag_id, conf), "output": str(output)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            said = output.read_text()[-3000:] if output.exists() else "(no output)"
            pytest.fail(f"the resident Airflow ended (exit {self.proc.wait()}): {said}")
        return DagTest.of(output.read_text(), json.loads(answer)["code"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass(frozen=True)
class DagTest:
    state: str
    log: str

    @classmethod
    def of(cls, out: str, code: int) -> DagTest:
        m = re.search(r"DagRun Finished: dag_id=\S+ .*?state=(\w+)", out)
        return cls(m.group(1) if m else f"unknown (exit {code})", out)


@pytest.fixture(scope="session")
def airflow(sluice_home: Path, broker: EmbeddedBroker) -> Airflow:
    af = Airflow(sluice_home)
    migrated = af.run("db", "migrate", timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return af


#: Chromium as Debian ships it (make test installs it); Playwright cannot download its own here.
CHROMIUM = "/usr/bin/chromium"
#: Without the background-networking flags Chromium keeps calling Google's hosts, which a closed
#: network refuses; the rest make a headless run quiet and independent of any profile.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Playwright, closed afterwards."""
    assert shutil.which(CHROMIUM), f"{CHROMIUM} is missing: make test installs Debian's chromium"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
