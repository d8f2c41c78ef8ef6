"""Small file operations through Hadoop's public FileSystem API, so that checkpoints and
tables on HDFS or object stores work the same as local paths. The one module that reaches
the JVM for files."""

from __future__ import annotations

import errno
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark._jvm
    assert jvm is not None
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()), jpath


def qualify(spark: SparkSession, path: str) -> str:
    """The path as a fully qualified URI (``/data/t`` -> ``file:/data/t``), as catalogs record it."""
    fs, jpath = _fs(spark, path)
    return str(fs.makeQualified(jpath).toString())


def has_children(spark: SparkSession, path: str) -> bool:
    fs, jpath = _fs(spark, path)
    return bool(fs.exists(jpath)) and len(fs.listStatus(jpath)) > 0


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names of a folder's direct children ([] when the folder does not exist)."""
    fs, jpath = _fs(spark, path)
    if not fs.exists(jpath):
        return []
    return [str(s.getPath().getName()) for s in fs.listStatus(jpath)]


@dataclass(frozen=True)
class FileInfo:
    uri: str
    size: int
    modification_time: int  # epoch ms
    replication: int
    block_size: int


def _info(status: Any) -> FileInfo:
    return FileInfo(
        str(status.getPath().toUri().toString()),
        int(status.getLen()),
        int(status.getModificationTime()),
        int(status.getReplication()),
        int(status.getBlockSize()),
    )


def list_files(spark: SparkSession, path: str) -> list[FileInfo]:
    """Every file under ``path``, recursively ([] when it does not exist)."""
    fs, jpath = _fs(spark, path)
    if not fs.exists(jpath):
        return []
    found, it = [], fs.listFiles(jpath, True)
    while it.hasNext():
        found.append(_info(it.next()))
    return found


def info(spark: SparkSession, path: str) -> FileInfo:
    fs, jpath = _fs(spark, path)
    return _info(fs.getFileStatus(jpath))


def mkdirs(spark: SparkSession, path: str) -> None:
    fs, jpath = _fs(spark, path)
    fs.mkdirs(jpath)


def move(spark: SparkSession, src: str, dst: str) -> None:
    """Move a file into a folder that may not exist yet (a rename on HDFS and local disks)."""
    fs, jsrc = _fs(spark, src)
    _, jdst = _fs(spark, dst)
    fs.mkdirs(jdst.getParent())
    if not fs.rename(jsrc, jdst):
        raise OSError(f"could not move {src} to {dst}")


def delete(spark: SparkSession, path: str) -> None:
    """Remove a file or a folder with everything in it (nothing if it does not exist)."""
    fs, jpath = _fs(spark, path)
    fs.delete(jpath, True)


def read_text(spark: SparkSession, path: str) -> str:
    fs, jpath = _fs(spark, path)
    stream = fs.open(jpath)
    try:
        return str(spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))  # type: ignore[union-attr]
    finally:
        stream.close()


#: Object stores whose objects appear whole when their upload completes, and whose "rename"
#: is a copy: files are written in place there, not through a temporary file.
OBJECT_STORES = ("s3a",)


def _on_object_store(fs: Any) -> bool:
    return str(fs.getScheme()) in OBJECT_STORES


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a whole file, replacing any previous one (a replayed batch rewrites it).

    Through a temporary file renamed over the old one, so a reader polling the folder (the
    status command, a test) never sees a half-written file; on S3 an object is only visible
    once whole, so it is written in place."""
    fs, jpath = _fs(spark, path)
    local = _local(fs, jpath)
    if local is not None:
        tmp = _temporary_beside(local, text)
        try:
            os.replace(tmp, local)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return
    if _on_object_store(fs):
        out = fs.create(jpath, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        return
    tmp = _write_temporary(spark, fs, jpath, text)
    _rename(spark, fs, tmp, jpath, "OVERWRITE")


def _write_temporary(spark: SparkSession, fs: Any, jpath: Any, text: str) -> Any:
    """Write ``text`` to a hidden file beside ``jpath`` (globs for ``*.json`` skip it)."""
    jvm = spark._jvm
    assert jvm is not None
    tmp = jvm.org.apache.hadoop.fs.Path(jpath.getParent(), f".{jpath.getName()}.{uuid.uuid4().hex}.tmp")
    fs.mkdirs(jpath.getParent())
    out = fs.create(tmp, False)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
    return tmp


def _rename(spark: SparkSession, fs: Any, src: Any, dst: Any, *options: str) -> None:
    """Hadoop FileContext's rename, which (unlike FileSystem's) can refuse or overwrite."""
    jvm = spark._jvm
    assert jvm is not None
    fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(dst.toUri(), spark._jsc.hadoopConfiguration())
    rename = jvm.org.apache.hadoop.fs.Options.Rename
    array = spark.sparkContext._gateway.new_array(rename, len(options))  # type: ignore[union-attr]
    for i, name in enumerate(options):
        array[i] = getattr(rename, name)
    fc.rename(fs.makeQualified(src), fs.makeQualified(dst), array)


def _local(fs: Any, jpath: Any) -> Path | None:
    """The path on this host's disk when ``jpath`` is on the local file system, else None.

    Small files there are written by Python itself: through Hadoop, each costs forks of
    `chmod` (its permissions, without Hadoop's native library) and `readlink` (FileContext's
    rename), dozens a batch. The driver's Python and its JVM share the host, so the file is
    where Hadoop would have put it; a stale checksum file beside it (``.name.crc``, written
    when Hadoop wrote the file) is removed first, or Hadoop would refuse to read the new one."""
    if str(fs.getScheme()) != "file":
        return None
    path = Path(str(fs.makeQualified(jpath).toUri().getPath()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
    return path


def _temporary_beside(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
    except BaseException:  # a full disk: leave no partial file behind
        tmp.unlink(missing_ok=True)
        raise
    return tmp


#: What link(2) says on a file system without hard links (some FUSE and network mounts).
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def _link_new(path: Path, text: str) -> bool | None:
    """Put ``text`` at ``path`` unless it exists, atomically, as a hard link to a temporary
    file: True if created, False if it existed, None if this file system has no hard links."""
    tmp = _temporary_beside(path, text)
    try:
        os.link(tmp, path)  # refused atomically when the name exists
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno in _NO_HARD_LINKS:
            return None
        raise
    finally:
        tmp.unlink()


def create_new(spark: SparkSession, path: str, text: str) -> bool:
    """Create ``path`` with ``text`` unless it exists; False if another writer created it first.

    The text goes to a temporary file, so readers see the whole file or none of it, which
    then takes the name only if it is free, atomically: on a local disk a hard link, on HDFS
    FileContext's rename without overwriting (as Spark's own metadata logs do; also where
    the local file system has no hard links). On S3 the object is uploaded with
    ``If-None-Match: *``, which S3 itself refuses when the object exists: a put-if-absent
    that no check made before it can get wrong.
    """
    fs, jpath = _fs(spark, path)
    local = _local(fs, jpath)
    if local is not None and (created := _link_new(local, text)) is not None:
        return created
    if _on_object_store(fs):
        return _create_if_absent(spark, fs, jpath, text)
    tmp = _write_temporary(spark, fs, jpath, text)
    try:
        _rename(spark, fs, tmp, jpath)
        return True
    except Py4JJavaError as exc:
        if exc.java_exception.getClass().getName() != "org.apache.hadoop.fs.FileAlreadyExistsException":
            raise
        fs.delete(tmp, False)
        return False


def _create_if_absent(spark: SparkSession, fs: Any, jpath: Any, text: str) -> bool:
    """S3's put-if-absent, decided by the server, through Sluice's JVM helper (the one Delta's
    log and Spark's checkpoint logs use on S3): an upload with ``If-None-Match: *``, whose
    refusal is told from a retry of its own upload by an id in the object's metadata."""
    jvm = spark._jvm
    assert jvm is not None
    return bool(jvm.sluice.storage.ConditionalPut.create(fs, jpath, text))


class NoPutIfAbsent(RuntimeError):
    """The object store does not refuse a second create of one object: its commits would not be safe."""


def check_put_if_absent(spark: SparkSession, folder: str) -> None:
    """Refuse an object store that does not decide a put-if-absent (an S3-compatible server that
    ignores ``If-None-Match: *``): there two writers of one commit would both succeed, and the
    later one's upload silently replaces the other's. Two creates of one probe object under
    ``folder``; the second must be refused. Nothing is checked on other file systems."""
    fs, _ = _fs(spark, folder)
    if not _on_object_store(fs):
        return
    probe = f"{folder.rstrip('/')}/_sluice_probe/{uuid.uuid4().hex}"
    try:
        first, second = create_new(spark, probe, "first"), create_new(spark, probe, "second")
    finally:
        delete(spark, probe)
    if not first or second:
        raise NoPutIfAbsent(
            f"{folder}: this object store does not refuse a second create of one object (S3's If-None-Match: *), "
            "so two writers of one table or checkpoint could both commit and one commit would be lost; "
            "see 'What the storage decides' in docs/cluster.md"
        )
