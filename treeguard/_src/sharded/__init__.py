"""Sharded and multi-host checkpoints: orbax and tensorstore carry the data,
treeguard's manifest carries the contract and a digest of every shard (BLAKE3,
or sha256 in older manifests).

``manifest`` (the JSON file and its strict parser), ``hosts`` (the few
collectives), ``digests`` (hashing at save), ``orbax_io`` (the one place
orbax and tensorstore are called), ``reader`` (a verified read onto any
mesh), ``runs`` (a saved shard read straight into the target shards it
overlaps, hashed there), ``save``, ``load``, ``recheck`` and ``inspect``. Importing this
package imports neither orbax nor tensorstore.
"""

from .manifest import is_sharded as is_sharded
from .manifest import sharded_digest as sharded_digest

__all__ = ["is_sharded", "sharded_digest"]
