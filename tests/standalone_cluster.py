"""A real Spark standalone cluster from pyspark's own launcher (bin/spark-class): a master and
workers, each worker with a HOME of its own (so its own key index, like a machine of its
own). Shared by the cluster tests and `python -m benchmarks scale-out` and `shard-moves`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except (OSError, ValueError):  # not up yet, or a page that is not the JSON one
        return 0


class Cluster:
    """A standalone master and its workers, each worker with a HOME of its own (its own key
    index): started from pyspark's bin/spark-class."""

    def __init__(self, root: Path):
        self.root = root
        self.port, self.ui = _free_port(), _free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "LAKESINK_FAULTS")}
        self.env["PYSPARK_PYTHON"] = sys.executable
        self.env["SPARK_LOCAL_IP"] = "127.0.0.1"
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: list = []
        self.homes: list[Path] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str], home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (closed at teardown)
        self.logs.append(log)
        self.processes[name] = subprocess.Popen([SPARK_CLASS, *args], env={**self.env, "HOME": str(home)}, stdout=log, stderr=log, start_new_session=True)

    def start_master(self) -> None:
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui)], self.root / "master")

    def start_worker(self, memory: str = "1g", cores: int = 1) -> Path:
        """A worker with a new, empty HOME; waits until the master counts it alive."""
        i = len(self.homes)
        home = self.root / f"worker{i}"
        self.homes.append(home)
        alive = _alive_workers(self.ui)
        self._start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", self.master, "--cores", str(cores), "--memory", memory,
                                   "--webui-port", str(_free_port()), "--work-dir", str(home / "work")], home)
        self.wait_for_workers(alive + 1)
        return home

    def kill_worker(self, i: int) -> None:
        """SIGKILL a worker and its executor (a lost node)."""
        alive = _alive_workers(self.ui)
        os.killpg(self.processes[f"worker{i}"].pid, signal.SIGKILL)
        self.processes.pop(f"worker{i}").wait(timeout=30)
        self.wait_for_workers(alive - 1)

    def wait_for_workers(self, count: int) -> None:
        deadline = time.monotonic() + 120
        while _alive_workers(self.ui) != count:
            if time.monotonic() > deadline:
                raise RuntimeError("the standalone workers never registered: " + (self.root / "master.log").read_text()[-2000:])
            time.sleep(0.2)

    def stop(self) -> None:
        for p in self.processes.values():
            os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in self.logs:
            log.close()


