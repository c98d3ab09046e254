"""S3 requests per batch on a real S3 store: `python -m benchmarks requests`.

SeaweedFS (`weed mini`, scripts/start_seaweedfs.sh) counts every S3 request it serves
(`SeaweedFS_s3_request_total` by bucket, method and status on its metrics port). This runs
streaming-style batches through lakesink's production path (plan, one task, the Spark
writer's commit with maintenance after it, as a micro-batch does) against both deployments,
the REST catalog over a table bucket and pyiceberg's SQL catalog over a plain bucket, and
reports the requests per batch by method, for a 10K-row append and a 10K-row upsert into
100K rows, with what they would cost at 20 ms a request (a typical S3 round trip from a
cloud VM; a local SeaweedFS answers in well under 1 ms). Writes OBJECT-STORE.md and
object_store.json.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from benchmarks.harness import OUT_DIR, PROJECT_ROOT, log

MS_PER_REQUEST = 20
S3 = {"s3.endpoint": "http://127.0.0.1:8333", "s3.access-key-id": "admin", "s3.secret-access-key": "adminsecret",
      "s3.region": "us-east-1", "s3.path-style-access": "true"}
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType()), T.StructField("amount", T.DoubleType())])


def _options(setup: str, root: Path, namespace: str) -> dict[str, str]:
    s3 = {f"catalog.{k}": v for k, v in S3.items()}
    if setup == "rest":
        return {"catalog": "rest", "catalog.type": "rest", "catalog.uri": "http://127.0.0.1:8181", "catalog.warehouse": "warehouse",
                "catalog.credential": "admin:adminsecret", "catalog.oauth2-server-uri": "http://127.0.0.1:8181/v1/oauth/tokens", **s3}
    return {"catalog": "s3sql", "catalog.type": "sql", "catalog.uri": f"sqlite:///{root}/catalog.db",
            "catalog.warehouse": f"s3://plain/{namespace}", **s3}


def _requests() -> Counter:
    text = urllib.request.urlopen("http://127.0.0.1:9327/metrics", timeout=5).read().decode()
    out: Counter = Counter()
    for m in re.finditer(r'SeaweedFS_s3_request_total\{bucket="([^"]*)",code="(\d+)",type="(\w+)"\} (\d+)', text):
        out[m.group(3)] += int(m.group(4))
    return out


def _batch(options: dict[str, str], ids: range, batch_id: int) -> None:
    from lakesink_datasource.datasource import LakeSinkStreamWriter
    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write
    from lakesink_datasource.write.task import TaskIdentity, write_task

    plan = plan_write(parse_options(options), SCHEMA, False)
    rows = pa.record_batch({"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"n{i}" for i in ids]),
                            "amount": pa.array([i * 0.5 for i in ids])})
    # The stream writer's commit, as Spark's commit runner calls it: the driver's whole step.
    LakeSinkStreamWriter(plan).commit([write_task(plan, iter([rows]), who=TaskIdentity(batch_id=batch_id, query_id="bench"))], batch_id)


def _measure(options: dict[str, str], batches: int, rows: int, keyed_base: int) -> dict[str, Any]:
    per_batch: list[Counter] = []
    seconds = []
    for b in range(batches):
        ids = range(b * rows, (b + 1) * rows) if not keyed_base else range((b * 7919) % keyed_base, (b * 7919) % keyed_base + rows)
        before = _requests()
        started = time.perf_counter()
        _batch(options, ids, b + 1)
        seconds.append(time.perf_counter() - started)
        per_batch.append(_requests() - before)
    steady = per_batch[1:]  # the first batch of a fresh process opens its catalog and file system
    methods = sorted({m for c in steady for m in c})
    median = {m: statistics.median(c.get(m, 0) for c in steady) for m in methods}
    total = statistics.median(sum(c.values()) for c in steady)
    return {"requests_median": median, "total_median": total, "at_20ms_s": round(total * MS_PER_REQUEST / 1000, 2),
            "first_batch": dict(per_batch[0]), "seconds_median": round(statistics.median(seconds[1:]), 3)}


def run(batches: int, rows: int, out_dir: Path) -> dict[str, Any]:
    subprocess.run([str(PROJECT_ROOT / "scripts" / "start_seaweedfs.sh")], check=True, capture_output=True)
    root = Path("/tmp/lakesink-object-store-bench")
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"batches": batches, "rows": rows, "ms_per_request": MS_PER_REQUEST, "setups": {}}
    for setup in ("rest", "sql"):
        namespace = f"b{uuid.uuid4().hex[:8]}"
        base = {**_options(setup, root, namespace), "progress": "false"}
        keyed = {**base, "table": f"{namespace}.u", "operation": "upsert", "primary_key": "id", "index_dir": str(root / "index")}
        if setup == "rest":
            keyed["property.write.data.path"] = f"s3://warehouse/{namespace}/u/_data"
        log(f"{setup}: append")
        append = _measure({**base, "table": f"{namespace}.a"}, batches, rows, 0)
        log(f"{setup}: upsert (base of 100K rows)")
        _batch(keyed, range(100_000), 0)
        upsert = _measure(keyed, batches, rows, 100_000)
        results["setups"][setup] = {"append": append, "upsert": upsert}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "object_store.json").write_text(json.dumps(results, indent=2))
    (out_dir / "OBJECT-STORE.md").write_text(render(results))
    log(f"wrote {out_dir / 'OBJECT-STORE.md'}")
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "# S3 requests per batch (SeaweedFS)",
        "",
        f"`python -m benchmarks requests`: {results['batches']} batches of {results['rows']:,} rows per case through the "
        "production path (plan, one task, the commit and the maintenance after it); medians of the batches after the "
        f"first, from the store's own counters; the cost at {results['ms_per_request']} ms a request.",
        "",
        "| deployment | case | requests per batch | by method | at 20 ms a request | batch on the local store |",
        "|---|---|---|---|---|---|",
    ]
    for setup, cases in results["setups"].items():
        for case, r in cases.items():
            by = ", ".join(f"{m} {v:g}" for m, v in r["requests_median"].items())
            lines.append(f"| {setup} | {case} | {r['total_median']:g} | {by} | {r['at_20ms_s']:.2f} s | {r['seconds_median']:.3f} s |")
    return "\n".join(lines) + "\n"


def main_args(batches: int, rows: int, out: str | None) -> int:
    run(batches, rows, Path(out).resolve() if out else OUT_DIR)
    return 0
