"""The command line starts without what only some commands need: importing ``sluice.cli``,
``sluice --version`` and ``sluice --help`` leave the spec loader (pydantic, sqlglot), Spark,
Kafka's client and :mod:`sluice.ops` unimported. It checks ``sys.modules`` in a fresh
interpreter, not time, so it fails the same on a slow machine and a fast one.

Typer itself imports pydantic to convert a command's arguments, so any subcommand (even its
``--help``) loads pydantic; only the top level can stay without it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

#: Modules only some commands need; at the top of the CLI they made every start take over a second.
HEAVY = (
    "sqlglot",
    "pydantic",
    "sluice.spec",
    "pyspark",
    "confluent_kafka",
    "croniter",
    "yaml",
    "psutil",
    "sluice.ops",
    "sluice.dev",
)


def loaded(code: str) -> tuple[str, list[str]]:
    """Run ``code`` in a fresh interpreter: what it printed, and which of HEAVY it left in sys.modules."""
    probe = (
        "import sys\n"
        f"try:\n    {code}\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', *(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out, _, last = done.stdout.rstrip("\n").rpartition("\n")
    assert last.startswith("LOADED"), done.stdout
    return out, last.split()[1:]


def test_the_probe_sees_a_heavy_import() -> None:
    assert {"sluice.spec", "sqlglot", "pydantic"} <= set(loaded("import sluice.spec")[1])


def test_importing_the_command_line_loads_nothing_heavy() -> None:
    assert loaded("import sluice.cli") == ("", [])


@pytest.mark.parametrize(("args", "words"), [(["--version"], "sluice "), (["--help"], "Commands:")])
def test_the_version_and_the_help_load_nothing_heavy(args: list[str], words: str) -> None:
    as_python_m = "import runpy; runpy.run_module('sluice.cli', run_name='__main__', alter_sys=True)"
    out, heavy = loaded(f"sys.argv = ['sluice', *{args!r}]; {as_python_m}")
    assert words in out
    assert heavy == []


def test_a_query_for_the_sql_endpoint_loads_no_spec_and_no_spark() -> None:
    # `sluice sql "SELECT ..."` with the endpoint running goes through sluice.ops.sql only; the
    # spec loader (pydantic, sqlglot) and Spark are for the in-process answer without it.
    _, heavy = loaded("import sluice.cli.sql, sluice.ops.sql, sluice.sql.shell")
    assert not {"sqlglot", "sluice.spec", "pyspark", "confluent_kafka", "croniter"} & set(heavy)
