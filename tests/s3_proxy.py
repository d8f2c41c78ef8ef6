"""An HTTP proxy in front of the S3 server that can hold chosen uploads: the pause between a
writer's check and its act, made exact.

Every request is forwarded as it came (headers included, so S3's signatures still match);
an upload whose key matches an armed pattern is held until another upload of the same key has
been answered, then forwarded. That is the race two hosts run when one pauses (a GC pause, a
slow retry, SIGSTOP) after it checked that version N was free and before it wrote it: the
other writes N meanwhile. The proxy records what each held upload was answered (412 when the
store refused it: a put-if-absent; 200 when it replaced the other's object).

The proxy serves from threads of the test's process, so that process's own S3 clients must
not go through it: delta-rs and pyarrow hold the GIL while they wait for an answer. Point the
drivers (other processes) at it, and read from the server.

Example::

    proxy = HoldingProxy(s3.port).start()
    proxy.hold(r"_delta_log/\\d{20}\\.json$")     # the next commit upload waits for a rival
    ...                                          # two writers append
    proxy.held                                   # [Held(key=..., status=412)]
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from sluice.dev.ports import free_port

#: The user metadata each of Sluice's conditional uploads carries (jobs/java/sluice/storage/ConditionalPut.java):
#: it tells a writer's retry of its own upload from another writer's.
WRITER_HEADER = "x-amz-meta-sluice-write-id"


@dataclass
class Held:
    """One upload the proxy held: which key, how long, and what the store answered it."""

    key: str
    writer: str | None = None  # the upload's write id (sluice.storage.ConditionalPut's metadata)
    timeout: float = 120.0
    status: int | None = None
    waited: float = 0.0
    rival_status: int | None = None  # what the upload that passed it was answered
    released: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class _Arm:
    pattern: re.Pattern[str]
    count: int
    timeout: float


class HoldingProxy:
    """Forwards to the S3 server on 127.0.0.1:``upstream``; holds armed uploads (see module doc)."""

    def __init__(self, upstream: int, port: int | None = None) -> None:
        self.upstream, self.port = upstream, port or free_port()
        self.held: list[Held] = []
        self.requests: list[tuple[str, str, int]] = []  # (method, key, status) of every answered request
        self._arms: list[_Arm] = []
        self._unconditional: list[re.Pattern[str]] = []
        #: Keys of conditional uploads the server refused (412) and the proxy answered 200.
        self.unconditional: list[str] = []
        self._waiting: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, s3_env: dict[str, str]) -> dict[str, str]:
        """The S3 server's client settings with the proxy as the endpoint."""
        return s3_env | {"AWS_ENDPOINT_URL": self.endpoint}

    def hold(self, pattern: str, count: int = 1, timeout: float = 120.0) -> None:
        """Hold the next ``count`` uploads whose key matches ``pattern``, each until another upload
        of its key is answered (or ``timeout`` seconds pass, then it goes on alone)."""
        with self._lock:
            self._arms.append(_Arm(re.compile(pattern), count, timeout))

    def ignore_conditions(self, pattern: str) -> None:
        """Play a store that ignores ``If-None-Match: *`` for keys matching ``pattern``: a
        create the server refused (412, the object exists) is answered 200, as such a store
        answers a second create. (The object keeps the first one's content.)"""
        with self._lock:
            self._unconditional.append(re.compile(pattern))

    def disarm(self) -> None:
        """Hold nothing more, and let every held upload go."""
        with self._lock:
            self._arms.clear()
            waiting, self._waiting = list(self._waiting.values()), {}
        for h in waiting:
            h.released.set()

    def raced(self) -> list[Held]:
        """The held uploads that another upload of their key passed."""
        return [h for h in self.held if h.rival_status is not None]

    def start(self) -> HoldingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            _upstream: http.client.HTTPConnection | None = None

            def log_message(self, format: str, *args: object) -> None:
                pass

            def upstream(self) -> http.client.HTTPConnection:
                """This client connection's own connection to the server, kept alive as the client's is."""
                if self._upstream is None:
                    self._upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=300)
                return self._upstream

            def finish(self) -> None:
                super().finish()
                if self._upstream is not None:
                    self._upstream.close()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = urlsplit(self.path).path
                held = proxy._maybe_hold(self.command, key, self.headers.get(WRITER_HEADER))
                if held is not None:
                    began = time.monotonic()
                    if not held.released.wait(held.timeout):
                        proxy._give_up(held)
                    held.waited = time.monotonic() - began
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
                payload = body if self.command not in ("GET", "HEAD") else None
                for attempt in (1, 2):  # a kept-alive upstream connection the server closed: once more, anew
                    conn = self.upstream()
                    try:
                        conn.request(self.command, self.path, body=payload, headers=headers)
                        resp = conn.getresponse()
                        data = resp.read()
                        break
                    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                        conn.close()
                        self._upstream = None
                        if attempt == 2:
                            raise
                status = resp.status
                if status == 412 and self.command == "PUT" and proxy._ignores(key):
                    status, data = 200, b""
                proxy._answered(self.command, key, status, held)
                try:
                    self.send_response_only(status, resp.reason if status == resp.status else "OK")
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    if self.command != "HEAD":
                        self.send_header("Content-Length", str(len(data)))
                    elif resp.getheader("Content-Length") is not None:
                        self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # a client that gave up waiting (and retried)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # several Spark drivers open dozens of connections at once

        self._server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self.disarm()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _maybe_hold(self, method: str, key: str, writer: str | None) -> Held | None:
        if method != "PUT":
            return None
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is not None and writer is not None and writer == waiting.writer:
                return waiting  # the held writer's own retry (its client gave up waiting): held too
            if waiting is not None:
                return None  # the rival: it goes through, and lets the held one go after it
            for arm in self._arms:
                if arm.count > 0 and arm.pattern.search(key):
                    arm.count -= 1
                    held = Held(key, writer, arm.timeout)
                    self._waiting[key] = held
                    self.held.append(held)
                    return held
        return None

    def _ignores(self, key: str) -> bool:
        with self._lock:
            if any(p.search(key) for p in self._unconditional):
                self.unconditional.append(key)
                return True
        return False

    def _answered(self, method: str, key: str, status: int, held: Held | None) -> None:
        with self._lock:
            self.requests.append((method, key, status))
            if held is not None:
                held.status = status  # the last answer, when the writer retried its held upload
                return
            waiting = self._waiting.pop(key, None) if method == "PUT" else None
        if waiting is not None:
            waiting.rival_status = status
            waiting.released.set()

    def _give_up(self, held: Held) -> None:
        """No rival came in time: the held upload goes on alone."""
        with self._lock:
            if self._waiting.get(held.key) is held:
                del self._waiting[held.key]
