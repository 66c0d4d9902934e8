"""Writes the sha256 fixtures with whichever treeguard is first on ``sys.path``."""

import os
import shutil
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # after XLA_FLAGS
import numpy as np

import treeguard

FIXTURES = ("checkpoint.safetensors", "store", "signed-store", "sharded")


def main(out: str) -> None:
    for name in FIXTURES:
        target = os.path.join(out, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)
    params = {
        "dense1": {
            "w": np.arange(24, dtype=np.float32).reshape(4, 6) / 7,
            "b": np.zeros(6, np.float32),
        },
        "dense2": {
            "w": (np.arange(12, dtype=np.float32).reshape(6, 2) - 5).astype(jax.numpy.bfloat16),
            "b": np.ones(2, np.int8),
        },
        "step": np.int64(7),
    }
    treeguard.save(os.path.join(out, "checkpoint.safetensors"), params, metadata={"step": 7})
    store = treeguard.ArtifactStore(os.path.join(out, "store"))
    v1 = store.put(params, metadata={"step": 7})
    store.verify(v1)
    store.promote(v1)
    key = "legacy-fixture-key-0123456789abcdef"
    signed = treeguard.ArtifactStore(os.path.join(out, "signed-store"), key=key)
    s1 = signed.put(params, metadata={"step": 7})
    signed.verify(s1)
    signed.promote(s1)
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    spec = jax.sharding.PartitionSpec
    tiled = jax.sharding.NamedSharding(mesh, spec("x", "y"))
    replicated = jax.sharding.NamedSharding(mesh, spec())
    tree = {
        "w": jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), tiled),
        "b": jax.device_put(np.ones(4, np.float32), replicated),
    }
    treeguard.save_sharded(os.path.join(out, "sharded"), tree, metadata={"step": 7})


if __name__ == "__main__":
    main(sys.argv[1])
