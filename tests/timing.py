"""Where a test run's time went, printed at its end: each layer's tests, set-ups (a module or
session fixture is paid by the first test that needs it) and tear-downs, the costliest
set-ups, and what no test accounts for (collection, start-up). `--durations` lists tests;
this says which kind of time to cut."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest

_started = time.monotonic()
_spent: dict[tuple[str, str], float] = defaultdict(float)
_tests: dict[str, set[str]] = defaultdict(set)
_setups: list[tuple[float, str]] = []


def _layer(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    layer = _layer(report.nodeid)
    _spent[(layer, report.when)] += report.duration
    _tests[layer].add(report.nodeid)
    if report.when == "setup":
        _setups.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _tests:
        return
    total = time.monotonic() - _started
    write = terminalreporter.write_line
    terminalreporter.section(f"where the time went ({total:,.0f} s)")
    write(f"{'layer':<12} {'tests':>6} {'in tests':>10} {'set-up':>10} {'tear-down':>10}")
    counted = 0.0
    for layer in sorted(_tests):
        call, setup, teardown = (_spent[(layer, when)] for when in ("call", "setup", "teardown"))
        counted += call + setup + teardown
        write(f"{layer:<12} {len(_tests[layer]):>6} {call:>9,.0f}s {setup:>9,.0f}s {teardown:>9,.0f}s")
    write(f"{'no test':<12} {'':>6} {total - counted:>9,.0f}s  (collection, start-up, reporting)")
    costly = [(s, nodeid) for s, nodeid in sorted(_setups, reverse=True)[:5] if s >= 1]
    if costly:
        write("costliest set-ups (fixtures shared by the tests after them):")
    for seconds, nodeid in costly:
        write(f"  {seconds:7.1f}s  {nodeid}")
