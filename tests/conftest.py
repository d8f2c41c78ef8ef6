"""Shared by every test layer: where the project and the real sample data are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice import config

pytest_plugins = ["tests.fixtures", "tests.timing"]

ROOT = config.PROJECT_ROOT
#: Real public event samples; CI has them beside the clone, a user's clone may not.
REAL_DATA = Path(os.environ.get("SLUICE_REAL_DATA") or ROOT.parent / "shared" / "data" / "real")


def require_real_data(name: str) -> Path:
    path = REAL_DATA / name
    if not path.is_file():
        pytest.skip(f"real sample {name} not found in {REAL_DATA} (set SLUICE_REAL_DATA to the folder holding it)")
    return path
