"""Rebuild Spark's `python/lib/pyspark.zip` with bytecode beside every module.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path, and the
zip Spark ships holds sources only: each Python daemon Spark starts compiles the pyspark
modules it imports again (docs/performance.md, "Where a process starts"; a cost of every
Python data source and UDF, not of lakesink). The rebuilt zip holds the same sources plus a
`.pyc` beside each (`module.pyc`, the layout zipimport reads), compiled by the interpreter the
workers run; an interpreter of another version ignores them and compiles as before.

    python scripts/compile_pyspark_zip.py [SPARK_HOME]      (default: the pyspark installed here)

Run it with the workers' interpreter, on every host, after each Spark upgrade. The original
zip is kept beside it as pyspark.zip.orig (put it back to undo).
"""

from __future__ import annotations

import os
import py_compile
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path


def rebuild(spark_home: Path) -> Path:
    original = spark_home / "python" / "lib" / "pyspark.zip"
    backup = original.with_name("pyspark.zip.orig")
    if not backup.exists():
        shutil.copy2(original, backup)
    with tempfile.TemporaryDirectory() as work:
        source, rebuilt = Path(work) / "src", Path(work) / "pyspark.zip"
        with zipfile.ZipFile(backup) as z:
            z.extractall(source)
        with zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(source.rglob("*")):
                if path.is_dir():
                    continue
                name = path.relative_to(source).as_posix()
                out.write(path, name)
                if path.suffix == ".py":
                    try:
                        # Unchecked hash: zipimport then takes the .pyc without comparing
                        # timestamps, which a zip keeps only to two seconds.
                        pyc = py_compile.compile(str(path), cfile=str(path) + "c", doraise=True,
                                                 invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                    except py_compile.PyCompileError:
                        continue  # a module this Python cannot compile: left to the source
                    out.write(pyc, name + "c")
        shutil.move(str(rebuilt), original)
    return original


def main(argv: list[str]) -> int:
    if argv:
        spark_home = Path(argv[0])
    else:
        import pyspark

        spark_home = Path(os.path.dirname(pyspark.__file__))
    print(rebuild(spark_home))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
