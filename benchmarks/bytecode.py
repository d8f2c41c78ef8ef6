"""What a Python process of Sluice's spends compiling its imports when nothing cached them.

uv installs no ``.pyc`` files unless asked, and where ``PYTHONDONTWRITEBYTECODE`` is set no
import writes one: every process then compiles what it imports from source. `make setup`
installs both venvs with ``--compile-bytecode``. This script times, side by side and in turn,
each command with the venvs' compiled files and with them hidden (``PYTHONPYCACHEPREFIX`` at an
empty folder, where Python looks for them instead, and nothing written), ``--rounds`` times:

- the imports of a Spark driver (pyspark's SQL API, delta, Sluice's ingest job);
- ``sluice check`` of the shipped specs (the spec loader, pydantic, sqlglot);
- ``airflow dags list`` on a fresh Airflow home (Airflow's CLI, its models, the DAG folder).

Prints each run and writes ``benchmarks/results/trials/20-bytecode.json``::

    .venv/bin/python benchmarks/bytecode.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harness import RESULTS, ROOT, isolated_home

OUT = RESULTS / "trials" / "20-bytecode.json"


def commands(airflow_home: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    from sluice.airflow.env import airflow_binary, airflow_env

    python = str(ROOT / ".venv" / "bin" / "python")
    airflow = airflow_env() | {"AIRFLOW_HOME": str(airflow_home)}
    return {
        "Spark driver's imports": (
            [python, "-c", "import pyspark.sql, pyspark.sql.functions, delta, jobs.ingest"],
            {},
        ),
        "sluice check": ([python, "-m", "sluice.cli", "check"], {}),
        "airflow dags list": ([str(airflow_binary()), "dags", "list", "-o", "plain"], airflow),
    }


def timed(cmd: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(cmd, env=os.environ | env, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    home = isolated_home("sluice-bytecode-")
    empty = Path(tempfile.mkdtemp(prefix="sluice-no-pyc-"))
    variants = {
        "compiled": {},
        "from source": {"PYTHONPYCACHEPREFIX": str(empty), "PYTHONDONTWRITEBYTECODE": "1"},
    }
    runs = commands(home / "airflow")
    migrate, env = runs["airflow dags list"]
    timed([migrate[0], "db", "migrate"], env)  # once, outside the rounds
    seconds: dict[str, dict[str, list[float]]] = {c: {v: [] for v in variants} for c in runs}
    for round_ in range(args.rounds):
        for name, (cmd, env) in runs.items():
            for variant, extra in variants.items():  # side by side, in turn
                seconds[name][variant].append(timed(cmd, env | extra))
                print(f"round {round_ + 1}: {name}, {variant}: {seconds[name][variant][-1]:.2f} s", flush=True)
    if any(empty.iterdir()):
        sys.exit(f"{empty} is not empty: the hidden runs wrote compiled files, so they were not from source")

    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "command": "benchmarks/bytecode.py " + " ".join(sys.argv[1:]),
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "seconds": seconds,
        "median": {c: {v: statistics.median(s) for v, s in by.items()} for c, by in seconds.items()},
    }
    print()
    for name, medians in result["median"].items():
        compiled, source = medians["compiled"], medians["from source"]
        print(f"{name}: {compiled:.2f} s compiled, {source:.2f} s from source (x{source / compiled:.2f})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
