"""jobs/tables/hadoopfs.py's writes on a local disk, which Python makes itself (no `chmod` or
`readlink` forks): a rewrite replaces the whole file, a create refuses a file that exists,
and neither leaves its temporary file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from jobs.tables import hadoopfs

pytestmark = pytest.mark.integration


def test_local_writes_replace_refuse_and_leave_nothing_behind(spark, tmp_path: Path) -> None:
    target = tmp_path / "folder" / "record.json"
    hadoopfs.write_text(spark, str(target), "first")
    hadoopfs.write_text(spark, str(target), "second")  # a replayed batch rewrites its record
    assert hadoopfs.read_text(spark, str(target)) == "second"

    assert hadoopfs.create_new(spark, str(tmp_path / "log" / "0.json"), "a")
    assert not hadoopfs.create_new(spark, str(tmp_path / "log" / "0.json"), "b")
    assert hadoopfs.read_text(spark, str(tmp_path / "log" / "0.json")) == "a"

    left = sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and ".tmp" in p.name)
    assert left == [], f"temporary files left behind: {left}"


def test_a_file_hadoop_wrote_with_a_checksum_is_replaced_and_still_reads(spark, tmp_path: Path) -> None:
    """A checkpoint from before these writes has Hadoop's files with their `.crc` beside
    them: rewriting one must not leave a checksum that no longer matches."""
    target = tmp_path / "writing"
    jvm = spark._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(str(target))
    out = jpath.getFileSystem(spark._jsc.hadoopConfiguration()).create(jpath, True)
    out.write(bytearray(b"41"))
    out.close()
    assert (tmp_path / ".writing.crc").exists()
    hadoopfs.write_text(spark, str(target), "42")
    assert hadoopfs.read_text(spark, str(target)) == "42"


def test_a_disk_without_hard_links_still_refuses_a_file_that_exists(spark, tmp_path: Path, monkeypatch) -> None:
    """Some FUSE and network mounts refuse link(2) (EPERM, ENOTSUP): create_new then takes
    Hadoop's rename without overwriting, as it did before it linked."""
    tried = []

    def no_links(src, dst):
        tried.append(dst)
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(dst))

    monkeypatch.setattr(hadoopfs.os, "link", no_links)
    log = tmp_path / "log"
    assert hadoopfs.create_new(spark, str(log / "0.json"), "a")
    assert not hadoopfs.create_new(spark, str(log / "0.json"), "b")
    assert hadoopfs.read_text(spark, str(log / "0.json")) == "a" and len(tried) == 2
    assert sorted(p.name for p in log.iterdir() if ".tmp" in p.name) == []
