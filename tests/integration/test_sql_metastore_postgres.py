"""The catalog in a real PostgreSQL (Debian's server, started here on a free port): the
endpoint registers the tables there, serves them, and they outlive the endpoint."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from sluice.dev.ports import free_port
from sluice.errors import InvalidInput
from sluice.ops import sql as ops
from sluice.ops.target import LocalTarget
from sluice.sql.client import EndpointSession
from sluice.sql.settings import Endpoint
from tests.fixtures import make_pipeline

pytestmark = pytest.mark.integration

PASSWORD = "m3tastore-s3cret"


def _postgres_bin() -> Path:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if not found:
        pytest.fail("PostgreSQL's initdb is not installed: `make test` installs it (apt-get install postgresql)")
    return Path(found).resolve().parent


def psql(port: int, database: str, *args: str) -> list[str]:
    """A psql command as the test server's user, with its password."""
    return [
        "env",
        f"PGPASSWORD={PASSWORD}",
        "psql",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-U",
        "sluice",
        "-d",
        database,
        *args,
    ]


@pytest.fixture(scope="module")
def postgres() -> Iterator[tuple[str, int]]:
    """A throw-away server; PostgreSQL refuses to run as root, so as root it runs as ``postgres``
    (in a folder of its own under /tmp: pytest's temporary folders are root's alone)."""
    bin_dir, port = _postgres_bin(), free_port()
    base = Path(tempfile.mkdtemp(prefix="sluice-postgres-"))
    data = base / "data"
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(base, "postgres")

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    secret = base / "initdb-password"
    secret.write_text(PASSWORD)
    if as_user:
        shutil.chown(secret, "postgres")
    run(
        str(bin_dir / "initdb"),
        "-D",
        str(data),
        "-A",
        "scram-sha-256",
        f"--pwfile={secret}",
        "-U",
        "sluice",
        "--no-sync",
    )
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start")
    try:
        run(*psql(port, "postgres", "-c", "CREATE DATABASE hive"))
        yield f"jdbc:postgresql://127.0.0.1:{port}/hive", port
    finally:
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_the_catalog_lives_in_postgresql(postgres, spark, tmp_path: Path, monkeypatch) -> None:
    url, port = postgres
    pipeline = make_pipeline(tmp_path, "unused-topic", name="pg_signals")
    spark.range(1234).selectExpr("id", "cast(id % 4 AS string) AS date").write.format("delta").partitionBy("date").save(
        pipeline.sink_path
    )
    monkeypatch.setenv("SLUICE_PIPELINES", str(tmp_path))
    monkeypatch.setenv("SLUICE_METASTORE_URL", url)
    monkeypatch.setenv("SLUICE_METASTORE_USER", "sluice")
    endpoint = Endpoint("127.0.0.1", free_port())
    # A password in the environment would reach the command line: refused before anything starts.
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD", PASSWORD)
    with pytest.raises(InvalidInput, match="SLUICE_METASTORE_PASSWORD_FILE"):
        ops.serve(LocalTarget(), endpoint, by="test")
    monkeypatch.delenv("SLUICE_METASTORE_PASSWORD")
    secret = tmp_path / "metastore-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    monkeypatch.setenv("SLUICE_METASTORE_PASSWORD_FILE", str(secret))
    served = ops.serve(LocalTarget(), endpoint, by="test")
    try:
        # The password is read by the driver: on no command line, in no run record.
        assert PASSWORD not in json.dumps(asdict(served.driver))
        commands = [" ".join(p.cmdline()) for p in psutil.Process(served.driver.pid).children(recursive=True)]
        assert commands and not any(PASSWORD in c for c in commands)
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
    tables = subprocess.run(
        psql(port, "hive", "-tAc", 'SELECT "TBL_NAME" FROM "TBLS"'),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [t for t in tables.stdout.split() if t != "sluice_events"] == ["pg_signals"], tables.stderr
