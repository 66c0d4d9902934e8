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
  the digest of every shard and the manifest alone.

``reshard`` loads the checkpoint saved on the 2x4 mesh onto a 4x2 mesh,
``reshard 8`` onto the 8 devices in one dimension (rows split 8 ways).

The memory figure is the peak resident set of the operation above the
resident set just before it (the peak is reset before each run; the largest
of the timed runs is shown), compared with one shard's bytes.

``cpu`` is the process's CPU time (every thread) for the same runs.

    .venv/bin/python benchmarks/checkpoint_sharded.py             # 1 GiB
    .venv/bin/python benchmarks/checkpoint_sharded.py --mib 256   # a quicker run
    .venv/bin/python benchmarks/checkpoint_sharded.py --paired    # loads, side by side
    .venv/bin/python benchmarks/checkpoint_sharded.py --cold      # a fresh process's load

``--cold`` times the first load of a fresh process (a job's restore at its
start), orbax's and treeguard's in turn, onto each target mesh.

``--paired`` runs the loads in one process, interleaved: in each round, for
each target mesh (the same 2x4, 4x2, 8 in 1-D), a plain orbax restore onto
it and ``load_sharded`` onto it, back to back (their order alternating from
round to round); each ratio is taken within its round, and the median, the
lowest and the highest round are shown, with the CPU time ratio.
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
    ("load", "orbax same reshard 8"),
    ("load", "treeguard reshard 8"),
)
#: The tool whose checkpoint each load reads.
SOURCE = {
    "orbax default": "default",
    "orbax same": "same",
    "orbax same reshard": "same",
    "orbax same reshard 8": "same",
}
#: The mesh shape, axis names and partition of each target, by its name's end.
TARGETS = {"": ((2, 4), ("x", "y")), "reshard": ((4, 2), ("x", "y")), "reshard 8": ((8,), ("x",))}


def _target_of(tool: str) -> str:
    return next(t for t in ("reshard 8", "reshard", "") if tool.endswith(t))


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

    def target() -> NamedSharding:
        shape, names = TARGETS[_target_of(tool)]
        return NamedSharding(jax.make_mesh(shape, names), P(*names))

    def load() -> Any:
        if tool == "orbax default":
            with ocp.StandardCheckpointer() as c:
                return c.restore(source, abstract(sharding))
        item = abstract(target())
        if tool.startswith("orbax same"):
            args = ocp.checkpoint_utils.construct_restore_args(item)
            return same.restore(
                epath.Path(source), args=ocp.args.PyTreeRestore(item=item, restore_args=args)
            )
        return treeguard.load_sharded(source, item)

    times: list[float] = []
    cpus: list[float] = []
    if op == "prepare":
        save(tree(), source)
        return {}
    if op == "first":  # the first load of a fresh process, as a job's restore at start
        jax.block_until_ready(jax.jit(lambda: jax.numpy.zeros((8, 8)), out_shardings=sharding)())
        assert callable(treeguard.load_sharded)  # imported, as orbax's handler is
        start = time.perf_counter()
        jax.block_until_ready(load())
        return {"s": time.perf_counter() - start}
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


def _paired(mib: int, leaves: int, repeats: int, root: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"  # the 8 devices are the host's, on an accelerator's too
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import treeguard

    sharding = NamedSharding(jax.make_mesh((2, 4), ("x", "y")), P("x", "y"))
    n = mib * 1024 * 1024 // 4 // leaves
    shape = (1024, n // 1024)

    def make(i: int) -> jax.Array:
        def leaf() -> jax.Array:
            return jax.numpy.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) + i

        return jax.jit(leaf, out_shardings=sharding)()

    path = os.path.join(root, "ckpt")
    saved = {f"layer_{i:02d}": make(i) for i in range(leaves)}
    treeguard.save_sharded(path, saved)
    data = (
        epath.Path(path)
        / json.loads((epath.Path(path) / "treeguard.sharded.json").read_text())["data"]
    )
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False)

    def like(name: str) -> dict[str, Any]:
        mesh_shape, names = TARGETS[name]
        s = NamedSharding(jax.make_mesh(mesh_shape, names), P(*names))
        return {
            f"layer_{i:02d}": jax.ShapeDtypeStruct(shape, np.float32, sharding=s)
            for i in range(leaves)
        }

    def orbax(item: Any) -> Any:
        args = ocp.checkpoint_utils.construct_restore_args(item)
        restore = ocp.args.PyTreeRestore(item=item, restore_args=args)
        return jax.block_until_ready(handler.restore(data, args=restore))

    def ours(item: Any) -> Any:
        return jax.block_until_ready(treeguard.load_sharded(path, item))

    names = {"": "2x4 (same)", "reshard": "4x2", "reshard 8": "8 in 1-D"}
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for name in TARGETS:  # warm-up, and every byte checked once
        item = like(name)
        for got, want in zip(jax.tree.leaves(ours(item)), jax.tree.leaves(saved)):
            assert np.array_equal(np.asarray(got), np.asarray(want)), name
        orbax(item)
    for r in range(repeats):
        for name in TARGETS:
            item = like(name)
            ways = [("orbax", orbax), ("treeguard", ours)]
            for tool, fn in ways if r % 2 == 0 else ways[::-1]:
                c, t = time.process_time(), time.perf_counter()
                out = fn(item)
                wall.setdefault((name, tool), []).append(time.perf_counter() - t)
                cpu.setdefault((name, tool), []).append(time.process_time() - c)
                del out
    print(
        f"{mib} MiB in {leaves} float32 leaves saved on a 2x4 mesh of 8 CPU devices; "
        f"{repeats} rounds after a warm-up; {os.cpu_count()} cores; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        f"{'onto':<12}{'orbax':>9}{'treeguard':>11}{'ratio median [min, max]':>27}{'cpu ratio':>11}"
    )
    for name in TARGETS:
        o, t = wall[(name, "orbax")], wall[(name, "treeguard")]
        ratios = [b / a for a, b in zip(o, t, strict=True)]
        c = statistics.median(cpu[(name, "treeguard")]) / statistics.median(cpu[(name, "orbax")])
        print(
            f"{names[name]:<12}{statistics.median(o):>8.3f}s{statistics.median(t):>10.3f}s"
            f"{statistics.median(ratios):>12.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
            f"{c:>10.2f}x"
        )


def _run_child(a: argparse.Namespace, root: str, op: str, tool: str) -> dict[str, Any]:
    cmd = [sys.executable, _HERE, "--mib", str(a.mib), "--leaves", str(a.leaves)]
    cmd += ["--repeats", str(a.repeats), "--root", root, "--child", op, tool]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if out.returncode:
        sys.exit(f"{op} {tool} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _cold(a: argparse.Namespace, root: str) -> None:
    """The first load of a fresh process, orbax's and treeguard's in turn."""
    for tool in ("orbax same", "treeguard"):
        _run_child(a, root, "prepare", tool)
    names = {"": "2x4 (same)", "reshard": "4x2", "reshard 8": "8 in 1-D"}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(a.repeats):
        for target in TARGETS:
            pair = [f"orbax same {target}".strip(), f"treeguard {target}".strip()]
            for tool in pair if r % 2 == 0 else pair[::-1]:
                got = _run_child(a, root, "first", tool)["s"]
                times.setdefault((target, tool.split()[0]), []).append(got)
    print(
        f"{a.mib} MiB in {a.leaves} float32 leaves saved on a 2x4 mesh of 8 CPU devices; "
        f"the first load of a fresh process, {a.repeats} rounds; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"{'onto':<12}{'orbax':>9}{'treeguard':>11}{'ratio median [min, max]':>27}")
    for target in TARGETS:
        o, t = times[(target, "orbax")], times[(target, "treeguard")]
        ratios = [y / x for x, y in zip(o, t, strict=True)]
        print(
            f"{names[target]:<12}{statistics.median(o):>8.3f}s{statistics.median(t):>10.3f}s"
            f"{statistics.median(ratios):>12.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="total size of the tree")
    parser.add_argument("--leaves", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paired", action="store_true", help="loads side by side, one process")
    parser.add_argument("--cold", action="store_true", help="first loads of fresh processes")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(_child(a.child[0], a.child[1], a.mib, a.leaves, a.repeats, a.root)))
        return
    root = tempfile.mkdtemp(prefix="tg-sharded-bench-", dir=os.environ.get("TMPDIR"))
    if a.paired:
        try:
            _paired(a.mib, a.leaves, max(a.repeats, 5), root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    if a.cold:
        try:
            _cold(a, root)
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
        base = op
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
        ("load", "treeguard reshard 8", "orbax same reshard 8"),
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
        bound = 1.0 if "reshard" in tool else 1.3
        goal = f"  goal <= {bound}x: " + (
            "met" if ratio <= bound else f"MISSED by {ratio / bound - 1:.0%}"
        )
        print(
            f"{op}: {tool} vs {base}: {ratio:.2f}x the time "
            f"[{min(paired):.2f}, {max(paired):.2f}], {cpu:.2f}x the CPU time, peak memory "
            f"{extra / 2**20:+.1f} MiB = {extra / shard:+.2f} shards"
            + (goal if op == "load" else "")
        )


if __name__ == "__main__":
    main()
