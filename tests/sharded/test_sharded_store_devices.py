"""Sharded store versions on eight simulated devices, in a subprocess: put on
a 2x4 mesh, verify, promote, load the current version onto 4x2 bit-exact; a
flipped chunk byte after promote is refused naming the array and rolled
past. And a put killed at random moments never harms the current version."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from subproc import run_python, start_python, stop

EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import treeguard
sys.path.insert(0, sys.argv[2])
from shardtools import flip_byte

assert jax.device_count() == 8
rng = np.random.default_rng(0)
def host(scale):
    return {
        "dense1": {"w": (rng.standard_normal((64, 64)) * scale).astype(np.float32),
                   "b": rng.standard_normal(64).astype(jnp.bfloat16)},
        "embed": rng.integers(-100, 100, (16, 64)).astype(np.int8),
    }
save_mesh = jax.make_mesh((2, 4), ("x", "y"))
save_specs = {"dense1": {"w": P("x", "y"), "b": P("y")}, "embed": P(None, "x")}
def placed(h):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(save_mesh, s)), h, save_specs)
mesh = jax.make_mesh((4, 2), ("x", "y"))
specs = {"dense1": {"w": P("x", "y"), "b": P()}, "embed": P("x", "y")}
def like(h):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)), h, specs)

store = treeguard.ArtifactStore(sys.argv[1])
h1, h2 = host(1.0), host(2.0)
v1 = store.put_sharded(placed(h1), metadata={"mesh": "2x4"})
assert store.verify(v1).status == "verified"          # whole, in this process
store.promote(v1)
v2 = store.put_sharded(placed(h2))
assert store.verify(v2, like=like(h2)).status == "verified"   # onto the 4x2 mesh
store.promote(v2)
out = store.load_current(like(h2))
for a, h in zip(jax.tree.leaves(out), jax.tree.leaves(h2)):
    assert a.sharding.mesh.shape == mesh.shape, a.sharding
    assert np.asarray(a).tobytes() == np.asarray(h).tobytes()
print("BIT-EXACT")
flip_byte(store.info(v2).path, h2["dense1"]["w"][40, 17:21].tobytes())
try:
    store.load_current(like(h2))
except treeguard.IntegrityError as e:
    print("INTEGRITY", e.version, e.path)
print("ROLLBACK", store.rollback())
out = store.load_current(like(h1))
assert all(np.asarray(a).tobytes() == np.asarray(h).tobytes() for a, h in zip(jax.tree.leaves(out), jax.tree.leaves(h1)))
print("LOADED", store.current())
"""


@pytest.mark.slow
def test_eight_devices_put_promote_reshard_and_a_flipped_byte(tmp_path: Path) -> None:
    res = run_python(
        SCRIPT, str(tmp_path / "store"), str(Path(__file__).parent), env=EIGHT, timeout=240
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "BIT-EXACT" in res.stdout
    assert "INTEGRITY v000002 ['dense1']['w']" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "ROLLBACK v000001" in res.stdout and "LOADED v000001" in res.stdout


WRITER = r"""
import sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import treeguard
mesh = jax.make_mesh((2, 4), ("x", "y"))
tree = {f"l{i}": jax.device_put(jnp.full((256, 1024), float(i)), NamedSharding(mesh, P("x", "y")))
        for i in range(8)}
store = treeguard.ArtifactStore(sys.argv[1])
print("READY", flush=True)
while True:
    store.put_sharded(tree)
"""

CHECK = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import treeguard
store = treeguard.ArtifactStore(sys.argv[1])
one = jax.sharding.make_single_device_sharding(jax.devices()[0])
like = {f"l{i}": jax.ShapeDtypeStruct((256, 1024), jnp.float32, sharding=one) for i in range(8)}
out = store.load_current(like)
assert all(float(out[f"l{i}"][3, 5]) == float(i) for i in range(8))
for v in store.versions():
    assert v.status in ("candidate", "writing", "verified"), (v.version, v.status, v.reason)
    if v.status == "candidate":
        assert store.verify(v.version).status == "verified", v.version
print("REMOVED", len(store.gc(policy=treeguard.RetentionPolicy(keep_last=1))))
assert not [v.version for v in store.versions() if v.status == "writing"]
import os
left = os.listdir(os.path.join(sys.argv[1], "versions"))
assert sorted(left) == sorted(v.version for v in store.versions()), left
print("CURRENT", store.current())
"""

FIRST = r"""
import sys
import jax, jax.numpy as jnp
import treeguard
tree = {f"l{i}": jnp.full((256, 1024), float(i)) for i in range(8)}
store = treeguard.ArtifactStore(sys.argv[1])
v = store.put_sharded(tree)
store.verify(v)
store.promote(v)
"""


@pytest.mark.reliability
def test_a_killed_sharded_put_leaves_the_current_version_loadable(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    res = run_python(FIRST, root, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rng = random.Random(7)
    for _ in range(4):
        proc = start_python(WRITER, root, env=EIGHT)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.05, 2.0))
        proc.kill()
        stop(proc)
        res = run_python(CHECK, root, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "CURRENT v000001" in res.stdout
