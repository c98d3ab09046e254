"""Spark Connect: a server started with pyspark's own sbin/start-connect-server.sh, and a
client (another process) that writes through lakesink before registering it (the server
found it by name), then registers it and writes and reads through it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from lakesink_testing import assert_readers_see, expected_rows

SPARK_HOME = Path(pyspark.__file__).parent
CHILD = Path(__file__).with_name("connect_child.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[int]:
    port = _free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOG_DIR": str(tmp_path / "logs"),
           "SPARK_PID_DIR": str(tmp_path / "pid"), "PYSPARK_PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--master", "local[2]",
         "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.session.timeZone=UTC"],
        env=env, check=True, capture_output=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):  # the script returns before the server listens
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-3000:] for p in (tmp_path / "logs").glob("*.out"))
                pytest.fail(f"Spark Connect server did not listen on {port} within 120 s:\n{logs}")
            time.sleep(0.5)  # polling a port, not standing in for synchronisation
        yield port
    finally:
        subprocess.run(["bash", str(SPARK_HOME / "sbin" / "stop-connect-server.sh")], env=env, capture_output=True)


def test_a_connect_client_writes_without_registering_then_registers_streams_and_reads(connect_server: int, tmp_path: Path, warehouse: str) -> None:
    result = subprocess.run(
        [sys.executable, str(CHILD), str(connect_server), warehouse, str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    expected = [{"id": i, "v": f"b{i}"} for i in range(5)] + [{"id": i, "v": f"s{i}"} for i in range(100, 103)]
    assert seen["read"] == sorted([r["id"], r["v"]] for r in expected)
    # A misspelt option reaches the client as lakesink's message, not a screen of frames.
    assert "did you mean 'primary_key'?" in seen["misspelt"]
    assert len(seen["misspelt"]) < 1000, seen["misspelt"]
    assert_readers_see(warehouse, "db.connect", expected_rows(expected, ["id", "v"]), ["id", "v"])
