"""Run state in files under ``$SLUICE_HOME/run/``: the embedded default, for one machine.

Records are small JSON files, ``run/<name>/<kind>.json``, each replaced atomically. Leases
are ``run/leases/<place>.json``; a transaction over them, and a compare-and-set of a record,
holds an exclusive ``flock`` on ``run/leases/.lock`` for the few milliseconds it takes, so
every process of this machine sees one order of acquisitions, renewals and fenced writes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sluice.state import VERSION, Kind, Transaction, TransactionalStore, version_of
from sluice.state.lease import Claimed, Lease, holder_from_dict


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace a small JSON file atomically, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _file_name(key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    role, _, place = key.partition(":")
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", place.rstrip("/").rsplit("/", 1)[-1])[:40]
    return f"{readable}-{digest}.{role}"


@contextmanager
def _flock(path: Path, timeout: float | None = None) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        if timeout is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise Claimed(f"waited {timeout:.0f}s for {path.name}") from None
                    time.sleep(0.01)
        yield  # closing the file releases the lock


class FileStore(TransactionalStore):
    def __init__(self, run: Path) -> None:
        self.run = run
        self.leases = run / "leases"

    def now(self) -> float:
        return time.time()

    def _record(self, kind: Kind, name: str) -> Path:
        return self.run / name / f"{kind}.json"

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        return read_json(self._record(kind, name))

    def put(self, kind: Kind, name: str, data: dict[str, Any], *, fence: Lease | None = None) -> None:
        if fence is None:  # an atomic replace needs no lock
            write_json(self._record(kind, name), data)
        else:
            super().put(kind, name, data, fence=fence)

    def put_if(self, kind: Kind, name: str, data: dict[str, Any], version: int) -> bool:
        with _flock(self.leases / ".lock"):
            if version_of(self.get(kind, name)) != version:
                return False
            write_json(self._record(kind, name), data | {VERSION: version + 1})
            return True

    @contextmanager
    def transaction(self, keys: list[str]) -> Iterator[Transaction]:
        with _flock(self.leases / ".lock"):
            rows = {k: read_json(self.leases / f"{_file_name(k)}.json") or {} for k in keys}
            txn = Transaction(
                self.now(),
                {k: holder_from_dict(r.get("holder")) for k, r in rows.items()},
                {k: int(r.get("epoch", 0)) for k, r in rows.items()},
            )
            yield txn
            for key, holder in txn.written.items():
                epoch = holder.epoch if holder is not None else txn.epochs.get(key, 0)
                row = {"key": key, "holder": asdict(holder) if holder else None, "epoch": epoch}
                write_json(self.leases / f"{_file_name(key)}.json", row)
            for kind, name, data in txn.puts:
                if data is None:
                    self._record(kind, name).unlink(missing_ok=True)
                else:
                    write_json(self._record(kind, name), data)

    @contextmanager
    def exclusive(self, key: str, *, timeout: float = 120.0) -> Iterator[None]:
        with _flock(self.run / "locks" / f"{_file_name(key)}.lock", timeout):
            yield
