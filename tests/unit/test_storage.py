"""Where tables live: how each backend is named for Spark, pyarrow and delta-rs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import storage
from sluice.errors import InvalidInput
from sluice.storage import LocalStorage, Location, S3Storage


def test_each_location_goes_to_its_backend() -> None:
    assert isinstance(storage.for_uri("/data/t"), LocalStorage)
    assert isinstance(storage.for_uri("file:///data/t"), LocalStorage)
    assert isinstance(storage.for_uri("s3a://bucket/t"), S3Storage)
    with pytest.raises(InvalidInput, match="local disk and on s3a:// only"):
        storage.for_uri("abfss://c@account.dfs.core.windows.net/t")
    assert not storage.reachable("gs://bucket/t") and storage.reachable("s3://bucket/t")


def test_s3_names_the_same_object_for_every_reader(monkeypatch) -> None:
    for k, v in {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_REGION", raising=False)
    s3 = S3Storage.from_env()
    assert s3.fs_path("s3a://bucket/tables/t/") == "bucket/tables/t"
    assert s3.delta_uri("s3a://bucket/tables/t") == "s3://bucket/tables/t"
    assert s3.storage_options() == {
        "AWS_REGION": "us-east-1",
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
    }
    conf = s3.hadoop_conf()
    assert conf["fs.s3a.endpoint"] == "http://127.0.0.1:9000" and conf["fs.s3a.path.style.access"] == "true"
    assert conf["fs.s3a.connection.ssl.enabled"] == "false"
    assert not any("key" in k for k in conf), "secrets stay in the environment, off spark-submit's command line"
    with pytest.raises(Exception, match="not an S3 location"):
        s3.fs_path("s3a:///no-bucket")


def test_spark_gets_s3a_only_where_s3_is_used(monkeypatch, tmp_path: Path) -> None:
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLUICE_JARS", str(tmp_path))
    assert storage.spark_conf() == {}  # the embedded default's JVMs never open the SDK
    with pytest.raises(Exception, match="make cluster-setup"):
        storage.spark_conf(["s3a://bucket/t"])
    (tmp_path / "s3").mkdir()
    (tmp_path / "s3" / "hadoop-aws-3.4.2.jar").touch()
    with pytest.raises(Exception, match="no sluice-storage.jar .*make setup"):  # no commit on S3 without it
        storage.spark_conf(["s3a://bucket/t"])
    (tmp_path / "sluice").mkdir()
    (tmp_path / "sluice" / "sluice-storage.jar").touch()
    conf = storage.spark_conf(["s3a://bucket/t"])
    assert (
        conf["spark.driver.extraClassPath"]
        == conf["spark.executor.extraClassPath"]
        == str(tmp_path / "s3" / "hadoop-aws-3.4.2.jar")
    )
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    # Every commit on S3 is a put-if-absent the store decides: Delta's log and Spark's checkpoint logs.
    assert conf["spark.delta.logStore.s3a.impl"] == "sluice.storage.ConditionalPutLogStore"
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == "sluice.storage.ConditionalCheckpointFileManager"


def test_a_location_reads_like_a_path(tmp_path: Path) -> None:
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "1").write_text("v1\n")
    (tmp_path / "commits" / "0").write_text("v1\n")
    root = Location(f"file://{tmp_path}")
    assert [c.name for c in (root / "commits").children()] == ["0", "1"]
    assert (root / "commits").is_dir() and (root / "commits" / "1").is_file()
    assert (root / "commits" / "1").read_text() == "v1\n"
    assert (root / "commits" / "1").mtime() == pytest.approx((tmp_path / "commits" / "1").stat().st_mtime)
    assert (root / "nothing").children() == [] and not (root / "nothing").is_dir()
