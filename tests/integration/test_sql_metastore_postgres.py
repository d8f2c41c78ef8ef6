"""The catalog in a real PostgreSQL (Debian's server, the test session's): the endpoint
registers the tables there, serves them, and they outlive the endpoint."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from sluice.dev.ports import free_port
from sluice.dev.postgres import PostgresServer
from sluice.errors import InvalidInput
from sluice.ops import sql as ops
from sluice.ops.target import LocalTarget
from sluice.sql.client import EndpointSession
from sluice.sql.settings import Endpoint
from tests.fixtures import make_pipeline

pytestmark = pytest.mark.integration


def test_the_catalog_lives_in_postgresql(postgres: PostgresServer, spark, tmp_path: Path, monkeypatch) -> None:
    server, password = postgres, postgres.password
    server.create_database("hive")
    url = f"jdbc:postgresql://127.0.0.1:{server.port}/hive"
    pipeline = make_pipeline(tmp_path, "unused-topic", name="pg_signals")
    spark.range(1234).selectExpr("id", "cast(id % 4 AS string) AS date").write.format("delta").partitionBy("date").save(
        pipeline.sink_path
    )
    monkeypatch.setenv("SLUICE_PIPELINES", str(tmp_path))
    monkeypatch.setenv("SLUICE_METASTORE_URL", url)
    monkeypatch.setenv("SLUICE_METASTORE_USER", "sluice")
    endpoint = Endpoint("127.0.0.1", free_port())
    # A password in the environment would reach the command line: refused before anything starts.
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD", password)
    with pytest.raises(InvalidInput, match="SLUICE_METASTORE_PASSWORD_FILE"):
        ops.serve(LocalTarget(), endpoint, by="test")
    monkeypatch.delenv("SLUICE_METASTORE_PASSWORD")
    secret = tmp_path / "metastore-password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD_FILE", str(secret))
    served = ops.serve(LocalTarget(), endpoint, by="test")
    try:
        # The password is read by the driver: on no command line, in no run record.
        assert password not in json.dumps(asdict(served.driver))
        commands = [command(p) for p in psutil.Process(served.driver.pid).children(recursive=True)]
        assert any(commands) and not any(password in c for c in commands)
        # (sluice_events too, when an earlier test's stream wrote the event log)
        assert [t for t in served.status.tables if t != "sluice_events"] == ["pg_signals"]
        assert served.status.metastore.startswith("PostgreSQL")
        session = EndpointSession("127.0.0.1", endpoint.port, auth="none")
        assert session.run("SELECT date, count(*) FROM pg_signals GROUP BY date ORDER BY date").rows == [
            (str(d), 309 if d < 2 else 308) for d in range(4)
        ]
        session.close()
    finally:
        assert "stopped the SQL endpoint" in ops.stop(by="test")
    # The registration is PostgreSQL's now, there after the endpoint is gone.
    tables = server.psql("hive", 'SELECT "TBL_NAME" FROM "TBLS"')
    assert [t for t in tables.split() if t != "sluice_events"] == ["pg_signals"]


def command(process: psutil.Process) -> str:
    """A process's command line; "" for one that exited while the tree was listed (the JVM
    forks short-lived commands, which may be zombies for a moment)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""
