"""When a driver gets the class-data archive: only while it matches this host's JDK and jars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice import runtime


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    jdk, spark, jars = tmp_path / "jdk", tmp_path / "spark", tmp_path / "jars"
    for d in (jdk, spark / "jars", jars / "cds"):
        d.mkdir(parents=True)
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (spark / "jars" / "spark-core.jar").write_bytes(b"core")
    (tmp_path / "delta.jar").write_bytes(b"delta")
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    monkeypatch.setenv("SLUICE_JARS", str(jars))
    return {"jdk": jdk, "spark": spark, "delta": tmp_path / "delta.jar", "archive": jars / "cds" / runtime.ARCHIVE}


def current(host: dict[str, Path]) -> str:
    return runtime.java_options(str(host["spark"]), [str(host["delta"])])


def stamp(host: dict[str, Path]) -> None:
    host["archive"].write_bytes(b"classes")
    fp = runtime.fingerprint(str(host["spark"]), [str(host["delta"])])
    (host["archive"].parent / runtime.FINGERPRINT).write_text(f"{fp}\n")


def test_no_archive_no_option(host: dict[str, Path]) -> None:
    assert current(host) == ""


def test_a_matching_archive_is_passed_quietly_unless_turned_off(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    stamp(host)
    assert current(host) == f"-XX:SharedArchiveFile={host['archive']} -Xlog:cds*=off"
    monkeypatch.setenv("SLUICE_CLASS_DATA", "off")
    assert current(host) == ""


@pytest.mark.parametrize("change", ["jdk", "spark jar", "connector jar", "new jar"])
def test_a_changed_jdk_or_jar_makes_it_stale(host: dict[str, Path], change: str) -> None:
    stamp(host)
    if change == "jdk":
        (host["jdk"] / "release").write_text('JAVA_VERSION="17.0.16"\n')
    elif change == "spark jar":
        (host["spark"] / "jars" / "spark-core.jar").write_bytes(b"core, patched")
    elif change == "connector jar":
        os.utime(host["delta"], ns=(0, 0))
    else:
        (host["spark"] / "jars" / "extra.jar").write_bytes(b"x")
    assert current(host) == "", f"a {change} changed: Java would drop the archive without a word"
