"""A PostgreSQL server on this machine, from Debian's package: for the cluster layout and tests.

PostgreSQL refuses to run as root, so as root it runs as the ``postgres`` user, in a folder
of its own. Production uses its own server; Sluice only connects to it.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sluice.dev.ports import free_port


def bin_dir() -> Path:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if not found:
        raise FileNotFoundError("PostgreSQL's initdb is not installed: `make cluster-setup` installs it (apt-get)")
    return Path(found).resolve().parent


class PostgresServer:
    """One server, one superuser (``user``, with ``password``), on 127.0.0.1:``port``."""

    def __init__(
        self, base: Path | None = None, port: int | None = None, user: str = "sluice", password: str | None = None
    ) -> None:
        self.base = base or Path(tempfile.mkdtemp(prefix="sluice-postgres-"))
        self.port, self.user = port or free_port(), user
        self.password = password or secrets.token_urlsafe(16)
        self.data = self.base / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def url(self, database: str = "postgres") -> str:
        """A libpq URL without the password (it goes in ``PGPASSFILE``, see :meth:`passfile`)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    @property
    def passfile(self) -> Path:
        """A libpq password file for this server (``PGPASSFILE``): passwords stay off URLs."""
        return self.base / "pgpass"

    def _run(self, *cmd: str) -> None:
        done = subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{Path(cmd[0]).name} failed: {(done.stdout + done.stderr).strip()[-2000:]}")

    def start(self) -> PostgresServer:
        self.base.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.base, "postgres")
        if not (self.data / "PG_VERSION").exists():
            secret = self.base / "initdb-password"
            secret.write_text(self.password)
            if self._as:
                shutil.chown(secret, "postgres")
            self._run(str(bin_dir() / "initdb"), "-D", str(self.data), "-A", "scram-sha-256", f"--pwfile={secret}",
                      "-U", self.user, "--no-sync")  # fmt: skip
            secret.unlink()
        # fsync=off: for speed on this one machine (the layout and the tests), whose data a power cut
        # may lose; docker/compose.yaml's PostgreSQL, like any production one, keeps it on.
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.base / "log"), "-w",
                  "start")  # fmt: skip
        self.passfile.write_text(f"127.0.0.1:{self.port}:*:{self.user}:{self.password}\n")
        self.passfile.chmod(0o600)
        return self

    def create_database(self, name: str) -> None:
        self.psql("postgres", f'CREATE DATABASE "{name}"')

    def psql(self, database: str, sql: str) -> str:
        done = subprocess.run(
            [
                str(bin_dir() / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                database,
                "-tAc",
                sql,
            ],
            env=os.environ | {"PGPASSWORD": self.password},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode:
            raise RuntimeError(f"psql: {done.stderr.strip()}")
        return done.stdout

    def restart(self, down_for: float = 0.0) -> float:
        """Stop the server (its data kept), wait ``down_for`` seconds, start it again; the
        seconds it refused connections."""
        began = time.monotonic()
        self.stop(remove=False)
        time.sleep(down_for)
        self.start()
        return time.monotonic() - began

    def stop(self, remove: bool = True) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        if remove:
            shutil.rmtree(self.base, ignore_errors=True)
