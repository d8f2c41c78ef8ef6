"""What every benchmark sets up first: its own SLUICE_HOME and broker ports, so a run never
touches the user's tables or broker, and the project on ``sys.path``."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from sluice.dev.ports import free_port  # noqa: E402 - needs ROOT on sys.path first


def isolated_home(prefix: str) -> Path:
    """A temporary SLUICE_HOME with free broker ports; the jars stay where `make setup` put them."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    os.environ.update(
        SLUICE_HOME=str(work),
        SLUICE_JARS=os.environ.get("SLUICE_JARS") or str(ROOT / ".sluice" / "jars"),
        SLUICE_KAFKA_PORT=str(port),
        SLUICE_KAFKA_CONTROLLER_PORT=str(free_port()),
        SLUICE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    return work
