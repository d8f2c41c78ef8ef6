"""Free loopback ports for the embedded broker, a local cluster, Airflow: tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's choice; another process may take it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
