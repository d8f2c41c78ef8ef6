"""Where tables and checkpoints live: the local disk or an S3-compatible object store.

One small interface, one class per backend (as the Spark provider has one class per deploy
target). Each says how the three kinds of reader reach it:

- Spark, through Hadoop (``file:``, ``s3a://``): :func:`spark_conf` on every submission;
- Sluice's own readers without Spark (supervision's lag, the audits, the Parquet log):
  :class:`Location`, over pyarrow's filesystems;
- delta-rs (``sluice check``, ``sluice schema suggest``, the tests' readers):
  :meth:`Storage.delta_uri` and :meth:`Storage.storage_options`.

S3 settings come from the variables every AWS tool reads: ``AWS_ENDPOINT_URL`` (an
S3-compatible server; unset on AWS itself), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
and ``AWS_REGION``. Spark's S3A reads the keys from the same variables (its default
credential chain), so no secret goes on a spark-submit command line.

pyarrow is imported when a location is first read, so importing this module stays light
(the DAG files import :mod:`sluice.ops` at parse time).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from sluice import config
from sluice.errors import InvalidInput, SluiceError

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyarrow.fs import FileSystem

#: The schemes Spark may be given for S3 (``s3a`` is Hadoop's connector; ``s3`` is what
#: delta-rs and most tools call the same objects).
S3_SCHEMES = ("s3a", "s3")


class Storage(ABC):
    """How one backend is reached by Spark, by pyarrow and by delta-rs."""

    name: ClassVar[str]

    @abstractmethod
    def filesystem(self) -> FileSystem:
        """The pyarrow filesystem the Python side reads this backend with."""

    @abstractmethod
    def fs_path(self, uri: str) -> str:
        """``uri`` as a path of :meth:`filesystem`."""

    @abstractmethod
    def delta_uri(self, uri: str) -> str:
        """``uri`` as delta-rs names the same table."""

    def storage_options(self) -> dict[str, str]:
        """delta-rs's options for this backend."""
        return {}


class LocalStorage(Storage):
    """The local disk (or a mounted shared filesystem): the embedded default."""

    name = "local"

    def filesystem(self) -> FileSystem:
        from pyarrow.fs import LocalFileSystem

        return LocalFileSystem()

    def fs_path(self, uri: str) -> str:
        if uri.startswith("file:"):
            uri = "/" + uri.removeprefix("file:").lstrip("/")
        return str(Path(uri).absolute())

    def delta_uri(self, uri: str) -> str:
        return self.fs_path(uri)


@dataclass(frozen=True)
class S3Storage(Storage):
    """An S3 bucket, on AWS or on any S3-compatible server (``AWS_ENDPOINT_URL``)."""

    name: ClassVar[str] = "s3"
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = None

    @classmethod
    def from_env(cls) -> S3Storage:
        return cls(
            endpoint=os.environ.get("AWS_ENDPOINT_URL") or None,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key=os.environ.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
        )

    def filesystem(self, create_buckets: bool = False) -> FileSystem:
        return _s3_filesystem(self, create_buckets)

    def fs_path(self, uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme not in S3_SCHEMES or not parts.netloc:
            raise SluiceError(f"{uri} is not an S3 location (s3a://bucket/path)")
        return f"{parts.netloc}/{parts.path.lstrip('/')}".rstrip("/")

    def delta_uri(self, uri: str) -> str:
        return "s3://" + self.fs_path(uri)

    def storage_options(self) -> dict[str, str]:
        # delta-rs commits with If-None-Match (put-if-absent), as Sluice's Spark commits do,
        # where it would otherwise refuse to write without a lock service.
        options = {"AWS_REGION": self.region, "AWS_CONDITIONAL_PUT": "etag"}
        if self.endpoint:
            options |= {
                "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": str(self.endpoint.startswith("http:")).lower(),
            }
        if self.access_key and self.secret_key:
            options |= {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        return options

    def hadoop_conf(self) -> dict[str, str]:
        """S3A's settings for this bucket's server (the keys come from the environment)."""
        conf = {"fs.s3a.endpoint.region": self.region}
        if self.endpoint:
            conf |= {
                "fs.s3a.endpoint": self.endpoint,
                # S3-compatible servers on a plain host name serve buckets as paths.
                "fs.s3a.path.style.access": "true",
                "fs.s3a.connection.ssl.enabled": str(self.endpoint.startswith("https:")).lower(),
            }
        return conf


@lru_cache(maxsize=8)
def _s3_filesystem(s3: S3Storage, create_buckets: bool = False) -> FileSystem:
    from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

    if s3.endpoint is None:
        return S3FileSystem(
            access_key=s3.access_key, secret_key=s3.secret_key, region=s3.region, allow_bucket_creation=create_buckets
        )
    url = urlsplit(s3.endpoint)
    return S3FileSystem(
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        region=s3.region,
        endpoint_override=url.netloc,
        scheme=url.scheme or "https",
        allow_bucket_creation=create_buckets,
        # A restarted server answers again within seconds; the default gives up after 3 tries.
        retry_strategy=AwsStandardS3RetryStrategy(max_attempts=10),
    )


def for_uri(uri: str) -> Storage:
    """The backend a table or checkpoint location lives on."""
    scheme = urlsplit(uri).scheme if "://" in uri else "file"
    if scheme == "file":
        return LocalStorage()
    if scheme in S3_SCHEMES:
        return S3Storage.from_env()
    raise InvalidInput(f"{uri}: Sluice reads tables and checkpoints on local disk and on s3a:// only")


def reachable(uri: str) -> bool:
    """Can Sluice read this location without Spark (local disk or S3)?"""
    try:
        for_uri(uri)
    except InvalidInput:
        return False
    return True


def s3_jars() -> list[str]:
    """S3A and the AWS SDK, when `make cluster` (or `make test`) installed them."""
    return sorted(str(p) for p in config.jars_dir("s3").glob("*.jar"))


def s3_configured() -> bool:
    """Is this host set up for S3 (an endpoint or keys in its environment)?"""
    return bool(os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ACCESS_KEY_ID"))


def spark_conf(uris: Iterable[str] = ()) -> dict[str, str]:
    """What Spark needs to open s3a:// locations: S3A's settings and its jars on the class path.

    Given when any of ``uris`` is on S3 or the host is set up for S3; empty otherwise, so the
    embedded default's JVMs never open the SDK. The jars go on the driver's and executors'
    class path rather than in ``spark.jars``, which would copy the 600 MiB SDK to every
    executor; each Spark host has them at the same path, as a container image does."""
    wanted = s3_configured() or any(isinstance(for_uri(u), S3Storage) for u in uris)
    if not wanted:
        return {}
    jars = s3_jars()
    if not jars:
        if s3_configured() and not any(isinstance(for_uri(u), S3Storage) for u in uris):
            return {}
        raise SluiceError(f"tables on s3a:// need S3A's jars in {config.jars_dir('s3')}: run `make cluster-setup`")
    if not commit_jars():
        raise SluiceError(f"no sluice-storage.jar in {config.jars_dir('sluice')}: run `make setup`")
    path = os.pathsep.join(jars)
    conf = {"spark.driver.extraClassPath": path, "spark.executor.extraClassPath": path} | PUT_IF_ABSENT
    return conf | {f"spark.hadoop.{k}": v for k, v in S3Storage.from_env().hadoop_conf().items()}


#: Every commit on S3 is a put-if-absent that the store decides (S3's ``If-None-Match: *``), so
#: no pause or clock can make two writers both win (jobs/java/sluice/storage): Delta's log
#: (Delta's own S3 log store checks, then PUTs, under a lock of one JVM), and the offset and
#: commit logs of Spark's checkpoints (a check, then a copy). A store without conditional
#: writes is refused when a commit is made, not silently shared.
PUT_IF_ABSENT = {
    "spark.delta.logStore.s3a.impl": "sluice.storage.ConditionalPutLogStore",
    "spark.sql.streaming.checkpointFileManagerClass": "sluice.storage.ConditionalCheckpointFileManager",
}


def commit_jars() -> list[str]:
    """Sluice's own classes for commits on S3, which `make setup` builds. They go in
    ``spark.jars`` beside Delta's, whose class loader must see them."""
    jar = config.jars_dir("sluice") / "sluice-storage.jar"
    return [str(jar)] if jar.is_file() else []


def delta_table(uri: str) -> DeltaTable | None:
    """The Delta table at ``uri`` through delta-rs, wherever it lives; None when there is none yet."""
    from deltalake import DeltaTable

    backend = for_uri(uri)
    where, options = backend.delta_uri(uri), backend.storage_options()
    if not DeltaTable.is_deltatable(where, storage_options=options):
        return None
    return DeltaTable(where, storage_options=options)


@dataclass(frozen=True)
class Location:
    """A file or folder of a table or checkpoint, on whichever backend holds it.

    The few pathlib operations Sluice's readers need, so one reader serves both backends.
    A folder on S3 is a key prefix: it exists once something is under it."""

    uri: str

    def __truediv__(self, name: str) -> Location:
        return Location(self.uri.rstrip("/") + "/" + name)

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def storage(self) -> Storage:
        return for_uri(self.uri)

    def arrow(self) -> tuple[FileSystem, str]:
        """The pyarrow filesystem and path to read this file with (``pq.read_table(path, filesystem=fs)``)."""
        storage = self.storage
        return storage.filesystem(), storage.fs_path(self.uri)

    def _info(self):  # type: ignore[no-untyped-def]
        storage = self.storage
        return storage.filesystem().get_file_info(storage.fs_path(self.uri))

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return bool(self._info().type == FileType.Directory)

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return bool(self._info().type == FileType.File)

    def children(self) -> list[Location]:
        """What is directly in this folder ([] when it does not exist)."""
        from pyarrow.fs import FileSelector

        storage = self.storage
        found = storage.filesystem().get_file_info(FileSelector(storage.fs_path(self.uri), allow_not_found=True))
        return sorted((self / info.base_name for info in found), key=lambda loc: loc.uri)

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_bytes(self) -> bytes:
        storage = self.storage
        with storage.filesystem().open_input_stream(storage.fs_path(self.uri)) as f:
            return bytes(f.read())

    def write_bytes(self, data: bytes) -> None:
        storage = self.storage
        fs, path = storage.filesystem(), storage.fs_path(self.uri)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as f:
            f.write(data)

    def files(self) -> set[str]:
        """Every file under this folder, by its path relative to it (none when it does not exist)."""
        from pyarrow.fs import FileSelector, FileType

        storage = self.storage
        root = storage.fs_path(self.uri).rstrip("/")
        found = storage.filesystem().get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
        return {i.path[len(root) + 1 :] for i in found if i.type == FileType.File}

    def mtime(self) -> float:
        """The last modification, in epoch seconds."""
        info = self._info()
        if info.mtime_ns is None:
            raise FileNotFoundError(self.uri)
        return float(info.mtime_ns) / 1e9
