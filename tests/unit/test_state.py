"""The run-state store's contract (tests/state_contract.py) on the embedded default: files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.state import store
from tests import state_contract


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLUICE_STATE", raising=False)
    return store()


@pytest.mark.parametrize("check", state_contract.CHECKS, ids=lambda c: c.__name__)
def test_the_file_store_keeps_the_contract(check, files, tmp_path: Path) -> None:
    check(files, tmp_path)


def test_a_dead_local_holder_frees_its_lease_at_once(files, tmp_path: Path) -> None:
    state_contract.a_dead_local_holder_frees_at_once(files, tmp_path, {})


def test_an_unknown_store_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_STATE", "redis://localhost")
    with pytest.raises(Exception, match="expected a postgresql:// URL"):
        store()
