"""The run-state store's contract (tests/state_contract.py) on a real PostgreSQL (Debian's
server, started here on a free port): the store every host of a cluster shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.dev.ports import free_port
from sluice.dev.postgres import PostgresServer
from sluice.state import store
from tests import state_contract
from tests.fixtures import shared_state

pytestmark = pytest.mark.integration


@pytest.fixture
def server(postgres: PostgresServer) -> PostgresServer:
    return postgres


@pytest.fixture
def state(server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    env = shared_state(server, monkeypatch)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    return store(), env


@pytest.mark.parametrize("check", state_contract.CHECKS, ids=lambda c: c.__name__)
def test_the_postgres_store_keeps_the_contract(check, state, tmp_path: Path) -> None:
    check(state[0], tmp_path)


def test_a_dead_local_holder_frees_its_lease_at_once(state, tmp_path: Path) -> None:
    state_contract.a_dead_local_holder_frees_at_once(state[0], tmp_path, state[1])


def test_an_unreachable_store_says_so_in_one_line(server: PostgresServer, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_STATE", f"postgresql://sluice@127.0.0.1:{free_port()}/none")
    with pytest.raises(
        Exception, match=r"^the run-state store postgresql://sluice@127\.0\.0\.1:\d+/none did not answer"
    ):
        store().get("driver", "p")
