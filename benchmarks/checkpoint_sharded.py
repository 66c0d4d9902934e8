"""Sharded checkpoints: treeguard's save_sharded/load_sharded against plain orbax.

A float32 tree (1 GiB in 16 leaves by default) sharded over a 2x4 mesh of 8
simulated CPU devices (the CPU backend's, also on a machine with an
accelerator, whose chips the children leave alone) is saved and restored by each tool, in a fresh
subprocess per tool and direction so that each peak-memory figure is that
operation's own. Times are the median of ``--repeats`` runs after one
warm-up, with ``block_until_ready`` on every restored array. Ratios are
against orbax measured in the same run, two ways:

* ``orbax default``: ``StandardCheckpointer`` as it comes (OCDBT, zstd);
* ``orbax same``: ``PyTreeCheckpointHandler`` with treeguard's settings
  (OCDBT, zarr3, uncompressed), so the ratio is the cost of the contract,
  the sha256 of every shard and the manifest alone.

The memory figure is the peak resident set of the operation above the
resident set just before it (the peak is reset before each run; the largest
of the timed runs is shown), compared with one shard's bytes. ``verify`` is
treeguard's digest check alone, on arrays orbax has already restored: its
peak is the memory that verification adds to a plain orbax restore.

``cpu`` is the process's CPU time (every thread) for the same runs. A
verified load hashes in threads while later arrays are still being read, so
where cores are idle its time approaches the larger of reading and hashing;
where they are not (a loaded machine), the time is bounded by the CPU work,
which the cpu ratio shows.

    .venv/bin/python benchmarks/checkpoint_sharded.py             # 1 GiB
    .venv/bin/python benchmarks/checkpoint_sharded.py --mib 256   # a quicker run
    .venv/bin/python benchmarks/checkpoint_sharded.py --overlap   # where a load's time goes

``--overlap`` runs three loads of one treeguard checkpoint interleaved in
one process: plain orbax restore, restore then hash every shard (the check
run after the read), and ``load_sharded`` (hashing beside the read), each
with its wall and CPU time against orbax's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

_HERE = os.path.abspath(__file__)
CASES = (
    ("save", "orbax default"),
    ("save", "orbax same"),
    ("save", "treeguard"),
    ("load", "orbax default"),
    ("load", "orbax same"),
    ("load", "treeguard"),
    ("load", "orbax same reshard"),
    ("load", "treeguard reshard"),
    ("verify", "treeguard"),
    ("verify", "treeguard reshard"),
)
#: The tool whose checkpoint each load reads.
SOURCE = {"orbax default": "default", "orbax same": "same", "orbax same reshard": "same"}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _hwm_kib() -> int:
    """The peak resident set since the last ``_reset_peak``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> int:
    """Resets the peak resident set to the current one (Linux ``clear_refs``
    5) and returns the current one."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib()


def _child(op: str, tool: str, mib: int, leaves: int, repeats: int, root: str) -> dict[str, Any]:
    """One tool, one direction, in this (fresh) process."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"  # the 8 devices are the host's, on an accelerator's too
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import treeguard

    mesh = jax.make_mesh((2, 4), ("x", "y"))
    n = mib * 1024 * 1024 // 4 // leaves
    rows = 1024
    shape = (rows, n // rows)
    sharding = NamedSharding(mesh, P("x", "y"))
    shard_bytes = shape[0] // 2 * (shape[1] // 4) * 4

    def tree() -> dict[str, jax.Array]:
        # Made on the devices, so that building it leaves no host peak behind.
        def leaf(i: int) -> jax.Array:
            def make() -> jax.Array:
                return jax.numpy.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) + i

            return jax.jit(make, out_shardings=sharding)()

        return {f"layer_{i:02d}": leaf(i) for i in range(leaves)}

    def abstract(s: Any) -> dict[str, Any]:
        return {
            f"layer_{i:02d}": jax.ShapeDtypeStruct(shape, np.float32, sharding=s)
            for i in range(leaves)
        }

    same = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False)
    source = os.path.join(root, "source-" + SOURCE.get(tool, "treeguard"))

    def save(t: Any, path: str) -> None:
        if tool == "orbax default" or (op == "prepare" and path.endswith("default")):
            with ocp.StandardCheckpointer() as c:
                c.save(path, t)
        elif tool == "orbax same" or (op == "prepare" and path.endswith("same")):
            with ocp.Checkpointer(same) as c:
                c.save(path, args=ocp.args.PyTreeSave(t))
        else:
            treeguard.save_sharded(path, t)

    def load() -> Any:
        if tool == "orbax default":
            with ocp.StandardCheckpointer() as c:
                return c.restore(source, abstract(sharding))
        if tool.startswith("orbax same"):
            reshard = tool.endswith("reshard")
            item = abstract(
                NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
                if reshard
                else sharding
            )
            args = ocp.checkpoint_utils.construct_restore_args(item)
            return same.restore(
                epath.Path(source), args=ocp.args.PyTreeRestore(item=item, restore_args=args)
            )
        if tool == "treeguard reshard":
            other = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
            return treeguard.load_sharded(source, abstract(other))
        return treeguard.load_sharded(source, abstract(sharding))

    times: list[float] = []
    cpus: list[float] = []
    if op == "prepare":
        save(tree(), source)
        return {}
    if op == "verify":  # the check alone, on arrays orbax restored
        from treeguard._src.sharded.digests import bad_shards
        from treeguard._src.sharded.manifest import read
        from treeguard._src.sharded.orbax_io import read_arrays

        manifest = read(source)
        other = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
        item = abstract(other if tool.endswith("reshard") else sharding)
        out = jax.block_until_ready(read_arrays(os.path.join(source, manifest.data), item))
        pairs = list(zip(manifest.arrays, jax.tree.leaves(out)))
    extras = []
    for k in range(repeats + 1):
        if op == "save":
            t = jax.block_until_ready(tree())
            path = os.path.join(root, f"{tool}-{k}".replace(" ", "_"))
        before = _reset_peak()
        cpu = time.process_time()
        start = time.perf_counter()
        if op == "save":
            save(t, path)
        elif op == "verify":
            assert bad_shards(pairs, manifest.hash) == []
        else:
            out = jax.block_until_ready(load())
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        extras.append(_hwm_kib() - before)
        if k:
            times.append(elapsed)
            cpus.append(cpu)
        if op == "save":
            del t
            shutil.rmtree(path)
        elif op == "load":
            del out
    extra = max(extras[1:]) * 1024
    return {
        "op": op,
        "tool": tool,
        "median_s": statistics.median(times),
        "times": times,
        "cpu_s": statistics.median(cpus),
        "peak_extra_bytes": extra,
        "shard_bytes": shard_bytes,
    }


def _overlap(mib: int, leaves: int, repeats: int, root: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"  # the 8 devices are the host's, on an accelerator's too
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import treeguard
    from treeguard._src.sharded.digests import bad_shards
    from treeguard._src.sharded.manifest import read
    from treeguard._src.sharded.orbax_io import read_arrays

    sharding = NamedSharding(jax.make_mesh((2, 4), ("x", "y")), P("x", "y"))
    n = mib * 1024 * 1024 // 4 // leaves
    shape = (1024, n // 1024)

    def make(i: int) -> jax.Array:
        def leaf() -> jax.Array:
            return jax.numpy.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) + i

        return jax.jit(leaf, out_shardings=sharding)()

    path = os.path.join(root, "ckpt")
    treeguard.save_sharded(path, {f"layer_{i:02d}": make(i) for i in range(leaves)})
    like = {
        f"layer_{i:02d}": jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding)
        for i in range(leaves)
    }
    manifest = read(path)
    data = os.path.join(path, manifest.data)

    def orbax() -> Any:
        return jax.block_until_ready(read_arrays(data, like))

    def after() -> Any:
        out = orbax()
        assert bad_shards(list(zip(manifest.arrays, jax.tree.leaves(out)))) == []
        return out

    def beside() -> Any:
        return jax.block_until_ready(treeguard.load_sharded(path, like))

    ways = {"orbax restore": orbax, "restore, then hash": after, "load_sharded": beside}
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for fn in ways.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in ways.items():
            c, t = time.process_time(), time.perf_counter()
            out = fn()
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            del out
    base_w = statistics.median(wall["orbax restore"])
    base_c = statistics.median(cpu["orbax restore"])
    print(
        f"{mib} MiB in {leaves} float32 leaves on a 2x4 mesh of 8 CPU devices, "
        f"interleaved, median of {repeats}; {os.cpu_count()} cores"
    )
    for name in ways:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"  {name:<20}{w:8.3f}s {w / base_w:6.2f}x   cpu {c:8.3f}s {c / base_c:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="total size of the tree")
    parser.add_argument("--leaves", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overlap", action="store_true", help="where a load's time goes")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(_child(a.child[0], a.child[1], a.mib, a.leaves, a.repeats, a.root)))
        return
    root = tempfile.mkdtemp(prefix="tg-sharded-bench-", dir=os.environ.get("TMPDIR"))
    if a.overlap:
        try:
            _overlap(a.mib, a.leaves, max(a.repeats, 5), root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        prepare = [("prepare", t) for t in ("orbax default", "orbax same", "treeguard")]
        for op, tool in [*prepare, *CASES]:
            cmd = [
                sys.executable,
                _HERE,
                "--mib",
                str(a.mib),
                "--leaves",
                str(a.leaves),
                "--repeats",
                str(a.repeats),
                "--root",
                root,
                "--child",
                op,
                tool,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
            if out.returncode:
                sys.exit(f"{op} {tool} failed:\n{out.stderr[-3000:]}")
            if op != "prepare":
                results[(op, tool)] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    shard = results[("save", "treeguard")]["shard_bytes"]
    print(
        f"{a.mib} MiB in {a.leaves} float32 leaves on a 2x4 mesh of 8 CPU devices; "
        f"one shard = {shard / 2**20:.1f} MiB; median of {a.repeats} after a warm-up"
    )
    print(
        f"{'':8}{'tool':<20}{'median':>9}{'vs orbax default':>18}{'vs orbax same':>15}"
        f"{'cpu':>9}{'peak extra':>13}{'in shards':>11}"
    )
    for op, tool in CASES:
        r = results[(op, tool)]
        base = "load" if op == "verify" else op
        base_d = results[(base, "orbax default")]["median_s"]
        base_s = results[(base, "orbax same")]["median_s"]
        print(
            f"{op:<8}{tool:<20}{r['median_s']:>8.3f}s{r['median_s'] / base_d:>17.2f}x"
            f"{r['median_s'] / base_s:>14.2f}x{r['cpu_s']:>8.3f}s"
            f"{r['peak_extra_bytes'] / 2**20:>10.1f} MiB"
            f"{r['peak_extra_bytes'] / shard:>10.2f}"
        )
    pairs = [
        ("save", "treeguard", "orbax same"),
        ("load", "treeguard", "orbax same"),
        ("load", "treeguard reshard", "orbax same reshard"),
    ]
    for op, tool, base in pairs:
        extra = results[(op, tool)]["peak_extra_bytes"] - results[(op, base)]["peak_extra_bytes"]
        ratio = results[(op, tool)]["median_s"] / results[(op, base)]["median_s"]
        cpu = results[(op, tool)]["cpu_s"] / results[(op, base)]["cpu_s"]
        # the k-th timed run of each, paired: the spread over the runs
        paired = [
            x / y
            for x, y in zip(results[(op, tool)]["times"], results[(op, base)]["times"], strict=True)
        ]
        goal = "  goal <= 1.3x: " + ("met" if ratio <= 1.3 else f"MISSED by {ratio / 1.3 - 1:.0%}")
        print(
            f"{op}: {tool} vs {base}: {ratio:.2f}x the time "
            f"[{min(paired):.2f}, {max(paired):.2f}], {cpu:.2f}x the CPU time, peak memory "
            f"{extra / 2**20:+.1f} MiB = {extra / shard:+.2f} shards"
            + (goal if op == "load" else "")
        )


if __name__ == "__main__":
    main()
