"""A Spark standalone cluster on this machine, started from the pyspark installation.

For the tests and benchmarks of the cluster deploy target: one master and ``workers``
workers, each a JVM of its own, as on real machines. Production clusters are started by
their own tooling (``docker/``, or the deployment's); Sluice only submits to them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from sluice.dev.ports import free_port
from sluice.runtime import spark_home


class StandaloneCluster:
    def __init__(self, logs: Path, workers: int = 1, cores: int = 2, memory: str = "2g") -> None:
        self.logs, self.workers, self.cores, self.memory = logs, workers, cores, memory
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 120) -> str:
        """Start the master and the workers; the master's URL once every worker has joined."""
        self.logs.mkdir(parents=True, exist_ok=True)
        master = ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui)]
        self._spawn("master", ["org.apache.spark.deploy.master.Master", *master])
        for n in range(self.workers):
            worker = ["--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port())]
            self._spawn(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", *worker, self.url])
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline:
                self.stop()
                tail = "\n".join(p.read_text()[-1500:] for p in sorted(self.logs.glob("spark-*.log")))
                raise TimeoutError(f"the standalone cluster did not come up in {timeout:.0f}s:\n{tail}")
            time.sleep(1)
        return self.url

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as resp:
                return int(json.loads(resp.read()).get("aliveworkers", 0))
        except OSError:
            return 0  # the master is not listening yet

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            proc.wait(60)
        self._procs.clear()

    def _spawn(self, name: str, args: list[str]) -> None:
        spark_class = str(Path(spark_home()) / "bin" / "spark-class")
        env = os.environ | {"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1"}
        with (self.logs / f"spark-{name}.log").open("wb") as out:
            self._procs.append(
                subprocess.Popen(
                    [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
