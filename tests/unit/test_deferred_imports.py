"""pyarrow.dataset, imported at its first use once lakesink is imported: a scan still finds
every name, threads touching it at once get one module, and later imports get the real one."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, threading
import lakesink_datasource
import pyarrow.dataset as ds
assert "pandas" not in sys.modules, "the stand-in imported pandas"
import pyiceberg.io.pyarrow
assert "pandas" not in sys.modules, "pyiceberg's module imported pandas"
found = []
threads = [threading.Thread(target=lambda: found.append(ds.ParquetFileFormat)) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
import pyarrow, pyarrow.dataset
real = sys.modules["pyarrow.dataset"]
assert type(real).__name__ == "module" and pyarrow.dataset is real
assert len(set(found)) == 1 and found[0] is real.ParquetFileFormat
from pyarrow.dataset import dataset
import pyarrow as pa
assert dataset(pa.table({"x": [1, 2]})).to_table().num_rows == 2
print("ok")
"""


def test_pyarrow_dataset_is_imported_at_first_use_once_for_all_threads() -> None:
    run = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
