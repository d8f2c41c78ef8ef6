"""`sluice airflow standalone`'s stop, with a stand-in for Airflow's standalone: a script that,
like it, ends on SIGINT alone and leaves a child of its own behind. The real one is stopped
in tests/e2e/test_airflow_server.py::test_a_sigterm_stops_standalone_airflow_whole."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sluice.ops.processes import alive

STAND_IN = """#!/bin/sh
sleep 300 &
echo $! > "$1"
trap 'exit 0' INT
trap '' TERM
while true; do sleep 0.1; done
"""

WRAPPER = """
import sys
from pathlib import Path

from sluice.ops.processes import alive
from sluice.airflow.env import run_standalone
sys.exit(run_standalone(Path(sys.argv[1]), [sys.argv[2]], {"PATH": "/usr/bin:/bin"}, grace=20))
"""


def test_a_sigterm_becomes_its_ctrl_c_and_nothing_of_its_group_is_left(tmp_path: Path) -> None:
    script, left = tmp_path / "standalone", tmp_path / "child.pid"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    wrapper = subprocess.Popen([sys.executable, "-c", WRAPPER, str(script), str(left)])
    deadline = time.monotonic() + 30
    while not (left.is_file() and left.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(left.read_text())
    assert alive(child)
    wrapper.send_signal(signal.SIGTERM)  # the stand-in ignores it: only its SIGINT ends it
    assert wrapper.wait(30) == 0
    assert not alive(child), "the stand-in's own child outlived it"
