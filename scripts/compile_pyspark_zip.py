"""Rebuild Spark's `python/lib/pyspark.zip` with bytecode beside every module.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path, and the
zip Spark ships holds sources only: each Python daemon Spark starts compiles the pyspark
modules it imports again (docs/performance.md, "Where a process starts"; a cost of every
Python data source and UDF, not of lakesink). The rebuilt zip holds the same sources plus a
`.pyc` beside each (`module.pyc`, the layout zipimport reads), compiled by the interpreter the
workers run; an interpreter of another version ignores them and compiles as before.

    python scripts/compile_pyspark_zip.py [SPARK_HOME]      (default: the pyspark installed here)

Run it with the workers' interpreter, on every host, with no Spark application running (a
running daemon reads the zip it opened), and again after each Spark upgrade. Spark's own zip is
kept beside it as pyspark.zip.orig (put it back to undo); a zip Spark replaced since the last
run is recognised (the rebuilt one carries a marker entry) and becomes the new original.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

MARKER = "pyspark.zip.compiled"  # an entry the rebuilt zip carries, telling it from Spark's own


def rebuild(spark_home: Path) -> Path:
    zip_path = spark_home / "python" / "lib" / "pyspark.zip"
    backup = zip_path.with_name("pyspark.zip.orig")
    with zipfile.ZipFile(zip_path) as z:
        compiled = MARKER in z.namelist()
    if not compiled:
        # Spark's own zip (a first run, or a Spark upgrade since the last): it is the source,
        # and the backup an older one may have left must not be rebuilt in its place.
        shutil.copy2(zip_path, backup)
    elif not backup.exists():
        raise SystemExit(f"{zip_path} is already compiled and {backup} is gone: reinstall Spark's zip first")
    with tempfile.TemporaryDirectory(dir=zip_path.parent) as work:
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
                    pyc = _compiled(path, f"{zip_path}/{name}")
                    if pyc is not None:
                        out.write(pyc, name + "c")
            out.writestr(MARKER, f"compiled by Python {sys.version.split()[0]} from {backup.name}\n")
        os.replace(rebuilt, zip_path)  # same directory: the zip is swapped whole, never half-written
    return zip_path


def _compiled(path: Path, shown_as: str) -> str | None:
    """`path` compiled beside itself, or None for a module this Python cannot compile (left to
    its source)."""
    with warnings.catch_warnings():
        # Spark's own sources warn (invalid escapes, `is` with a literal): not the user's to
        # fix, and a worker compiling them from source warns the same.
        warnings.simplefilter("ignore", SyntaxWarning)
        try:
            # Unchecked hash: zipimport takes the .pyc without comparing timestamps, which a zip
            # keeps only to two seconds. dfile: tracebacks (and PySpark's own frame filtering)
            # name the module inside the zip, as from source.
            return py_compile.compile(str(path), cfile=str(path) + "c", dfile=shown_as, doraise=True,
                                      invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        except py_compile.PyCompileError:
            return None


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
