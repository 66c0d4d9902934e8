"""The bucket under a store, reached past it: what the bucket tests read,
write and forge behind the store's back."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from obstore.store import S3Store

from treeguard import ArtifactStore


def raw_store(url: str) -> S3Store:
    """A client of the bucket and prefix of the store at ``url``
    (``s3://BUCKET/PREFIX``) that bypasses the store, with conditional puts."""
    _, rest = url.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    return S3Store(bucket, prefix=prefix, config={"conditional_put": "etag"})


def sharded_version(store: ArtifactStore) -> tuple[str, Any, np.ndarray[Any, Any]]:
    """A sharded version of one array in 8 shard objects of 16 KiB
    (``0.0-4096``, ``0.4096-8192``, ...), the ``like`` to load it, and the array."""
    sharding = NamedSharding(jax.make_mesh((8,), ("x",), devices=jax.devices("cpu")[:8]), P("x"))
    w = np.arange(8 * 4096, dtype=np.float32)
    v = store.put_sharded({"w": jax.device_put(w, sharding)})
    return v, {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=sharding)}, w
