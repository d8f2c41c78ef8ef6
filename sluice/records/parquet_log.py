"""The commit log of a Parquet table (Spark's ``_spark_metadata``), read and written without Spark.

A Parquet table written by Sluice is a folder of date-partitioned Parquet files plus this
log, which lists the files that are committed. It is the log Spark's streaming file sink
keeps, so ``spark.read.parquet(table)`` reads committed files only, and so does any reader
that follows it (:func:`committed_files`). The on-disk format:

- one file per commit, named by its number: ``0``, ``1``, ...;
- every tenth (``9``, ``19``, ...) is a compaction, ``9.compact``, listing every file
  committed so far, so a reader needs only the newest compaction and the commits after it;
- each file is the line ``v1``, then one JSON object per data file (``path``, ``size``,
  ``modificationTime``, ``action``: ``add`` or ``delete``...).

Spark's own sink numbers commits by the stream's batch ids, which breaks as soon as a
batch has nothing for the table (the next compaction misses a commit) or a second writer,
such as a backfill, commits to it. Sluice numbers commits by the table's own sequence
instead: a batch with nothing to write commits nothing, and any writer commits the next
number. Each data file's name carries its writer, its batch and the epoch of the driver
that wrote it (``sluice-<writer>-<batch>-e<epoch>-part-...``), which is how a batch replayed
after a crash is recognised as committed already (:func:`last_batch`).

Example::

    entries = committed_files(Path(".sluice/tables/github_events"))
    [e.path for e in entries]       # ['file:///.../date=2026-11-21/sluice-...-part-00000-....parquet', ...]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sluice.storage import Location

LOG_DIR = "_spark_metadata"
VERSION = "v1"
#: Spark's default ``spark.sql.streaming.fileSink.log.compactInterval``; its reader derives the
#: interval from the compaction files it finds, so every writer of a table must keep to one.
COMPACT_INTERVAL = 10
#: Spark's default block size for local files (what its sink records for them).
BLOCK_SIZE = 32 * 1024 * 1024


class LogError(RuntimeError):
    """The log cannot be read: a commit is missing or it is in a format Sluice does not know."""


@dataclass(frozen=True)
class Entry:
    """One line of a commit: a data file added to (or deleted from) the table."""

    path: str  # a URI, e.g. file:///data/t/date=2026-11-21/sluice-...-part-00000-....parquet
    size: int
    modification_time: int  # epoch milliseconds
    action: str = "add"
    block_replication: int = 1
    block_size: int = BLOCK_SIZE

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "isDir": False,
                "modificationTime": self.modification_time,
                "blockReplication": self.block_replication,
                "blockSize": self.block_size,
                "action": self.action,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            modification_time=int(data["modificationTime"]),
            action=str(data.get("action", "add")),
            block_replication=int(data.get("blockReplication", 1)),
            block_size=int(data.get("blockSize", BLOCK_SIZE)),
        )


def is_compaction(commit: int) -> bool:
    return (commit + 1) % COMPACT_INTERVAL == 0


def file_name(commit: int) -> str:
    return f"{commit}.compact" if is_compaction(commit) else str(commit)


_NAME = re.compile(r"^(\d+)(\.compact)?$")


def commit_number(name: str) -> int | None:
    """The commit a log file holds, or None for anything else (checksums, temporary files)."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def latest(names: Iterable[str]) -> int | None:
    """The newest commit among the log folder's file names."""
    return max((n for n in (commit_number(name) for name in names) if n is not None), default=None)


def needed(newest: int) -> range:
    """The commits a reader needs: the newest compaction at or before ``newest`` and all after it."""
    start = max(0, (newest + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1)
    return range(start, newest + 1)


def check_interval(names: Iterable[str]) -> None:
    """Refuse a log whose compactions were made at another interval (Spark's reader would too)."""
    compactions = [commit_number(name.removesuffix(".compact")) for name in names if name.endswith(".compact")]
    odd = sorted(n for n in compactions if n is not None and not is_compaction(n))
    if odd:
        raise LogError(
            f"the log was compacted every {odd[0] + 1} commits, not every {COMPACT_INTERVAL} "
            "(spark.sql.streaming.fileSink.log.compactInterval was changed); Sluice writes every "
            f"{COMPACT_INTERVAL}"
        )


def parse(text: str, where: str = "commit") -> list[Entry]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != VERSION:
        found = lines[0].strip() if lines else "an empty file"
        raise LogError(f"{where}: expected the log format {VERSION}, found {found!r} (written by another Spark?)")
    try:
        return [Entry.from_json(json.loads(line)) for line in lines[1:] if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        raise LogError(f"{where}: not a file-sink log entry: {exc}") from None


def render(entries: Iterable[Entry]) -> str:
    return "\n".join([VERSION, *(e.to_json() for e in entries)])


def live(entries: Iterable[Entry]) -> list[Entry]:
    """The files still in the table: every add that no later delete removed (as Spark compacts)."""
    entries = list(entries)
    deleted = {e.path for e in entries if e.action == "delete"}
    return [e for e in entries if e.action == "add" and e.path not in deleted]


def newest(entries: list[Entry]) -> Entry:
    """The file written last: it has every column the table has gained (Parquet files keep
    the schema they were written with)."""
    return max(entries, key=lambda e: e.modification_time)


# --- who wrote a file -------------------------------------------------------------------


def tag(writer: str, batch: int, epoch: int | None = None) -> str:
    """The prefix of every data file one writer writes for one batch; with ``epoch``, of those
    the driver of that epoch wrote (two drivers of one checkpoint may both write a batch, and
    only one of them commits it)."""
    batch_tag = f"sluice-{writer}-{batch:012d}-"
    return batch_tag if epoch is None else f"{batch_tag}e{epoch}-"


def last_batch(entries: Iterable[Entry], writer: str) -> int | None:
    """The newest batch of ``writer`` that has a file in the log (None if it has none)."""
    head = f"sluice-{writer}-"
    newest = None
    for e in entries:
        name = e.path.rsplit("/", 1)[-1]
        batch = name[len(head) : len(head) + 12]
        if name.startswith(head) and batch.isdigit() and name[len(head) + 12 : len(head) + 13] == "-":
            newest = int(batch) if newest is None else max(newest, int(batch))
    return newest


def partition_columns(table: str, entries: Iterable[Entry]) -> list[str]:
    """The partition columns: the ``name=value`` folders between the table and its first file
    (the table's own folder may have a ``=`` in its name too)."""
    root = _path_part(table).rstrip("/") + "/"
    for e in entries:
        path = _path_part(e.path)
        if path.startswith(root):
            folders = path[len(root) :].split("/")[:-1]
        else:  # spelled another way: walk up from the file while folders are name=value, as Spark does
            folders = []
            for folder in reversed(path.split("/")[:-1]):
                if "=" not in folder:
                    break
                folders.insert(0, folder)
        return [folder.split("=", 1)[0] for folder in folders if "=" in folder]
    return []


# --- reading a table without Spark --------------------------------------------------------


def location(uri: str) -> Location:
    """A data file's URI as the log records it (%-escaped, as Hadoop writes paths), to read it."""
    if uri.startswith("file:"):
        return Location("/" + unquote(uri.removeprefix("file:")).lstrip("/"))
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        return Location(f"{scheme}://{unquote(rest)}")
    return Location(uri)


def place(location: str) -> str:
    """The path of a URI or local path, unescaped, for comparing places: ``file:///t`` -> ``/t``."""
    return _path_part(location)


def _path_part(location: str) -> str:
    if location.startswith("file:"):
        return "/" + unquote(location.removeprefix("file:")).lstrip("/")
    return unquote(location.split("://", 1)[1].split("/", 1)[1] if "://" in location else location)


def committed_files(table: str | Path | Location) -> list[Entry]:
    """The files committed to a Parquet table (local or on S3), as a reader that follows the log sees them."""
    folder = (table if isinstance(table, Location) else Location(str(table))) / LOG_DIR
    names = [c.name for c in folder.children()]
    newest = latest(names)
    if newest is None:
        return []
    check_interval(names)
    entries: list[Entry] = []
    for commit in needed(newest):
        path = folder / file_name(commit)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise LogError(f"{path} is missing: the log needs every commit since its last compaction") from None
        entries += parse(text, str(path))
    return live(entries)
