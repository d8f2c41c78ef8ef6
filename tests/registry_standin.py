"""A stand-in for a schema registry: a small local HTTP server that answers the one REST
endpoint Sluice's client calls, ``GET /subjects/<subject>/versions/<latest|N>``, as Confluent
Schema Registry documents it. It is not a registry (no compatibility rules, no ids shared
across subjects, no other endpoints); the tests name it for what it is."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse


class RegistryStandIn:
    def __init__(self) -> None:
        self.subjects: dict[str, list[tuple[str, str]]] = {}  # subject -> [(schemaType, schema)]
        self.requests: list[str] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                standin.requests.append(self.path)
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                if len(parts) != 4 or parts[0] != "subjects" or parts[2] != "versions":
                    return self._send(404, {"error_code": 404, "message": "HTTP 404 Not Found"})
                versions = standin.subjects.get(parts[1])
                if not versions:
                    return self._send(404, {"error_code": 40401, "message": f"Subject '{parts[1]}' not found."})
                number = len(versions) if parts[3] == "latest" else int(parts[3])
                if not 1 <= number <= len(versions):
                    return self._send(404, {"error_code": 40402, "message": f"Version {parts[3]} not found."})
                kind, text = versions[number - 1]
                body = {"subject": parts[1], "id": 100 + number, "version": number, "schema": text}
                self._send(200, body | ({"schemaType": kind} if kind != "AVRO" else {}))

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def register(self, subject: str, schema: dict[str, Any] | str, kind: str = "JSON") -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.subjects.setdefault(subject, []).append((kind, text))
        return len(self.subjects[subject])

    def stop(self) -> None:
        """The outage: the port stops answering."""
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
