"""One process of a two-process job (run by the multi-host tests, never
collected by pytest): ``python worker.py PID PORT DIR MODE``.

MODE ``suite``: save on a 2x2 mesh, restore onto another mesh bit-exact, a
renamed layer with the data directory gone, a flipped byte. MODE ``kill``:
save version 1, then version 2 while the test kills a process. MODE
``store``: sharded versions of an ``ArtifactStore``: put, verify onto
another mesh, promote in process 0, load the current version everywhere,
and a check that fails in one process only.
"""

from __future__ import annotations

import os
import sys

import jax

PID, PORT, DIR, MODE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    f"127.0.0.1:{PORT}", num_processes=2, process_id=PID, initialization_timeout=60
)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from shardtools import data_dir, flip_byte  # noqa: E402

import treeguard  # noqa: E402


def say(*words: object) -> None:
    print(*words, flush=True)


def host_tree(version: int, rows: int) -> dict[str, object]:
    rng = np.random.default_rng(version)
    return {
        "dense1": {
            "w": rng.standard_normal((rows, 64)).astype(np.float32),
            "b": rng.standard_normal(64).astype(np.float32),
        },
        "embed": rng.integers(-100, 100, (8, 64)).astype(np.int8),
    }


def place(host: dict[str, object], mesh: Mesh, specs: dict[str, object]) -> object:
    def one(h: np.ndarray, s: P) -> jax.Array:
        sharding = NamedSharding(mesh, s)
        return jax.make_array_from_callback(h.shape, sharding, lambda idx: h[idx])

    return jax.tree.map(one, host, specs)


def abstract(host: dict[str, object], mesh: Mesh, specs: dict[str, object]) -> object:
    return jax.tree.map(
        lambda h, s: jax.ShapeDtypeStruct(h.shape, h.dtype, sharding=NamedSharding(mesh, s)),
        host,
        specs,
    )


def bit_exact(out: object, host: dict[str, object]) -> bool:
    for a, h in zip(jax.tree.leaves(out), jax.tree.leaves(host)):
        for shard in a.addressable_shards:
            if np.asarray(shard.data).tobytes() != np.ascontiguousarray(h[shard.index]).tobytes():
                return False
    return True


assert jax.process_count() == 2 and jax.device_count() == 2 * jax.local_device_count()
SAVE_MESH = jax.make_mesh((2, jax.device_count() // 2), ("x", "y"))
SAVE_SPECS = {"dense1": {"w": P("x", "y"), "b": P("y")}, "embed": P(None, "x")}
OTHER_MESH = Mesh(np.array(jax.devices()[::-1]).reshape(-1, 1), ("x", "y"))
OTHER_SPECS = {"dense1": {"w": P(None, "x"), "b": P()}, "embed": P("x")}

if MODE == "suite":
    host = host_tree(1, 32)
    treeguard.save_sharded(DIR, place(host, SAVE_MESH, SAVE_SPECS), metadata={"version": 1})
    out = treeguard.load_sharded(DIR, abstract(host, OTHER_MESH, OTHER_SPECS))
    say("RESTORED", bit_exact(out, host))

    multihost_utils.sync_global_devices("hide data")
    data = data_dir(DIR)
    if PID == 0:
        os.rename(data, f"{data}.hidden")
    multihost_utils.sync_global_devices("hidden")
    renamed = abstract(host, OTHER_MESH, OTHER_SPECS)
    renamed["dense_1"] = renamed.pop("dense1")
    try:
        treeguard.load_sharded(DIR, renamed)
        say("MISMATCH none")
    except treeguard.TreeMismatchError as e:
        say("MISMATCH", str(e).splitlines()[1].strip())
    multihost_utils.sync_global_devices("checked")
    if PID == 0:
        os.rename(f"{data}.hidden", data)
        flip_byte(DIR, host["dense1"]["w"][3, 8:12].tobytes())
    multihost_utils.sync_global_devices("flipped")
    try:
        treeguard.load_sharded(DIR, abstract(host, OTHER_MESH, OTHER_SPECS))
        say("INTEGRITY none")
    except treeguard.IntegrityError as e:
        say("INTEGRITY", e.path)

    # rows split by process: each process needs, and reads, only the shards it wrote
    rows_dir = f"{DIR}-rows"
    treeguard.save_sharded(rows_dir, place(host, SAVE_MESH, SAVE_SPECS))
    rows = Mesh(np.array(jax.devices()), ("x",))
    w_only = abstract(host, rows, {"dense1": {"w": P("x"), "b": P()}, "embed": P()})
    say("ROWS", bit_exact(treeguard.load_sharded(rows_dir, w_only), host))
    multihost_utils.sync_global_devices("loaded rows")
    if PID == 0:  # cut the file holding process 0's rows of w where they start
        needle = host["dense1"]["w"][0, :32].tobytes()
        for path in sorted(p for p in data_dir(rows_dir).rglob("*") if p.is_file()):
            raw = path.read_bytes()
            at = raw.find(needle)
            if at >= 0:
                path.write_bytes(raw[:at])
                (path.parent / "cut-off").write_bytes(raw[at:])  # the bytes kept, unread
                break
    multihost_utils.sync_global_devices("cut")
    try:
        treeguard.load_sharded(rows_dir, w_only["dense1"]["w"], subtree="['dense1']['w']")
        say("CUT none")
    except treeguard.IntegrityError as e:
        say("CUT", e.path, str(e).splitlines()[0].split(": ", 1)[1])
elif MODE == "kill":
    rows = 1 << 15
    first = host_tree(1, rows)
    treeguard.save_sharded(DIR, place(first, SAVE_MESH, SAVE_SPECS), metadata={"version": 1})
    second = place(host_tree(2, rows), SAVE_MESH, SAVE_SPECS)
    multihost_utils.sync_global_devices("saving 2")
    say("SAVING2")
    treeguard.save_sharded(DIR, second, metadata={"version": 2})
    say("SAVED2")
elif MODE == "store":
    host = host_tree(1, 32)
    store = treeguard.ArtifactStore(DIR)
    v1 = store.put_sharded(place(host, SAVE_MESH, SAVE_SPECS), metadata={"step": 1})
    say("PUT", v1, store.info(v1).status, store.info(v1).kind)
    info = store.verify(v1, like=abstract(host, OTHER_MESH, OTHER_SPECS))
    say("VERIFIED", info.status)
    if PID == 0:
        store.promote(v1)
    multihost_utils.sync_global_devices("promoted")
    out = store.load_current(abstract(host, OTHER_MESH, OTHER_SPECS))
    say("CURRENT", store.current(), bit_exact(out, host))
    v2 = store.put_sharded(place(host_tree(2, 32), SAVE_MESH, SAVE_SPECS))
    info = store.verify(
        v2, like=abstract(host, OTHER_MESH, OTHER_SPECS), checks=[("first", lambda t: PID == 0)]
    )
    say("AGREED", v2, info.status, info.reason)
say("DONE")
