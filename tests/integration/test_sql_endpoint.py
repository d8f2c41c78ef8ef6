"""The SQL endpoint as analysts and BI tools use it: Spark's Thrift server on the embedded
Derby catalog, with password logins, reached by beeline over JDBC, by PyHive through
SQLAlchemy's ``hive://`` URL (Superset's way) and by ``sluice sql``; read-only for all of them.

One endpoint serves the whole module; its tables come from a real ingest run, and every
expected count is computed from the tables by delta-rs and pyarrow, not by Spark.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sluice import config
from sluice.dev.generate import EventGenerator
from sluice.dev.ports import free_port
from sluice.dev.produce import send, synthetic
from sluice.ops import sql as ops
from sluice.ops.target import LocalTarget
from sluice.runtime import spark_home
from sluice.spec import Pipeline
from sluice.sql import passwords
from sluice.sql.client import EndpointSession, SqlError
from sluice.sql.settings import Endpoint
from tests.fixtures import make_pipeline, new_topic, read_without_spark, run_available_now

pytestmark = pytest.mark.integration

# No spaces: beeline's launcher script splits a password at them (its bug, not the server's).
USER, PASSWORD = "analyst", "c0rrect-h0rse:battery!staple"
RECORDS = 600

#: Per Kafka partition: good rows and quarantined records, side by side (a join of the two).
JOIN = """
SELECT g._kafka_partition AS p, g.good, q.bad
FROM (SELECT _kafka_partition, count(*) AS good FROM {name} GROUP BY _kafka_partition) g
JOIN (SELECT _kafka_partition, count(*) AS bad FROM {name}_quarantine GROUP BY _kafka_partition) q
  ON g._kafka_partition = q._kafka_partition
ORDER BY p
"""


@dataclass(frozen=True)
class Served:
    endpoint: Endpoint
    pipeline: Pipeline
    folder: Path
    expected: list[tuple[int, int, int]]  # (partition, good, bad), from delta-rs

    @property
    def outside(self) -> Path:
        """A Delta table that is not in the catalog."""
        return self.folder / "outside"

    def session(self, password: str = PASSWORD) -> EndpointSession:
        return EndpointSession("127.0.0.1", self.endpoint.port, auth="password", user=USER, password=password)


def counts_by_partition(pipeline: Pipeline) -> list[tuple[int, int, int]]:
    fmt = pipeline.spec.sink.format
    good = Counter(read_without_spark(fmt, pipeline.sink_path, ["_kafka_partition"]).column(0).to_pylist())
    bad = Counter(read_without_spark(fmt, pipeline.quarantine_path, ["_kafka_partition"]).column(0).to_pylist())
    return sorted((p, good[p], bad[p]) for p in good.keys() & bad.keys())


def total_rows(pipeline: Pipeline) -> int:
    fmt = pipeline.spec.sink.format
    return sum(
        read_without_spark(fmt, p, ["_kafka_offset"]).num_rows for p in (pipeline.sink_path, pipeline.quarantine_path)
    )


def ingest(spark, broker, folder: Path, **fields) -> Pipeline:
    topic = new_topic(broker, partitions=2, prefix="sql")
    pipeline = make_pipeline(folder, topic, **fields)
    send(broker.bootstrap, topic, synthetic(EventGenerator(pipeline, seed=14), RECORDS, bad_fraction=0.1))
    run_available_now(spark, pipeline)
    return pipeline


@pytest.fixture(scope="module")
def served(spark, broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("sql-pipelines")
    pipeline = ingest(spark, broker, folder, name="sql_signals")
    expected = counts_by_partition(pipeline)
    assert expected and total_rows(pipeline) == RECORDS
    write_deltalake(str(folder / "outside"), pa.table({"secret": ["not for clients"]}))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_PIPELINES", str(folder))
        env.setenv("SLUICE_SQL_PASSWORD_FILE", str(folder / "passwords"))
        passwords.set_password(folder / "passwords", USER, PASSWORD)
        endpoint = Endpoint("127.0.0.1", free_port(), "password")
        started = ops.serve(LocalTarget(), endpoint, by="test")
        # The stream's listener wrote the event log, which is served beside the tables.
        assert set(started.status.tables) == {"sql_signals", "sql_signals_quarantine", "sluice_events"}
        try:
            yield Served(endpoint, pipeline, folder, expected)
        finally:
            said = ops.stop(by="test")
            assert said.startswith("stopped the SQL endpoint") and "terminated" not in said, said


CSV = ("--silent=true", "--outputformat=csv2")  # before -e: beeline reads its options in order


def test_beeline_over_jdbc_joins_a_table_with_its_quarantine(served: Served) -> None:
    beeline = Path(spark_home()) / "bin" / "beeline"
    query = JOIN.format(name="sql_signals").replace("\n", " ")
    done = subprocess.run(
        [str(beeline), "-u", served.endpoint.jdbc_url(), "-n", USER, "-p", PASSWORD, *CSV, "-e", query],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"SPARK_HOME": spark_home()},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    # beeline prints its prompt before the header: keep the lines that are all numbers
    rows = [line.split(",") for line in done.stdout.splitlines() if line.replace(",", "").isdigit()]
    assert [tuple(int(v) for v in r) for r in rows] == served.expected


def test_sqlalchemy_hive_url_joins_a_table_with_its_quarantine(served: Served) -> None:
    import sqlalchemy as sa

    url = served.endpoint.sqlalchemy_url(USER).replace(":PASSWORD@", f":{quote(PASSWORD, safe='')}@")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text(JOIN.format(name="sql_signals"))).fetchall()
        columns = {c["name"] for c in sa.inspect(conn).get_columns("sql_signals_quarantine")}
    engine.dispose()
    assert [tuple(r) for r in rows] == served.expected
    assert {"reason", "raw_text", "_kafka_offset", "date"} <= columns


WRITES = [
    "INSERT INTO sql_signals_quarantine SELECT * FROM sql_signals_quarantine",
    "UPDATE sql_signals SET device_type = 'x'",
    "DELETE FROM sql_signals",
    "MERGE INTO sql_signals t USING sql_signals s ON t._kafka_offset = s._kafka_offset WHEN MATCHED THEN DELETE",
    "DROP TABLE sql_signals",
    "ALTER TABLE sql_signals SET TBLPROPERTIES ('a' = 'b')",
    "CREATE TABLE copied AS SELECT * FROM sql_signals",
    "CREATE TABLE empty_one (a INT)",
    "TRUNCATE TABLE sql_signals",
    "VACUUM sql_signals",
    "OPTIMIZE sql_signals",
    "DELETE FROM delta.`{path}`",
    "DROP DATABASE sluice CASCADE",
    "ADD JAR /tmp/anything.jar",
]


#: Reads of anything but the catalog's tables, and code run on the server.
ESCAPES = [
    "SELECT * FROM text.`{secret}`",
    "SELECT * FROM csv.`/etc/passwd`",
    "SELECT TRANSFORM(device_type) USING 'cat' AS (x) FROM sql_signals",
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT java_method('java.lang.System', 'getProperty', 'user.name')",
    "SELECT try_reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT count(*) FROM sql_signals WHERE device_type IN (SELECT reflect('java.util.UUID', 'randomUUID'))",
    "SET spark.sql.catalog.mine=org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog",
    "SET spark.sluice.sql.allowWrites=true",
    "SET spark.sql.warehouse.dir={folder}",
    "BEGIN SET spark.sql.catalog.mine = 'x'; SELECT 1; END",
    "DESCRIBE HISTORY delta.`{outside}`",
    "DESCRIBE DETAIL delta.`{outside}`",
]


def test_writes_and_escapes_are_refused_with_a_clear_error_and_change_nothing(served: Served) -> None:
    session = served.session()
    try:
        # What an analyst may change for their own session.
        session.run("SET spark.sql.session.timeZone=Europe/Berlin")
        assert session.run("SELECT current_timezone()").rows == [("Europe/Berlin",)]
        for statement in WRITES:
            with pytest.raises(SqlError) as refused:
                session.run(statement.format(path=served.pipeline.sink_path))
            assert "read-only" in str(refused.value) and "--allow-writes" in str(refused.value), statement
        for statement in ESCAPES:
            # A format that infers its schema reads files while Spark plans the query; the rule
            # refuses that read, and Spark reports it as its own planning error.
            with pytest.raises(SqlError, match="read-only|FAILED_TO_CREATE_PLAN_FOR_DIRECT_QUERY") as refused:
                session.run(
                    statement.format(folder=served.folder, secret=served.folder / "passwords", outside=served.outside)
                )
            assert "--allow-writes" not in str(refused.value), statement
        # A table's own location is the table: reading it by path is the same read. (Counted
        # by delta-rs: `expected` holds only the partitions that have quarantined rows too, and
        # the producer's sticky partitioner may leave one without.)
        good = read_without_spark("delta", served.pipeline.sink_path, ["_kafka_offset"]).num_rows
        assert session.run(f"SELECT count(*) FROM delta.`{served.pipeline.sink_path}`").rows == [(good,)]
        history = session.run(f"DESCRIBE HISTORY delta.`{served.pipeline.sink_path}`").rows
        assert history and history == session.run("DESCRIBE HISTORY sql_signals").rows
        assert session.run("SELECT count(*) FROM sql_signals").rows == [(good,)]
        # The catalog is persistent: tables other tests' pipelines registered are there too.
        listed = [r[1] for r in session.run("SHOW TABLES IN sluice").rows]
        assert {"sql_signals", "sql_signals_quarantine", "sluice_events"} <= set(listed)
        batches = session.run("SELECT sum(input_rows) FROM sluice_events WHERE pipeline = 'sql_signals'").rows
        assert batches == [(RECORDS,)]  # every record read, batch by batch, once
        described = session.run("DESCRIBE TABLE sql_signals").rows
        assert ("device_type", "string") in [(r[0], r[1]) for r in described]
        # The schema's COMMENT of a field is the column's comment.
        assert ("signal", "double", "signal strength, dBm") in [tuple(r) for r in described]
    finally:
        session.close()
    assert counts_by_partition(served.pipeline) == served.expected


#: Settings a connection can carry: a catalog of the client's choosing (a Derby database the
#: server would create where the client says), and a setting of the server.
URL_SETTINGS = {
    "spark.sql.catalog.mine": "org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog",
    "spark.sql.catalog.mine.url": "jdbc:derby:{derby};create=true",
}


def test_settings_in_the_connection_pass_the_allow_list_before_anything_runs(served: Served) -> None:
    """Session settings in the JDBC URL bypass SET: Spark's Thrift server applies them as the
    session opens. Every statement of such a session is refused before it is analysed, so the
    catalog they name is never loaded (no Derby database appears)."""
    from pyhive import hive

    from sluice.sql.client import server_message

    derby = served.folder / "client-chose-this"
    settings = {k: v.format(derby=derby) for k, v in URL_SETTINGS.items()}
    # PyHive, as SQLAlchemy and Superset use it: its connect runs `USE`, refused already.
    with pytest.raises(Exception) as refused:
        hive.connect(
            host="127.0.0.1",
            port=served.endpoint.port,
            username=USER,
            password=PASSWORD,
            auth="CUSTOM",
            configuration={f"set:hiveconf:{k}": v for k, v in settings.items()},
        )
    said = server_message(refused.value)
    assert said.startswith("sluice: this SQL endpoint is read-only: the connection sets spark.sql.catalog.mine, ")
    # Hive's standalone JDBC driver, with the settings in its URL as a BI tool's user types them.
    url = served.endpoint.jdbc_url() + "?" + ";".join(f"{k}={v}" for k, v in settings.items())
    said = hive_jdbc(served, url, ["SHOW NAMESPACES IN mine", "DESCRIBE mine.SYS.SYSTABLES"])
    assert len(said) == 1 and said[0][0] == "refused", said  # the driver's connect runs `use`, refused
    assert "the connection sets create, spark.sql.catalog.mine, spark.sql.catalog.mine.url, " in said[0][1]
    assert not derby.exists()
    allowed = served.endpoint.jdbc_url() + "?spark.sql.session.timeZone=Asia/Tokyo"
    assert hive_jdbc(served, allowed, ["SELECT current_timezone()"]) == [("ok", "Asia/Tokyo")]


def test_hive_jdbc_reads_and_every_side_door_is_refused(served: Served) -> None:
    said = hive_jdbc(
        served,
        served.endpoint.jdbc_url(),
        [
            "SELECT count(*) FROM sql_signals",
            "SET spark.sluice.sql.allowWrites=true",
            f"DESCRIBE HISTORY delta.`{served.outside}`",
            f"DESCRIBE DETAIL delta.`{served.outside}`",
            "DELETE FROM sql_signals",
        ],
    )
    good = read_without_spark("delta", served.pipeline.sink_path, ["_kafka_offset"]).num_rows
    assert said[0] == ("ok", str(good)), said
    assert [kind for kind, _ in said[1:]] == ["error"] * 4, said
    assert "SET spark.sluice.sql.allowWrites: clients may set only" in said[1][1]
    assert all("read-only" in message for _, message in said[1:]), said


def hive_jdbc(served: Served, url: str, statements: list[str]) -> list[tuple[str, str]]:
    """Each statement through Hive's standalone JDBC driver: ("ok", rows) or ("error", message);
    [("refused", message)] when the connection itself is."""
    jar = next(config.jars_dir("jdbc").glob("hive-jdbc-*-standalone.jar"))
    done = subprocess.run(
        ["java", "-cp", str(jar), str(Path(__file__).parent / "jdbc" / "HiveQuery.java"), url, USER, PASSWORD],
        input="\n".join(statements),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode in (0, 2), done.stdout + done.stderr[-3000:]
    kinds = ("ok\t", "error\t", "refused\t")
    lines = [line.split("\t", 1) for line in done.stdout.splitlines() if line.startswith(kinds)]
    return [(kind, rest.replace("\x1e", "\n")) for kind, rest in lines]


def test_a_wrong_password_is_refused(served: Served) -> None:
    with pytest.raises(SqlError, match="wrong user name or password"):
        served.session(password="not it")
    cli = sluice_cli("SELECT 1", env={"SLUICE_SQL_PASSWORD": "not it", "SLUICE_SQL_USER": USER}, served=served)
    assert cli.returncode == 2 and "wrong user name or password" in cli.stderr, cli.stderr


def sluice_cli(*args: str, served: Served, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "sql", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ
        | {"SLUICE_PIPELINES": str(served.folder), "SLUICE_SQL_PASSWORD_FILE": str(served.folder / "passwords")}
        | (env or {}),
    )


def test_sluice_sql_goes_through_the_endpoint_in_each_format(served: Served) -> None:
    login = {"SLUICE_SQL_USER": USER, "SLUICE_SQL_PASSWORD": PASSWORD}
    query = JOIN.format(name="sql_signals")
    as_csv = sluice_cli(query, "--format", "csv", served=served, env=login)
    assert as_csv.returncode == 0, as_csv.stderr
    # No JVM started: the endpoint answered (a local session prints Java's start-up warning).
    assert "jdk.incubator" not in as_csv.stderr
    assert as_csv.stdout.splitlines() == ["p,good,bad", *(f"{p},{g},{b}" for p, g, b in served.expected)]
    as_json = sluice_cli(query, "-f", "json", served=served, env=login)
    import json

    assert json.loads(as_json.stdout) == [{"p": p, "good": g, "bad": b} for p, g, b in served.expected]
    as_table = sluice_cli("SELECT reason FROM sql_signals_quarantine", "--limit", "3", served=served, env=login)
    assert as_table.returncode == 0 and "(first 3 rows" in as_table.stderr
    refused = sluice_cli("DROP TABLE sql_signals", served=served, env=login)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "read-only" in refused.stderr
    status = sluice_cli("status", served=served)
    assert f"up: jdbc:hive2://127.0.0.1:{served.endpoint.port}/sluice (auth password, read-only)" in status.stdout


def test_a_new_pipeline_is_served_once_it_has_written_parquet_included(served: Served, spark, broker) -> None:
    """Registration follows the first write, and a Parquet table is read through its commit
    log: a data file no commit lists (a crashed batch's) is not counted."""
    late = ingest(spark, broker, served.folder, name="sql_late", sink={"format": "parquet"})
    orphan = next(Path(late.sink_path).glob("date=*/*.parquet"))
    (orphan.parent / "part-99999-uncommitted.parquet").write_bytes(orphan.read_bytes())
    expected = counts_by_partition(late)
    assert expected and total_rows(late) == RECORDS
    session = served.session()
    try:
        deadline = time.monotonic() + 60
        while not {"sql_late", "sql_late_quarantine"} <= {r[1] for r in session.run("SHOW TABLES IN sluice").rows}:
            assert time.monotonic() < deadline, "sql_late was not registered within 60 s of its first write"
            time.sleep(1)
        assert [tuple(r) for r in session.run(JOIN.format(name="sql_late")).rows] == expected
    finally:
        session.close()


def test_the_shell_runs_multi_line_statements_and_lists_tables(served: Served) -> None:
    typed = "SELECT count(*) AS n\n  FROM sql_signals_quarantine;\n\\f csv\n\\d\nSELECT nope;\n\\q\n"
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "sql"],
        input=typed,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ
        | {"SLUICE_PIPELINES": str(served.folder), "SLUICE_SQL_USER": USER, "SLUICE_SQL_PASSWORD": PASSWORD},
    )
    assert done.returncode == 0, done.stderr
    p = served.pipeline
    bad = read_without_spark(p.spec.sink.format, p.quarantine_path, ["_kafka_offset"]).num_rows
    assert f"connected to the endpoint at 127.0.0.1:{served.endpoint.port}" in done.stdout
    assert re.search(rf"┃\s+n\s+┃.*│\s+{bad}\s+│", done.stdout, re.S), done.stdout
    assert "sluice,sql_signals,False" in done.stdout and "sluice,sql_signals_quarantine,False" in done.stdout
    assert "error: [UNRESOLVED_COLUMN.WITHOUT_SUGGESTION] A column" in done.stdout
