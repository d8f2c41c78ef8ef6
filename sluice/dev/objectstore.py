"""An S3-compatible object store on this machine: S3Proxy (Maven Central) over a local folder.

For the cluster layout and its drills. S3Proxy speaks S3's API (signature v4, multipart
uploads, conditional writes with ``If-None-Match: *``) and keeps its objects on disk, so a
restarted server still has them. Production points ``AWS_ENDPOINT_URL`` at its own store
(or leaves it unset for AWS); Sluice only connects to it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from sluice import config
from sluice.dev.ports import free_port


class ObjectStoreError(RuntimeError):
    """The object store could not start."""


class S3Server:
    """S3Proxy on 127.0.0.1:``port``, its buckets as folders under ``base/data``."""

    def __init__(self, base: Path, port: int | None = None, access_key: str = "sluice", secret_key: str | None = None):
        self.base, self.port = base, port or free_port()
        self.access_key, self.secret_key = access_key, secret_key or secrets.token_urlsafe(24)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What every S3 client here reads (Spark's S3A, pyarrow, delta-rs, boto): the same variables."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def _jar(self) -> Path:
        found = sorted(config.jars_dir("s3proxy").glob("s3proxy-*.jar"))
        if not found:
            raise ObjectStoreError(f"no S3Proxy jar in {config.jars_dir('s3proxy')}: run `make cluster-setup`")
        return found[-1]

    def _write_properties(self) -> Path:
        (self.base / "data").mkdir(parents=True, exist_ok=True)
        props = self.base / "s3proxy.conf"
        props.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint=http://127.0.0.1:{self.port}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.access_key}",
                    f"s3proxy.credential={self.secret_key}",
                    "jclouds.provider=filesystem",
                    f"jclouds.filesystem.basedir={self.base / 'data'}",
                    "",
                ]
            )
        )
        props.chmod(0o600)  # it holds the secret key
        return props

    def start(self, timeout: float = 60.0) -> S3Server:
        props = self._write_properties()
        java = shutil.which("java") or "java"
        cmd = [java, "-Xmx256m", "-jar", str(self._jar()), "--properties", str(props)]
        with (self.base / "s3proxy.log").open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.listening():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.base / "s3proxy.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise ObjectStoreError(f"S3Proxy did not start on port {self.port}:\n{tail}")
            time.sleep(0.2)
        return self

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def create_bucket(self, name: str) -> None:
        """Create a bucket (nothing if it exists): S3A does not create buckets itself."""
        from pyarrow.fs import S3FileSystem

        fs = S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)

    def stop(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def restart(self, down_for: float = 0.0) -> float:
        """Stop the server, wait ``down_for`` seconds, start it again; the seconds it was unreachable."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_for)
        self.start()
        return time.monotonic() - began
