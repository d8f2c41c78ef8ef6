"""The SQL side's pure parts: catalog statements, settings, password lines, the shell's
statement splitting, output formats and how the command line routes ``sluice sql``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.errors import InvalidInput
from sluice.spec.formats import DELTA
from sluice.sql import passwords
from sluice.sql.catalog import CatalogTable, field_paths, literal
from sluice.sql.client import Result, as_csv, as_json, server_message
from sluice.sql.settings import Endpoint, metastore_conf, metastore_password
from sluice.sql.shell import CANCEL, Shell, meta_sql, statements


def test_registration_quotes_names_paths_and_comments() -> None:
    t = CatalogTable("odd`name", DELTA, "/data/it's here", "say \\ 'hi'")
    assert t.create() == (
        "CREATE TABLE IF NOT EXISTS `sluice`.`odd``name` USING delta "
        "LOCATION '/data/it\\'s here' COMMENT 'say \\\\ \\'hi\\''"
    )
    assert t.drop() == "DROP TABLE IF EXISTS `sluice`.`odd``name`"
    assert literal("a'b") == "'a\\'b'"


def test_metastore_is_derby_under_home_unless_postgresql_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SLUICE_METASTORE_URL", raising=False)
    conf = metastore_conf(tmp_path)
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"].startswith(f"jdbc:derby:;databaseName={tmp_path}")
    monkeypatch.setenv("SLUICE_METASTORE_URL", "jdbc:postgresql://db:5432/hive")
    pg = metastore_conf(tmp_path)
    assert pg["spark.hadoop.javax.jdo.option.ConnectionDriverName"] == "org.postgresql.Driver"
    # Foreign keys added lazily on a second connection wait forever on PostgreSQL (see settings).
    assert pg["spark.hadoop.datanucleus.schema.autoCreateConstraints"] == "false"
    assert pg["spark.hadoop.datanucleus.schema.autoCreateAll"] == "false"
    monkeypatch.setenv("SLUICE_METASTORE_URL", "jdbc:mysql://db/hive")
    with pytest.raises(InvalidInput, match="jdbc:postgresql"):
        metastore_conf(tmp_path)


def test_endpoint_settings_and_urls(monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_SQL_PORT", "10001")
    monkeypatch.setenv("SLUICE_SQL_HOST", "0.0.0.0")
    monkeypatch.setenv("SLUICE_SQL_AUTH", "password")
    e = Endpoint.from_env()
    assert e.jdbc_url() == "jdbc:hive2://127.0.0.1:10001/sluice"
    assert e.sqlalchemy_url("ana") == "hive://ana:PASSWORD@127.0.0.1:10001/sluice?auth=CUSTOM"
    monkeypatch.setenv("SLUICE_SQL_PORT", "99999")
    with pytest.raises(InvalidInput, match="port"):
        Endpoint.from_env()
    monkeypatch.setenv("SLUICE_SQL_PORT", "1")
    monkeypatch.setenv("SLUICE_SQL_AUTH", "kerberos")
    with pytest.raises(InvalidInput, match="none or password"):
        Endpoint.from_env()


def test_password_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sql" / "passwords"
    passwords.set_password(path, "ana", "s3cret")
    passwords.set_password(path, "bo", "other")
    passwords.set_password(path, "ana", "changed")
    assert passwords.users(path) == ["bo", "ana"]
    assert passwords.verify(path, "ana", "changed") and not passwords.verify(path, "ana", "s3cret")
    assert not passwords.verify(path, "nobody", "changed")
    assert "changed" not in path.read_text() and path.stat().st_mode & 0o777 == 0o600
    assert passwords.remove_user(path, "bo") and not passwords.remove_user(path, "bo")
    with pytest.raises(InvalidInput):
        passwords.set_password(path, "has:colon", "x")


def test_statements_span_lines_and_meta_commands_stand_alone() -> None:
    typed = ["select 1", "  from t;", "\\d", "select 2;", "select 'dropped'", CANCEL, "select 3"]
    assert list(statements(typed)) == ["select 1\n  from t;", "\\d", "select 2;", "select 3"]
    assert meta_sql("\\d") == "SHOW TABLES IN sluice"
    assert meta_sql("\\d payments") == "DESCRIBE TABLE payments"
    assert meta_sql("\\x") is None


class _Recorder:
    where = "a recorder"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, sql: str, limit: int | None = None) -> Result:
        self.ran.append(sql)
        return Result(["n"], [(len(self.ran),)])

    def close(self) -> None: ...


def test_the_shell_runs_statements_switches_format_and_quits() -> None:
    session, shown, said = _Recorder(), [], []
    Shell(session, lambda r, f: shown.append((r.rows, f)), said.append).run(
        ["select 1;", "\\f csv", "\\d", "\\f xml", "\\q", "select 'never';"]
    )
    assert session.ran == ["select 1;", "SHOW TABLES IN sluice"]
    assert shown == [([(1,)], "table"), ([(2,)], "csv")]
    assert said == ["\\f takes table, csv or json"]


def test_output_formats() -> None:
    r = Result(["a", "b"], [(1, None), ("x,y", 2.5)])
    assert as_csv(r) == 'a,b\n1,\n"x,y",2.5\n'
    assert json.loads(as_json(r)) == [{"a": 1, "b": None}, {"a": "x,y", "b": 2.5}]


def test_server_messages_lose_their_java_wrapping() -> None:
    class Status:
        errorMessage = "Error running query: java.lang.SecurityException: sluice: read-only\n\tat x"

    class Response:
        status = Status()

    assert server_message(Exception(Response())) == "sluice: read-only"
    Status.errorMessage = "[X_Y] org.apache.spark.sql.AnalysisException: [X_Y] no such column; line 1"
    assert server_message(Exception(Response())) == "[X_Y] no such column; line 1"


def test_sluice_sql_reads_a_first_word_as_a_query_unless_it_is_a_subcommand(monkeypatch) -> None:
    from sluice.cli import app
    from sluice.ops import sql as ops  # the command imports it when it runs

    ran: list[str] = []

    class Session(_Recorder):
        def run(self, sql: str, limit: int | None = None) -> Result:
            ran.append(sql)
            return Result(["x"], [(1,)])

    monkeypatch.setattr(ops, "open_session", lambda **_: Session())
    monkeypatch.setattr(ops, "running", lambda: None)
    runner = CliRunner()
    done = runner.invoke(app, ["sql", "SELECT 1", "--format", "csv"])
    assert done.exit_code == 0 and done.stdout == "x\n1\n" and ran == ["SELECT 1"]
    assert "serve" in runner.invoke(app, ["sql", "--help"]).stdout
    assert "Start the JDBC/ODBC endpoint" in runner.invoke(app, ["sql", "serve", "--help"]).stdout


def test_an_endpoint_beyond_loopback_needs_passwords(tmp_path: Path, monkeypatch) -> None:
    from sluice.ops import sql
    from sluice.ops.target import LocalTarget

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    with pytest.raises(InvalidInput, match="no passwords"):
        sql.serve(LocalTarget(), Endpoint("0.0.0.0", 10000, "none"), by="test")
    with pytest.raises(InvalidInput, match="sluice sql passwd"):  # passwords, but no user yet
        sql.serve(LocalTarget(), Endpoint("0.0.0.0", 10000, "password"), by="test")


def test_supervision_leaves_an_endpoint_stopped_on_purpose_alone(tmp_path: Path, monkeypatch) -> None:
    from sluice.ops import sql
    from sluice.ops.target import LocalTarget
    from sluice.records.endpoint import NAME
    from sluice.records.run import Driver

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert Driver(NAME, 1, ["spark-submit"], "log", 0.0, "cli", "stopped").save_if_unchanged()
    assert sql.keep_up(LocalTarget(), Endpoint(), by="test") is None
    assert sql.status().desired == "stopped" and not sql.status().up


def test_supervision_starts_the_endpoint_as_it_was_last_asked(tmp_path: Path, monkeypatch) -> None:
    from dataclasses import asdict

    from sluice.ops import sql
    from sluice.ops.target import LocalTarget
    from sluice.records.endpoint import save_requested

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert sql.requested() is None  # never started: the worker's settings
    with pytest.raises(InvalidInput, match="no passwords"):  # refused before anything is recorded
        sql.serve(LocalTarget(), Endpoint("0.0.0.0", 10000, "none"), by="test")
    assert sql.requested() is None
    save_requested(asdict(Endpoint("127.0.0.1", 10042, "none")) | {"from_an_older_version": 1})
    assert sql.requested() == Endpoint("127.0.0.1", 10042, "none")


def test_the_metastore_password_comes_from_a_file_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_METASTORE_URL", "jdbc:postgresql://db:5432/hive")
    monkeypatch.delenv("SLUICE_METASTORE_PASSWORD_FILE", raising=False)
    assert metastore_password() is None
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD_FILE", str(secret))
    assert metastore_password() == "s3cret"
    assert "s3cret" not in str(metastore_conf(tmp_path))  # the Spark settings never hold it
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(InvalidInput, match="cannot read"):
        metastore_password()
    monkeypatch.delenv("SLUICE_METASTORE_PASSWORD_FILE")
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD", "s3cret")
    with pytest.raises(InvalidInput, match="would put the metastore's password on the Spark command line"):
        metastore_conf(tmp_path)


def test_field_paths_see_nested_fields_in_any_order() -> None:
    def struct(*fields: tuple[str, object]) -> dict[str, object]:
        return {"type": "struct", "fields": [{"name": n, "type": t} for n, t in fields]}

    tags = {"type": "array", "elementType": struct(("k", "string"), ("V", "string"))}
    attrs = {"type": "map", "keyType": "string", "valueType": struct(("unit", "string"))}
    paths = field_paths(struct(("id", "string"), ("tags", tags), ("attrs", attrs)))
    assert paths == {"id", "tags", "tags[]", "tags[].k", "tags[].v", "attrs", "attrs{}", "attrs{}.unit"}
    reordered = {"type": "array", "elementType": struct(("V", "string"), ("k", "string"))}
    assert field_paths(struct(("tags", reordered), ("id", "string"), ("attrs", attrs))) == paths
