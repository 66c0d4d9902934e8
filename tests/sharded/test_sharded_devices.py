"""Eight simulated devices in one subprocess: save on a 2x4 mesh, restore onto
4x2 and onto one device, bit-exact; a damaged shard is caught after a reshard."""

from __future__ import annotations

from pathlib import Path

import pytest
from subproc import run_python

EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}

SCRIPT = r"""
import logging, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import treeguard
sys.path.insert(0, sys.argv[2])
from shardtools import flip_byte

assert jax.device_count() == 8
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
log = logging.getLogger("treeguard.sharded")
log.setLevel(logging.INFO)
log.addHandler(Keep())

rng = np.random.default_rng(0)
host = {
    "dense1": {"w": rng.standard_normal((64, 64)).astype(np.float32),
               "b": rng.standard_normal(64).astype(jnp.bfloat16)},
    "embed": rng.integers(-100, 100, (16, 64)).astype(np.int8),
    "scale": np.float32(2.5),
}
save_mesh = jax.make_mesh((2, 4), ("x", "y"))
save_specs = {"dense1": {"w": P("x", "y"), "b": P("y")}, "embed": P(None, "x"), "scale": P()}
tree = jax.tree.map(lambda h, s: jax.device_put(h, NamedSharding(save_mesh, s)), host, save_specs)
d = sys.argv[1]
treeguard.save_sharded(d, tree, metadata={"mesh": "2x4"})

def check(out, sharding_of):
    for (path, a), h in zip(jax.tree_util.tree_flatten_with_path(out)[0], jax.tree.leaves(host)):
        assert a.sharding == sharding_of(path), (path, a.sharding)
        assert np.asarray(a).tobytes() == np.asarray(h).tobytes(), path

mesh = jax.make_mesh((4, 2), ("x", "y"))
specs = {"dense1": {"w": P("x", "y"), "b": P()}, "embed": P("x", "y"), "scale": P()}
shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
like = jax.tree.map(lambda h, s: jax.ShapeDtypeStruct(np.shape(h), np.asarray(h).dtype, sharding=s), host, shardings)
flat = dict(jax.tree_util.tree_flatten_with_path(shardings)[0])
check(treeguard.load_sharded(d, like), lambda p: flat[p])
assert any("['dense1']['w']: resharded from named(mesh[x=2:Explicit,y=4:Explicit], spec('x', 'y')) to named(mesh[x=4:Explicit,y=2:Explicit], spec('x', 'y'))" in r for r in records), records
one = jax.sharding.make_single_device_sharding(jax.devices()[3])
single = jax.tree.map(lambda h: jax.ShapeDtypeStruct(np.shape(h), np.asarray(h).dtype, sharding=one), host)
check(treeguard.load_sharded(d, single), lambda p: one)
print("RESTORED")
flip_byte(d, host["dense1"]["w"][40, 17:21].tobytes())
try:
    treeguard.load_sharded(d, like)
except treeguard.IntegrityError as e:
    print("INTEGRITY", e.path)
"""


@pytest.mark.slow
def test_eight_devices_reshard_bit_exact(tmp_path: Path) -> None:
    res = run_python(
        SCRIPT, str(tmp_path / "ckpt"), str(Path(__file__).parent), env=EIGHT, timeout=180
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "RESTORED" in res.stdout
    assert "INTEGRITY ['dense1']['w']" in res.stdout, res.stdout + res.stderr[-2000:]
