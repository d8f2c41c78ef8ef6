"""The SQL endpoint's actions (serve, stop, status) and the one way to run SQL: through the
endpoint when it runs, else in a local Spark session on the same catalog.

The endpoint is a detached spark-submit like a stream (run records named ``_sql_endpoint``: the launcher's
``driver``, the job's ``endpoint``), started and stopped by the same helpers. It is found by
its process, so it is stopped from the host that launched it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from sluice.errors import AlreadyRunning, IntentChanged, InvalidInput, StartFailed
from sluice.ops.processes import alive, launch_detached, log_tail, process_named, terminate
from sluice.ops.submit import endpoint_submission
from sluice.ops.target import SparkTarget
from sluice.records.endpoint import NAME, EndpointStatus, read_requested, save_requested
from sluice.records.run import Driver, known_fields, record_stop
from sluice.sql import passwords
from sluice.sql.client import EndpointSession, SqlSession
from sluice.sql.settings import Endpoint, password_file

SCRIPT = "sql_endpoint.py"
#: A running endpoint writes endpoint.json every second; this much silence means it hangs.
HEARTBEAT_TIMEOUT = 30.0
#: How long an endpoint may take to start (the metastore's schema, executors) before it is hung.
START_TIMEOUT = 300.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def endpoint_process() -> psutil.Process | None:
    st = EndpointStatus.read()
    if st and st.state in ("starting", "running"):
        proc = process_named(st.pid, SCRIPT)
        if proc is not None:
            return proc
    driver = Driver.read(NAME)
    return process_named(driver.pid, SCRIPT) if driver else None


def running() -> EndpointStatus | None:
    """The endpoint's report, if it is up: its process lives and it has said so lately."""
    st = EndpointStatus.read()
    if st is None or st.state != "running" or endpoint_process() is None:
        return None
    return st if time.time() - st.updated_at < HEARTBEAT_TIMEOUT else None


@dataclass(frozen=True)
class Served:
    driver: Driver
    status: EndpointStatus

    def summary(self) -> str:
        s = self.status
        return (
            f"serving {len(s.tables)} table(s) on {Endpoint(s.host, s.port).jdbc_url()} "
            f"(auth {s.auth}, {'writes allowed' if s.allow_writes else 'read-only'}, metastore: {s.metastore}); "
            f"pid {self.driver.pid}, log {self.driver.log}"
        )


def serve(
    target: SparkTarget, endpoint: Endpoint, *, by: str, timeout: float = 300.0, as_of: int | None = None
) -> Served:
    """Start the endpoint detached; return once it accepts connections. ``as_of``: the version
    of the driver record a supervision decided on (a stop recorded since wins)."""
    if as_of is None:
        now = Driver.read(NAME)
        as_of = now.version if now else 0
    if endpoint_process() is not None:
        raise AlreadyRunning("the SQL endpoint is already running (`sluice sql status`)")
    if endpoint.auth == "none" and endpoint.host not in LOOPBACK:
        raise InvalidInput(
            f"the endpoint would listen on {endpoint.host} with no passwords: serve it with --auth password "
            "(users: `sluice sql passwd USER`), or on 127.0.0.1"
        )
    if endpoint.auth == "password" and not passwords.users(password_file()):
        raise InvalidInput(f"password authentication needs a user in {password_file()}: run `sluice sql passwd USER`")
    if _listening(endpoint.client_host, endpoint.port):
        raise InvalidInput(f"port {endpoint.port} on {endpoint.host} is taken: choose another with --port")
    command, env = target.launch_command(endpoint_submission(endpoint, master=target.master))
    save_requested(asdict(endpoint))
    driver = launch_detached(NAME, command, env, launched_by=by, as_of=as_of)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = EndpointStatus.read()
        if st and st.updated_at >= driver.launched_at:
            if st.state == "failed":
                raise StartFailed(f"the SQL endpoint failed to start: {st.error}\n{log_tail(driver.log)}")
            if st.state == "running" and _listening(endpoint.client_host, endpoint.port):
                return Served(driver, st)
        if not alive(driver.pid):
            raise StartFailed(f"the SQL endpoint's spark-submit (pid {driver.pid}) exited\n{log_tail(driver.log)}")
        time.sleep(0.3)
    raise StartFailed(f"the SQL endpoint did not accept connections within {timeout:.0f}s\n{log_tail(driver.log)}")


def stop(*, by: str, timeout: float = 60.0, grace: float = 15.0) -> str:
    driver = record_stop(NAME, by)
    proc = endpoint_process()
    if proc is None:
        return "the SQL endpoint is not running"
    started = time.monotonic()
    graceful = terminate(proc, process_named(driver.pid, SCRIPT) if driver.pid else None, timeout=timeout, grace=grace)
    how = "" if graceful else f" (it did not stop within {timeout:.0f}s; its process group was terminated)"
    return f"stopped the SQL endpoint in {time.monotonic() - started:.1f}s{how}"


@dataclass(frozen=True)
class EndpointReport:
    up: bool
    desired: str | None  # what was asked last: running or stopped
    status: EndpointStatus | None
    driver: Driver | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "desired": self.desired,
            "status": asdict(self.status) if self.status else None,
            "driver": asdict(self.driver) if self.driver else None,
        }


def status() -> EndpointReport:
    driver = Driver.read(NAME)
    return EndpointReport(running() is not None, driver.desired if driver else None, EndpointStatus.read(), driver)


def requested() -> Endpoint | None:
    """The settings the endpoint was last started with, by any host; None before its first start."""
    data = read_requested()
    return Endpoint(**known_fields(Endpoint, data)) if data else None


def keep_up(target: SparkTarget, endpoint: Endpoint, *, by: str) -> Served | None:
    """One supervision pass: start the endpoint unless it runs, is starting, or was stopped on
    purpose. A hung one (alive but silent) is terminated and started again; that is not a stop
    on purpose, so the next pass keeps it up too. ``endpoint``: the settings for a first start;
    after that, the endpoint is started again as it was last asked (:func:`requested`)."""
    endpoint = requested() or endpoint
    driver = Driver.read(NAME)
    if driver is not None and driver.desired == "stopped":
        return None
    if running() is not None:
        return None
    proc = endpoint_process()
    if proc is not None:
        st = EndpointStatus.read()
        if st is not None and st.state == "starting" and time.time() - st.updated_at < START_TIMEOUT:
            return None
        terminate(proc, process_named(driver.pid, SCRIPT) if driver else None, timeout=30, grace=10)
    try:
        return serve(target, endpoint, by=by, as_of=driver.version if driver else 0)
    except IntentChanged:  # stopped on purpose after this pass read the record
        return None


def open_session(
    *, user: str | None = None, password: str | None = None, warn: Callable[[str], None] = lambda _: None
) -> SqlSession:
    """The endpoint when it runs (it owns the catalog then); a local Spark session otherwise."""
    st = running()
    if st is not None:
        return EndpointSession(
            Endpoint(st.host, st.port).client_host, st.port, auth=st.auth, user=user, password=password
        )
    from jobs.sql.session import LocalSession  # Spark starts only when there is no endpoint

    return LocalSession(warn)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0
