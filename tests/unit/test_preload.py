"""`lakesink-python` (lakesink_datasource/preload.py): what it runs and what it imports.

A daemon invocation is tested through a real stream (tests/integration/test_exactly_once.py);
here: anything else it is asked to run goes to the interpreter unchanged, without lakesink,
and each worker module's preload list names modules that exist (a renamed module would
otherwise only show as a slower batch)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lakesink_datasource.preload import MODULES_FOR_WORKER

LAKESINK_PYTHON = Path(sysconfig.get_path("scripts")) / "lakesink-python"


def test_anything_but_a_daemon_runs_in_the_plain_interpreter_without_lakesink(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import json, sys\nprint(json.dumps([sys.argv[1:], sorted(m for m in sys.modules if m.startswith('lakesink'))]))\n")
    ran = subprocess.run([str(LAKESINK_PYTHON), str(script), "a", "b c"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [["a", "b c"], []]
    code = subprocess.run([str(LAKESINK_PYTHON), "-c", "import sys; sys.exit(7)"], capture_output=True, timeout=120)
    assert code.returncode == 7


@pytest.mark.parametrize("worker_module", sorted(MODULES_FOR_WORKER))
def test_each_worker_module_s_preload_imports_what_it_names(worker_module: str) -> None:
    assert importlib.util.find_spec(worker_module) is not None, f"PySpark has no {worker_module}: Spark never asks for it"
    code = (
        "import json, sys\nfrom lakesink_datasource.preload import preload\n"
        f"names = preload({worker_module!r})\n"
        "print(json.dumps([n for n in names if n.startswith('lakesink') and n not in sys.modules]))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == []
    assert MODULES_FOR_WORKER[worker_module], "a worker module with nothing to preload need not be listed"


def test_a_daemon_whose_preload_fails_still_starts(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon serves every Python job of the session: a lakesink that cannot import there
    leaves it to the workers (which then fail a lakesink write with lakesink's own error)."""
    from lakesink_datasource import preload

    def broken(_worker_module: str) -> list[str]:
        raise ImportError("pyiceberg 0.11 is installed; lakesink needs 0.12.0")

    started: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(preload, "preload", broken)
    monkeypatch.setattr(preload.runpy, "run_module", lambda name, **_: started.append((name, list(sys.argv))))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    preload.run_daemon(["pyspark.worker"])
    assert started == [("pyspark.daemon", ["pyspark.daemon", "pyspark.worker"])]
    assert "nothing preloaded for pyspark.worker" in capsys.readouterr().err
