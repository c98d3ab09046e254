"""An S3 region for S3-compatible stores, so no process asks AWS where a bucket lives.

pyiceberg's PyArrowFileIO resolves a bucket's region through AWS (`pyarrow.fs.
resolve_s3_region`, an HTTP request to AWS's endpoint) whenever `s3.region` is not set, even
with an explicit `s3.endpoint`. Off AWS (MinIO, SeaweedFS, Ceph, a private network) that
request times out: measured ~6 s, once per process, on the first file a fresh Spark Python
worker or commit process opened (issue 28: "the first commit of a fresh process on REST took
about 5 s"). S3-compatible stores take any region in the signature and expect us-east-1
by default, so with an explicit endpoint and no region lakesink says us-east-1. A regional AWS
endpoint needs its region given (`catalog.s3.region`), as it always did.
"""

from __future__ import annotations

from collections.abc import MutableMapping

DEFAULT_REGION = "us-east-1"
_REGION_KEYS = ("s3.region", "client.region")


def settle_s3_region(properties: MutableMapping[str, str]) -> None:
    """Give `properties` (a catalog's or a FileIO's) an S3 region when they name an endpoint
    and no region, unless region resolution was asked for explicitly."""
    if properties.get("s3.endpoint") and not any(properties.get(k) for k in _REGION_KEYS) and "s3.resolve-region" not in properties:
        properties["s3.region"] = DEFAULT_REGION
