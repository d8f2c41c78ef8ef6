"""The embedded Kafka broker: Apache Kafka 4 in single-node KRaft mode, from Maven jars.

It runs the real broker (``kafka.Kafka``) with the machine's Java 17, one process acting
as broker and controller, listening on 127.0.0.1 only, with its data and logs under
``$SLUICE_HOME/kafka``. The heap is small by default so Kafka, Spark and Airflow fit on
a 2-core machine together.

Example::

    broker = EmbeddedBroker.default()
    broker.start()            # formats storage once, waits until it answers
    broker.status().running   # True
    broker.stop()
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sluice import config


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    topics: int | None = None


_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def new_cluster_id() -> str:
    """Kafka's cluster ids are 16 random bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@dataclass(frozen=True)
class EmbeddedBroker:
    home: Path
    port: int
    controller_port: int
    jars: Path
    heap: str = "512m"
    log_level: str = "INFO"
    #: In a cluster (:class:`KafkaCluster`): this node's id, every node's (id, controller port),
    #: the id all nodes format their storage with, and how many copies each partition has.
    node_id: int = 1
    voters: tuple[tuple[int, int], ...] = ()
    cluster_id: str | None = None
    replication: int = 1

    @classmethod
    def default(cls) -> EmbeddedBroker:
        port = config.kafka_port()
        return cls(
            home=config.sluice_home() / "kafka",
            port=port,
            controller_port=int(os.environ.get("SLUICE_KAFKA_CONTROLLER_PORT") or port + 1),
            jars=config.jars_dir("kafka"),
            heap=os.environ.get("SLUICE_KAFKA_HEAP", "512m"),
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    def properties(self) -> str:
        """server.properties for one combined broker+controller node on loopback (one of
        several in a cluster: then topics get ``replication`` copies, two of them in sync)."""
        voters = self.voters or ((self.node_id, self.controller_port),)
        rf, isr = self.replication, min(2, self.replication)
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={self.node_id}",
                "controller.quorum.voters=" + ",".join(f"{n}@127.0.0.1:{p}" for n, p in voters),
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                f"log.dirs={self.data_dir}",
                "num.partitions=1",
                f"default.replication.factor={rf}",
                f"min.insync.replicas={isr}",
                f"offsets.topic.replication.factor={rf}",
                "offsets.topic.num.partitions=1",
                f"transaction.state.log.replication.factor={rf}",
                f"transaction.state.log.min.isr={isr}",
                f"share.coordinator.state.topic.replication.factor={rf}",
                f"share.coordinator.state.topic.min.isr={isr}",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
                # Development defaults: keep a week, small segments, few threads.
                "log.retention.hours=168",
                "log.segment.bytes=67108864",
                "num.network.threads=2",
                "num.io.threads=2",
                "num.recovery.threads.per.data.dir=1",
                "",
            ]
        )

    # --- lifecycle ---------------------------------------------------------------------

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = shutil.which("java", path=f"{java_home}/bin") if java_home else shutil.which("java")
        if not java:
            raise BrokerError("java is not on PATH: Kafka needs Java 17 (run `make setup`)")
        return java

    def _classpath(self) -> str:
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"no Kafka jars in {self.jars}: run `make setup` (mvn -P kafka ...)")
        return f"{self.jars}/*"

    def _jvm(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [
            self._java(),
            "-Xms128m",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_file.parent}",
            "-cp",
            self._classpath(),
            main,
            *args,
        ]

    def _write_config(self) -> Path:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        (self.home / "log4j2.properties").write_text(_LOG4J2.format(log=self.log_file, level=self.log_level))
        conf = self.home / "server.properties"
        conf.write_text(self.properties())
        return conf

    def _format_storage(self, conf: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = self.cluster_id or new_cluster_id()
        proc = subprocess.run(
            # `--cluster-id=`: an id can start with "-", which argparse would take for an option.
            self._jvm("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(conf)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise BrokerError(f"formatting {self.data_dir} failed:\n{proc.stdout}{proc.stderr}")

    def pid(self) -> int | None:
        """The broker's pid if our broker process is alive (a stale pid file is ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"kafka.Kafka" in cmdline and str(self.home).encode() in cmdline else None

    def start(self, timeout: float = 90.0) -> int:
        """Start the broker unless it runs; return its pid once it answers requests."""
        running = self.pid()
        if running:
            self.wait_ready(timeout)
            return running
        conf = self._write_config()
        self._format_storage(conf)
        out = open(self.home / "logs" / "stdout.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            self._jvm("kafka.Kafka", str(conf), heap=self.heap),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the command that started it
        )
        out.close()
        self.pid_file.write_text(str(proc.pid))
        try:
            self.wait_ready(timeout, proc)
        except BrokerError:
            self.stop()
            raise
        return proc.pid

    def wait_ready(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 0: "connection refused" is expected while the broker boots.
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise BrokerError(f"the broker exited with {proc.returncode}; see {self.log_file}:\n{self._tail()}")
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as exc:  # KafkaException until the listener is up
                last = exc
                time.sleep(0.5)
        raise BrokerError(f"the broker did not answer on {self.bootstrap} within {timeout:.0f}s ({last})")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully (SIGTERM: Kafka flushes and closes its logs); False if not running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        pid = self.pid()
        topics = None
        if pid:
            from confluent_kafka.admin import AdminClient

            try:
                md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=3)
                topics = len([t for t in md.topics if not t.startswith("__")])
            except Exception:
                topics = None
        return BrokerStatus(pid is not None, pid, self.bootstrap, self.data_dir, topics)

    def _tail(self, lines: int = 30) -> str:
        for f in (self.home / "logs" / "stdout.log", self.log_file):
            if f.exists():
                return "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
        return ""


class KafkaCluster:
    """Three (``size``) combined broker+controller nodes in KRaft from the same jars, each a
    process with its own folder and ports: the production layout's Kafka. Topics get three
    copies and ``min.insync.replicas=2``, so one broker may go down without losing a write."""

    def __init__(self, home: Path, ports: list[tuple[int, int]], jars: Path | None = None, heap: str = "384m"):
        cluster_id_file = home / "cluster.id"
        home.mkdir(parents=True, exist_ok=True)
        try:  # exclusive: the layout's threads may build this at once, and all must agree
            with cluster_id_file.open("x") as fresh:
                fresh.write(new_cluster_id())
        except FileExistsError:
            pass
        cluster_id = cluster_id_file.read_text().strip()
        voters = tuple((n + 1, controller) for n, (_, controller) in enumerate(ports))
        self.brokers = [
            EmbeddedBroker(
                home=home / f"broker-{n + 1}",
                port=port,
                controller_port=controller,
                jars=jars or config.jars_dir("kafka"),
                heap=heap,
                node_id=n + 1,
                voters=voters,
                cluster_id=cluster_id,
                replication=min(3, len(ports)),
            )
            for n, (port, controller) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def start(self, timeout: float = 120.0) -> None:
        """Start every node (a quorum needs a majority before any of them answers)."""
        for b in self.brokers:
            if b.pid() is None:
                conf = b._write_config()
                b._format_storage(conf)
                out = open(b.home / "logs" / "stdout.log", "ab")  # noqa: SIM115 - owned by the child
                proc = subprocess.Popen(
                    b._jvm("kafka.Kafka", str(conf), heap=b.heap),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                out.close()
                b.pid_file.write_text(str(proc.pid))
        for b in self.brokers:
            b.wait_ready(timeout)
        self.wait_brokers(len(self.brokers), timeout)

    def wait_brokers(self, count: int, timeout: float) -> None:
        """Wait until ``count`` brokers are registered (topics then get every replica)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout
        while len(admin.list_topics(timeout=5).brokers) < count:
            if time.monotonic() > deadline:
                raise BrokerError(f"only {len(admin.list_topics(timeout=5).brokers)} of {count} brokers joined")
            time.sleep(0.5)

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()
