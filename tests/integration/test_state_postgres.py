"""The run-state store's contract (tests/state_contract.py) on a real PostgreSQL (Debian's
server, started here on a free port): the store every host of a cluster shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.dev.ports import free_port
from sluice.dev.postgres import PostgresServer
from sluice.state import store
from tests import state_contract

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    try:
        pg = PostgresServer().start()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}")
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def postgres(server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    database = f"state_{tmp_path.name.lower().replace('-', '_')}"[:60]
    server.create_database(database)
    env = {"SLUICE_STATE": server.url(database), "PGPASSFILE": str(server.passfile)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    return store(), env


@pytest.mark.parametrize("check", state_contract.CHECKS, ids=lambda c: c.__name__)
def test_the_postgres_store_keeps_the_contract(check, postgres, tmp_path: Path) -> None:
    check(postgres[0], tmp_path)


def test_a_dead_local_holder_frees_its_lease_at_once(postgres, tmp_path: Path) -> None:
    state_contract.a_dead_local_holder_frees_at_once(postgres[0], tmp_path, postgres[1])


def test_an_unreachable_store_says_so_in_one_line(server: PostgresServer, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_STATE", f"postgresql://sluice@127.0.0.1:{free_port()}/none")
    with pytest.raises(
        Exception, match=r"^the run-state store postgresql://sluice@127\.0\.0\.1:\d+/none did not answer"
    ):
        store().get("driver", "p")
