"""The production layout on one machine: every server a separate process, as on separate hosts.

``sluice cluster up`` (``make cluster``) starts, under ``$SLUICE_HOME/cluster``:

- PostgreSQL (Debian's): Airflow's metadata database and Sluice's shared run-state store;
- Redis (Debian's): the Celery executor's broker;
- Kafka: three combined broker+controller nodes in KRaft, topics with three copies and
  ``min.insync.replicas=2``;
- Spark standalone: a master and two workers;
- S3Proxy: the object store for tables and checkpoints (``s3a://sluice/...``);
- Airflow: API server, scheduler, DAG processor and triggerer, and two Celery workers that
  act as two hosts (``worker-1``, ``worker-2``: their own hostname and local folder).

What each process is and where it listens is written to ``layout.json``, so ``status`` and
``down`` work from any later command. That file is this machine's, as the layout is: on
real hosts each server is run by its own service manager, and Sluice only connects to them
(:meth:`Layout.env` is what every host's environment needs).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from sluice import config
from sluice.dev.broker import KafkaCluster
from sluice.dev.objectstore import S3Server
from sluice.dev.ports import free_port
from sluice.dev.postgres import PostgresServer
from sluice.errors import SluiceError

BUCKET = "sluice"
#: The simulated hosts that run Airflow's Celery workers (and the drivers they start).
WORKER_HOSTS = ("worker-1", "worker-2")


@dataclass
class Service:
    """One server process of the layout."""

    name: str
    pid: int
    started: float  # psutil's create_time, so a reused pid is not taken for it
    address: str = ""

    def process(self) -> psutil.Process | None:
        try:
            proc = psutil.Process(self.pid)
            return proc if abs(proc.create_time() - self.started) < 1 and proc.is_running() else None
        except psutil.Error:
            return None

    def rss(self) -> int:
        """Resident memory of the process and everything it started (bytes)."""
        proc = self.process()
        if proc is None:
            return 0
        total = 0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total


@dataclass
class Ports:
    postgres: int = field(default_factory=free_port)
    redis: int = field(default_factory=free_port)
    s3: int = field(default_factory=free_port)
    kafka: list[tuple[int, int]] = field(default_factory=lambda: [(free_port(), free_port()) for _ in range(3)])
    spark: int = field(default_factory=free_port)
    spark_ui: int = field(default_factory=free_port)
    airflow: int = field(default_factory=free_port)


#: Guards the layout's record: servers start from several threads.
_RECORD = threading.RLock()


@dataclass
class Layout:
    home: Path
    ports: Ports = field(default_factory=Ports)
    secrets: dict[str, str] = field(default_factory=dict)
    services: list[Service] = field(default_factory=list)

    # --- the record ----------------------------------------------------------------------

    @classmethod
    def load(cls, home: Path | None = None) -> Layout:
        home = home or config.sluice_home() / "cluster"
        record = home / "layout.json"
        if not record.exists():
            return cls(home)
        data = json.loads(record.read_text())
        ports = Ports(**{k: v for k, v in data["ports"].items() if k != "kafka"})
        ports.kafka = [(int(a), int(b)) for a, b in data["ports"]["kafka"]]
        return cls(home, ports, data["secrets"], [Service(**s) for s in data["services"]])

    @property
    def recorded(self) -> bool:
        """Whether a ``sluice cluster up`` recorded a layout in this home."""
        return (self.home / "layout.json").exists()

    def save(self) -> None:
        with _RECORD:
            self.home.mkdir(parents=True, exist_ok=True)
            record = self.home / "layout.json"
            record.write_text(
                json.dumps(
                    {
                        "ports": asdict(self.ports),
                        "secrets": self.secrets,
                        "services": [asdict(s) for s in self.services],
                    },
                    indent=2,
                )
            )
            record.chmod(0o600)  # it holds the layout's passwords

    def _secret(self, name: str) -> str:
        with _RECORD:
            return self.secrets.setdefault(name, secrets.token_urlsafe(24))

    def _add(self, name: str, pid: int, address: str = "") -> None:
        with _RECORD:  # servers start from several threads
            self.services = [s for s in self.services if s.name != name]
            self.services.append(Service(name, pid, psutil.Process(pid).create_time(), address))
            self.save()

    def service(self, name: str) -> Service | None:
        return next((s for s in self.services if s.name == name), None)

    # --- the pieces ----------------------------------------------------------------------

    @property
    def postgres(self) -> PostgresServer:
        return PostgresServer(self.home / "postgres", self.ports.postgres, "sluice", self._secret("postgres"))

    @property
    def s3(self) -> S3Server:
        return S3Server(self.home / "s3", self.ports.s3, "sluice", self._secret("s3"))

    @property
    def kafka(self) -> KafkaCluster:
        return KafkaCluster(self.home / "kafka", self.ports.kafka)

    @property
    def spark_master(self) -> str:
        return f"spark://127.0.0.1:{self.ports.spark}"

    def env(self) -> dict[str, str]:
        """What a host of this layout runs Sluice with: the brokers, the master, the shared
        run-state store and the object store (tables at ``s3a://sluice/``)."""
        pg = self.postgres
        return {
            "SLUICE_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "SLUICE_SPARK_MASTER": self.spark_master,
            "SLUICE_SPARK_MASTER_UI": f"http://127.0.0.1:{self.ports.spark_ui}",
            "SLUICE_STATE": pg.url("sluice_state"),
            "PGPASSFILE": str(pg.passfile),
            "SLUICE_STORE": f"s3a://{BUCKET}",
        } | self.s3.env()

    # --- up, status, down ----------------------------------------------------------------

    def up(self, say: object = print) -> None:
        """Start whatever of the layout is not running (each step is skipped when it is)."""
        tell: Callable[[str], object] = say if callable(say) else print
        self.home.mkdir(parents=True, exist_ok=True)
        self.save()
        if not self._alive("postgres"):
            tell("postgres: starting")
            pg = self.postgres.start()
            for db in ("sluice_state", "airflow"):
                if db not in pg.psql("postgres", "SELECT datname FROM pg_database"):
                    pg.create_database(db)
            self._add("postgres", int((pg.data / "postmaster.pid").read_text().split()[0]), pg.url())
        # The servers start at once: most of each start is waiting (a JVM loading, a worker
        # joining its master), and Airflow's migration needs only PostgreSQL.
        starts = [self._start_s3, self._start_kafka, self._start_spark, self._start_redis]
        with ThreadPoolExecutor(len(starts) + 1) as pool:
            done = [pool.submit(start, tell) for start in starts] + [pool.submit(self._migrate_airflow, tell)]
            for future in done:
                future.result()
        self._start_airflow(tell)
        self.save()

    def _start_s3(self, tell: Callable[[str], object]) -> None:
        if self._alive("s3"):
            return
        tell("s3: starting S3Proxy")
        s3 = self.s3.start()
        s3.create_bucket(BUCKET)
        assert s3.pid is not None
        self._add("s3", s3.pid, s3.endpoint)

    def _start_kafka(self, tell: Callable[[str], object]) -> None:
        if all(self._alive(f"kafka-{n + 1}") for n in range(3)):
            return
        tell("kafka: starting three brokers")
        kafka = self.kafka
        kafka.start()
        for n, broker in enumerate(kafka.brokers):
            pid = broker.pid()
            assert pid is not None
            self._add(f"kafka-{n + 1}", pid, broker.bootstrap)

    def _start_redis(self, tell: Callable[[str], object]) -> None:
        if self._alive("redis"):
            return
        tell("redis: starting")
        folder = self.home / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [which("redis-server", "redis-server"), "--port", str(self.ports.redis), "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        self._spawn("redis", cmd, dict(os.environ), folder, f"redis://127.0.0.1:{self.ports.redis}")
        _wait_port(self.ports.redis, "Redis", folder / "redis.log")

    # --- Airflow ----------------------------------------------------------------------

    def airflow_env(self, host: str | None = None) -> dict[str, str]:
        """Every Airflow process's environment; a Celery worker's also names its host and
        gives it a local folder of its own (``hosts/<host>``)."""
        from sluice.airflow.env import airflow_env

        pg = self.postgres
        database = f"postgresql+psycopg://{pg.user}@127.0.0.1:{pg.port}/airflow"  # password: PGPASSFILE
        env = airflow_env(master=self.spark_master, port=self.ports.airflow) | self.env()
        env |= {
            "AIRFLOW_HOME": str(self.home / "airflow"),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database,
            # psycopg 3 (already Sluice's driver) is async too: no asyncpg needed.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": database,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.ports.redis}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{database}",
            # Shared by the API server and every worker: tokens one signs, the others accept.
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__API__SECRET_KEY": self._secret("api"),
            "AIRFLOW__CORE__FERNET_KEY": self.secrets.setdefault(
                "fernet", base64.urlsafe_b64encode(os.urandom(32)).decode()
            ),
            # Task instances record the simulated host that ran them (SLUICE_HOSTNAME).
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "sluice.state.hostname",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "airflow" / "passwords.json"),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # A host that died mid-task: its task instances fail after a minute, not five, so
            # the next supervision (one run at a time per DAG) is not held up behind them.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            # Sluice's tasks are short (streams run detached); a task a dead worker had taken is
            # handed to another after an hour, not Celery's default day.
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "3600",
        }
        if host:
            env |= {"SLUICE_HOSTNAME": host, "SLUICE_HOME": str(self.home / "hosts" / host)}
        return env

    def _migrate_airflow(self, tell: Callable[[str], object]) -> None:
        folder = self.home / "airflow"
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / ".migrated").exists():
            return
        tell("airflow: migrating its database")
        env = os.environ | self.airflow_env()
        done = subprocess.run(
            [str(_airflow_binary()), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600
        )
        if done.returncode:
            raise SluiceError(f"airflow db migrate failed: {(done.stdout + done.stderr).strip()[-1500:]}")
        (folder / ".migrated").touch()

    def _start_airflow(self, tell: Callable[[str], object]) -> None:
        binary = str(_airflow_binary())
        folder = self.home / "airflow"
        env = os.environ | self.airflow_env()
        api = ["api-server", "--host", "127.0.0.1", "--port", str(self.ports.airflow)]
        for name, args in (
            ("airflow-api-server", api),
            ("airflow-scheduler", ["scheduler"]),
            ("airflow-dag-processor", ["dag-processor"]),
            ("airflow-triggerer", ["triggerer"]),
        ):
            if not self._alive(name):
                tell(f"{name}: starting")
                address = f"http://127.0.0.1:{self.ports.airflow}" if name == "airflow-api-server" else ""
                self._spawn(name, [binary, *args], env, folder, address)
        for host in WORKER_HOSTS:
            name = f"airflow-worker-{host.split('-')[-1]}"
            if self._alive(name):
                continue
            tell(f"{name}: starting (host {host})")
            home = self.home / "hosts" / host
            home.mkdir(parents=True, exist_ok=True)
            # Task logs go to the shared AIRFLOW_HOME/logs, which the API server reads (on real
            # hosts: remote logging), so the workers serve none themselves.
            args = ["celery", "worker", "--celery-hostname", host, "--concurrency", "2", "--skip-serve-logs"]
            args += ["--pid", str(home / "airflow-worker.pid")]
            self._spawn(name, [binary, *args], os.environ | self.airflow_env(host), folder, host)
        _wait_http(f"http://127.0.0.1:{self.ports.airflow}/api/v2/version", "Airflow's API server", folder)

    def _start_spark(self, tell: Callable[[str], object]) -> None:
        from sluice.runtime import spark_home

        workers = [n for n in (1, 2) if not self._alive(f"spark-worker-{n}")]
        if self._alive("spark-master") and not workers:
            return
        tell(
            "spark: starting "
            + ", ".join(["the master"] * (not self._alive("spark-master")) + [f"worker {n}" for n in workers])
        )
        logs = self.home / "spark"
        logs.mkdir(parents=True, exist_ok=True)
        spark_class = str(Path(spark_home()) / "bin" / "spark-class")
        env = os.environ | {"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1"} | self.s3.env()
        if not self._alive("spark-master"):
            master = ["--host", "127.0.0.1", "--port", str(self.ports.spark), "--webui-port", str(self.ports.spark_ui)]
            cmd = [spark_class, "org.apache.spark.deploy.master.Master", *master]
            # Each application (a stream, a validation, a backfill) gets one core unless it asks
            # for more, as on a shared cluster: otherwise the first stream takes every core and the
            # next job waits forever. Two workers of two cores run four applications at once.
            master_env = env | {"SPARK_MASTER_OPTS": "-Dspark.deploy.defaultCores=1"}
            self._spawn("spark-master", cmd, master_env, logs, f"{self.spark_master} (UI :{self.ports.spark_ui})")
        # A worker killed in a drill comes back on `up` while the master and its apps run on.
        for n in workers:
            work = self.home / f"spark-worker-{n}"
            worker = ["--cores", "2", "--memory", "2g", "--webui-port", str(free_port()), "--work-dir", str(work)]
            self._spawn(
                f"spark-worker-{n}",
                [spark_class, "org.apache.spark.deploy.worker.Worker", *worker, self.spark_master],
                env,
                logs,
            )
        deadline = time.monotonic() + 120
        while self.spark_workers() < 2:
            if time.monotonic() > deadline:
                raise SluiceError(f"the Spark workers did not join the master in 120 s: see {logs}")
            time.sleep(1)

    def spark_workers(self) -> int:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.spark_ui}/json/", timeout=5) as resp:
                return int(json.loads(resp.read()).get("aliveworkers", 0))
        except OSError:
            return 0

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str], logs: Path, address: str = "") -> int:
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self._add(name, proc.pid, address)
        return proc.pid

    def _alive(self, name: str) -> bool:
        found = self.service(name)
        return found is not None and found.process() is not None

    def status(self) -> list[tuple[Service, bool, int]]:
        """Each service, whether it runs, and its resident memory (bytes)."""
        return [(s, s.process() is not None, s.rss()) for s in self.services]

    def _host_drivers(self) -> list[tuple[str, psutil.Process]]:
        """Streams' drivers the layout's hosts started (detached from the workers that did)."""
        hosts = str(self.home / "hosts")
        services = {s.pid for s in self.services}
        found = []
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                ours = proc.pid not in services and env.get("SLUICE_HOME", "").startswith(hosts)
                if ours and os.getpgid(proc.pid) == proc.pid:  # a group leader: the driver, not its JVM
                    found.append((f"a driver of {env.get('SLUICE_HOSTNAME')} (pid {proc.pid})", proc))
            except (psutil.Error, ProcessLookupError):
                continue
        return found

    def down(self, say: object = print) -> None:
        """Stop every process of the layout (its data stays, for the next ``up``).

        In waves, each stopped at once: Airflow first, so no worker's supervision starts a
        driver while the drivers stop; then the drivers the hosts started; then the servers;
        PostgreSQL last. Stopping the Kafka brokers one by one would leave the last one
        without a controller quorum, waiting out its controlled shutdown until it is killed.
        """
        tell = say if callable(say) else print
        running = [(s.name, p) for s in reversed(self.services) if s.name != "postgres" and (p := s.process())]
        airflow = [(name, proc) for name, proc in running if name.startswith("airflow")]
        servers = [(name, proc) for name, proc in running if not name.startswith("airflow")]
        for wave in (lambda: airflow, self._host_drivers, lambda: servers):
            stopping = wave()
            if stopping:
                tell(f"stopping {', '.join(name for name, _ in stopping)}")
                _stop_groups([proc for _, proc in stopping])
        if self._alive("postgres"):
            tell("postgres: stopping")
            self.postgres.stop(remove=False)
        self.services = []
        self.save()


def _airflow_binary() -> Path:
    from sluice.airflow.env import airflow_binary

    return airflow_binary()


def _wait_port(port: int, what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SluiceError(f"{what} did not listen on port {port} in {timeout:.0f} s: see {log}") from None
            time.sleep(0.3)


def _wait_http(url: str, what: str, logs: Path, timeout: float = 240) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - a loopback http URL
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SluiceError(f"{what} did not answer {url} in {timeout:.0f} s: see {logs}") from None
            time.sleep(1)


def _stop_groups(procs: list[psutil.Process], timeout: float = 30.0) -> None:
    """SIGTERM each process's group (each leads one: started in a session of its own), then SIGKILL."""
    members = []
    for proc in procs:
        try:
            group = os.getpgid(proc.pid)
            members += [proc, *proc.children(recursive=True)]
            os.killpg(group, signal.SIGTERM)
        except (ProcessLookupError, psutil.Error):
            continue
    _, alive = psutil.wait_procs(members, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


def which(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if not found:
        raise SluiceError(f"{binary} is not installed: `make cluster-setup` installs {package} (apt-get)")
    return found
