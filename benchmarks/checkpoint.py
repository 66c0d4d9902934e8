"""Checkpoint save/load: treeguard against the raw floor and the usual tools.

One run writes a float32 tree (1 GiB in 64 leaves by default) with each tool
and reads it back, in a fresh subprocess per tool and direction so that each
peak-memory figure is that operation's own. Times are the median of
``--repeats`` runs; ratios are against the physical floor measured in the same
run: the same bytes written with ``write`` plus fsync, and read back with
``readinto`` into buffers allocated beforehand while BLAKE3 hashes them on
every core (what a verified load cannot avoid), and the file hashed by BLAKE3
on every core (the floor of ``ckpt verify``). Every load gives numpy
arrays, so like is compared with like. Reads hit the page cache unless
``--cold`` drops each file's pages first (``posix_fadvise(DONTNEED)``, this
file only). Each ratio is taken within one round (the tool and its baseline
back to back) and reported as the median over the rounds with its range.
The goals: treeguard's verified ``load(like=)`` at most 1.2x
``safetensors.numpy.load_file`` (which verifies nothing) and 1.3x the read
floor; its hashed, fsynced save at most 1.3x the write + fsync floor;
``treeguard ckpt verify`` at most 1.1x the hashing floor; ``import_weights``
of a safetensors file at most 2x ``load_file``.

``--device`` measures on the default device instead (a TPU or GPU), as users
there save and load: the tree saved is on the device, ``like`` is a tree on the
device, each load ends with ``block_until_ready``. The floor reads and hashes
as above, then ``jax.device_put``; safetensors is ``safetensors.flax``
(``save_file`` then fsync, ``load_file``); orbax restores onto the device.
The goals there: verified ``load(like=)`` at most 1.1x ``safetensors.flax``
and 1.0x orbax; ``save`` at most 1.2x ``safetensors.flax.save_file`` + fsync.

    .venv/bin/python benchmarks/checkpoint.py            # 1 GiB, 64 leaves
    .venv/bin/python benchmarks/checkpoint.py --mib 64   # a quick run
    python benchmarks/checkpoint.py --device --tools raw,treeguard,safetensors,orbax

orbax is timed when ``orbax.checkpoint`` imports (it is not a dependency:
``pip install orbax-checkpoint``, or put it on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TOOLS = ("raw", "treeguard", "safetensors", "npz", "orbax", "msgpack")
_HERE = os.path.abspath(__file__)


def _tree(total_mib: int, leaves: int) -> dict[str, np.ndarray]:
    n = total_mib * 1024 * 1024 // 4 // leaves
    side = int(np.sqrt(n))
    shape = (side, n // side)
    return {
        f"layer_{i:02d}": np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) + i
        for i in range(leaves)
    }


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(path: str) -> None:
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- each tool's save and load ----------------------------------------------


def _raw_save(path: str, tree: dict[str, np.ndarray]) -> None:
    with open(path, "wb", buffering=0) as f:
        for arr in tree.values():
            f.write(memoryview(arr).cast("B"))
        os.fsync(f.fileno())


def _raw_save_from_device(path: str, tree: dict[str, Any]) -> None:
    """The device floor of a save: each array copied to the host, written, fsync."""
    _raw_save(path, {k: np.asarray(v) for k, v in tree.items()})


def _raw_load(path: str, like: dict[str, np.ndarray]) -> Any:
    """The floor of a verified load: ``readinto`` buffers allocated (and touched)
    beforehand, from the page cache, then BLAKE3 hashes each on every core.
    Nothing is checked or built: only the bytes moved and hashed."""
    import blake3

    out = {}
    with open(path, "rb", buffering=0) as f:
        for k, arr in like.items():
            view = memoryview(arr).cast("B")
            f.readinto(view)
            blake3.blake3(view, max_threads=blake3.blake3.AUTO).digest()
            out[k] = arr
    return out


def _raw_load_device(path: str, like: dict[str, Any]) -> Any:
    """The device floor: as ``_raw_load`` into host buffers touched
    beforehand, then each array put on its device as soon as it is hashed."""
    import jax

    hosts = {k: np.zeros(v.shape, v.dtype) for k, v in like.items()}
    jax.block_until_ready(like)
    t0 = time.perf_counter()
    out = {k: jax.device_put(v, like[k].sharding) for k, v in _raw_load(path, hosts).items()}
    jax.block_until_ready(out)
    _timed_part.append(time.perf_counter() - t0)  # the host buffers are not timed
    return out


#: The seconds of a load that times only part of itself (the device floor).
_timed_part: list[float] = []


def _raw_verify(path: str) -> None:
    """The floor of ``ckpt verify``: the file's bytes hashed by BLAKE3 on every
    core, memory-mapped (as ``b3sum`` does)."""
    import blake3

    blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).digest()


def _tg_verify(path: str) -> None:
    """``treeguard ckpt verify PATH``, in process."""
    from click.testing import CliRunner

    from treeguard._cli.main import main

    res = CliRunner().invoke(main, ["ckpt", "verify", path])
    assert res.exit_code == 0, res.output


def _tg_import(path: str) -> None:
    """``import_weights`` of a safetensors file into a new checkpoint."""
    from treeguard import import_weights

    import_weights(path + ".st", path + ".imported", names="keypath")


def _tg_save(path: str, tree: dict[str, np.ndarray]) -> None:
    from treeguard import save

    save(path, tree)


def _tg_load(path: str, like: dict[str, np.ndarray]) -> Any:
    from treeguard import load

    return load(path, like=like)


def _st_save(path: str, tree: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    save_file(tree, path)


def _st_load(path: str, like: dict[str, np.ndarray]) -> Any:
    from safetensors.numpy import load_file

    return load_file(path)


def _npz_save(path: str, tree: dict[str, np.ndarray]) -> None:
    np.savez(path, **tree)  # type: ignore[arg-type]


def _npz_load(path: str, like: dict[str, np.ndarray]) -> Any:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _orbax_save(path: str, tree: dict[str, np.ndarray]) -> None:
    import orbax.checkpoint as ocp

    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, tree)
    ckptr.wait_until_finished()
    ckptr.close()


def _orbax_load(path: str, like: dict[str, np.ndarray]) -> Any:
    import orbax.checkpoint as ocp

    ckptr = ocp.StandardCheckpointer()
    out = ckptr.restore(path, like)
    ckptr.close()
    return out


def _st_flax_save(path: str, tree: dict[str, Any]) -> None:
    from safetensors.flax import save_file

    save_file(tree, path)
    _fsync_path(path)


def _st_flax_load(path: str, like: dict[str, Any]) -> Any:
    import jax
    from safetensors.flax import load_file

    return jax.block_until_ready(load_file(path))


def _tg_load_device(path: str, like: dict[str, Any]) -> Any:
    import jax

    from treeguard import load

    return jax.block_until_ready(load(path, like=like))


def _orbax_load_device(path: str, like: dict[str, Any]) -> Any:
    import jax
    import orbax.checkpoint as ocp

    ckptr = ocp.StandardCheckpointer()
    out = jax.block_until_ready(ckptr.restore(path, like))
    ckptr.close()
    return out


def _msgpack_save(path: str, tree: dict[str, np.ndarray]) -> None:
    from flax import serialization

    data = serialization.msgpack_serialize(tree)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _msgpack_load(path: str, like: dict[str, np.ndarray]) -> Any:
    from flax import serialization

    with open(path, "rb") as f:
        return serialization.msgpack_restore(f.read())


_OPS: dict[str, tuple[Callable[..., None], Callable[..., Any], str]] = {
    "raw": (_raw_save, _raw_load, "floor: write + fsync / readinto + BLAKE3 on all cores"),
    "treeguard": (_tg_save, _tg_load, "treeguard save / load(like=tree), hashed + fsync"),
    "safetensors": (_st_save, _st_load, "safetensors.numpy save_file / load_file"),
    "npz": (_npz_save, _npz_load, "np.savez / np.load"),
    "orbax": (_orbax_save, _orbax_load, "orbax StandardCheckpointer"),
    "msgpack": (_msgpack_save, _msgpack_load, "flax msgpack_serialize + fsync / restore"),
}


#: What ``--device`` times instead, by tool (a tool missing here is not timed there).
_DEVICE_OPS: dict[str, tuple[Callable[..., None], Callable[..., Any], str]] = {
    "raw": (_raw_save, _raw_load_device, "floor: write + fsync / readinto + BLAKE3 + device_put"),
    "treeguard": (_tg_save, _tg_load_device, "treeguard save / load(like=device tree), hashed"),
    "safetensors": (_st_flax_save, _st_flax_load, "safetensors.flax save_file + fsync / load_file"),
    "orbax": (_orbax_save, _orbax_load_device, "orbax StandardCheckpointer, onto the device"),
}


def _filename(tool: str) -> str:
    return {"npz": "ckpt.npz", "orbax": "ckpt.orbax", "msgpack": "ckpt.msgpack"}.get(
        tool, f"ckpt.{tool}.safetensors"
    )


#: The operations beyond save and load, by tool.
_MORE: dict[str, dict[str, Callable[[str], None]]] = {
    "raw": {"verify": _raw_verify},
    "treeguard": {"verify": _tg_verify, "import": _tg_import},
}


def _warm(tool: str) -> None:
    """Imports what the tool's timed calls use, so no import is timed."""
    import blake3  # noqa: F401
    import safetensors.numpy  # noqa: F401

    if tool == "treeguard":
        import treeguard
        from treeguard._cli.main import main  # noqa: F401

        for name in ("save", "load", "import_weights", "verify_file"):
            getattr(treeguard, name)


def worker(
    tool: str, op: str, path: str, mib: int, leaves: int, repeats: int, cold: bool, device: bool
) -> None:
    """Runs one tool's save or load in this process and prints a JSON line."""
    import jax

    jax.devices()  # start the backend before measuring
    _warm(tool)
    save_fn, load_fn, _ = (_DEVICE_OPS if device else _OPS)[tool]
    tree: dict[str, Any] = _tree(mib, leaves)
    if device and op == "save":
        if tool == "raw":  # the floor's bytes come from the device too
            save_fn = _raw_save_from_device
        tree = jax.block_until_ready({k: jax.device_put(v) for k, v in tree.items()})
    times: list[float] = []
    if op in ("verify", "import"):
        if op == "import":  # the source: a safetensors file of the same tree, not timed
            from safetensors.numpy import save_file

            save_file({f"['{k}']": v for k, v in tree.items()}, path + ".st")
        del tree
        for _ in range(repeats):
            if cold:
                _drop_cache(path + ".st" if op == "import" else path)
            t0 = time.perf_counter()
            _MORE[tool][op](path)
            times.append(time.perf_counter() - t0)
        for extra_file in (path + ".st", path + ".imported"):
            if os.path.exists(extra_file):
                os.unlink(extra_file)
        print(json.dumps({"tool": tool, "op": op, "times": times, "extra_kib": 0}))
        return
    if op == "save":
        base = _rss_kib()
        for _ in range(repeats):
            # Every tool starts from no file and a clean page cache: deleting the
            # last run's file and writing back dirty pages are not timed.
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
            os.sync()
            t0 = time.perf_counter()
            save_fn(path, tree)
            times.append(time.perf_counter() - t0)
        extra = _peak_kib() - base
    else:
        like: dict[str, Any] = {k: np.empty(0, v.dtype) for k, v in tree.items()}
        if device:  # on the device: no host memory taken before the load
            like = {k: jax.numpy.zeros(v.shape, v.dtype) for k, v in tree.items()}
            jax.block_until_ready(like)
        elif tool in ("raw", "treeguard", "orbax"):
            like = {k: np.zeros_like(v) for k, v in tree.items()}
        ref = tree
        del tree
        base = _rss_kib()
        peaks = []
        for _ in range(repeats):
            if cold:
                _drop_cache(path)
            _timed_part.clear()
            t0 = time.perf_counter()
            out = load_fn(path, like)
            took = time.perf_counter() - t0
            times.append(_timed_part[0] if _timed_part else took)
            peaks.append(_peak_kib())
            for k in ref:
                assert np.array_equal(np.asarray(out[k]), ref[k]), (tool, k)
            del out
        extra = max(peaks) - base - mib * 1024  # the result itself is not extra
    print(json.dumps({"tool": tool, "op": op, "times": times, "extra_kib": extra}))


def _run_worker(tool: str, op: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        _HERE,
        "--worker",
        tool,
        op,
        path,
        "--mib",
        str(args.mib),
        "--leaves",
        str(args.leaves),
        "--repeats",
        str(args.repeats),
    ] + [flag for flag, on in (("--cold", args.cold), ("--device", args.device)) if on]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(os.path.dirname(_HERE)), os.environ.get("PYTHONPATH", "")]
        ),
    }
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{tool} {op} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _more(tool: str, args: argparse.Namespace) -> dict[str, Callable[[str], None]]:
    """The operations timed beyond save and load (none on a device: they read
    files into host memory alone)."""
    return {} if args.device else _MORE.get(tool, {})


def _orbax_available() -> bool:
    res = subprocess.run(
        [sys.executable, "-c", "import orbax.checkpoint"], capture_output=True, check=False
    )
    return res.returncode == 0


def _inspect_times(path: str) -> dict[str, float]:
    """Header-only reads of the treeguard file: ``read_header`` and the CLI."""
    from click.testing import CliRunner

    from treeguard import read_header, verify_file
    from treeguard._cli.ckpt import ckpt

    read_header(path)
    t_header = []
    for _ in range(30):
        t0 = time.perf_counter()
        read_header(path)
        t_header.append(time.perf_counter() - t0)
    runner = CliRunner()
    t_cli = []
    for _ in range(10):
        t0 = time.perf_counter()
        res = runner.invoke(ckpt, ["inspect", path])
        t_cli.append(time.perf_counter() - t0)
        assert res.exit_code == 0, res.output
    t0 = time.perf_counter()
    verify_file(path)
    t_verify = time.perf_counter() - t0
    return {
        "read_header": statistics.median(t_header),
        "ckpt inspect (in process)": statistics.median(t_cli),
        "ckpt verify (all hashes)": t_verify,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mib", type=int, default=1024, help="total size of the tree in MiB")
    p.add_argument("--leaves", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (a temp dir by default)")
    p.add_argument("--cold", action="store_true", help="drop each file's cached pages before reads")
    p.add_argument("--device", action="store_true", help="save and load trees on the device")
    p.add_argument("--tools", default=None, help=f"comma-separated, of {','.join(TOOLS)}")
    p.add_argument("--worker", nargs=3, metavar=("TOOL", "OP", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        tool, op, path = args.worker
        worker(tool, op, path, args.mib, args.leaves, args.repeats, args.cold, args.device)
        return
    known = _DEVICE_OPS if args.device else _OPS
    tools = [t for t in (args.tools or ",".join(t for t in TOOLS if t in known)).split(",") if t]
    unknown = [t for t in tools if t not in known]
    if unknown:
        p.error(f"not timed{' with --device' if args.device else ''}: {', '.join(unknown)}")
    if "orbax" in tools and not _orbax_available():
        print("orbax.checkpoint does not import: skipping orbax")
        tools.remove("orbax")
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(prefix="tg-bench-", dir=args.dir)
    results: dict[str, dict[str, dict[str, Any]]] = {
        t: {op: {"times": [], "extra_kib": 0} for op in ("save", "load", *_more(t, args))}
        for t in tools
    }
    inspect: dict[str, float] = {}
    one = argparse.Namespace(**{**vars(args), "repeats": 1})
    try:
        # Rounds interleave the tools, so a burst of load from elsewhere on the
        # machine lands on all of them alike rather than on one.
        for _ in range(args.repeats):
            for tool in tools:
                path = os.path.join(root, _filename(tool))
                for op in ("save", "load", *_more(tool, args)):
                    r = _run_worker(tool, op, path, one)
                    results[tool][op]["times"] += r["times"]
                    results[tool][op]["extra_kib"] = max(
                        results[tool][op]["extra_kib"], r["extra_kib"]
                    )
                if tool == "treeguard" and not inspect:
                    inspect = _inspect_times(path)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.exists(path):
                    os.unlink(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _report(results, inspect, args)
    print(
        "load average (1 min) before and after the run: "
        f"{load_before[0]:.2f}, {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )


#: The goals: name, treeguard's op, the other tool, its op, the goal.
_GOALS = [
    ("load(like=), every hash / safetensors load_file", "load", "safetensors", "load", 1.2),
    ("load(like=), every hash / readinto + BLAKE3 floor", "load", "raw", "load", 1.3),
    ("save, hashed + fsync / write + fsync floor", "save", "raw", "save", 1.3),
    ("ckpt verify / BLAKE3 hashing floor", "verify", "raw", "verify", 1.1),
    ("import_weights(safetensors) / load_file", "import", "safetensors", "load", 2.0),
]
#: The goals on a device (``--device``): name, treeguard's op, the other tool, its op, the goal.
_DEVICE_GOALS = [
    ("load(like=device tree) / safetensors.flax load_file", "load", "safetensors", "load", 1.1),
    ("load(like=device tree) / orbax restore", "load", "orbax", "load", 1.0),
    ("load(like=device tree) / readinto+BLAKE3+device_put", "load", "raw", "load", 1.3),
    ("save, hashed + fsync / safetensors.flax + fsync", "save", "safetensors", "save", 1.2),
    ("save, hashed + fsync / write + fsync floor", "save", "raw", "save", 1.3),
]


def _report(
    results: dict[str, dict[str, dict[str, Any]]],
    inspect: dict[str, float],
    args: argparse.Namespace,
) -> None:
    import jax

    ops = _DEVICE_OPS if args.device else _OPS
    base = results.get("raw") or next(iter(results.values()))
    floor = {op: statistics.median(base[op]["times"]) for op in ("save", "load")}
    gib = args.mib / 1024
    where = f"on {jax.devices()[0].device_kind}" if args.device else "into host memory"
    print(
        f"\n{args.mib} MiB float32 in {args.leaves} leaves {where}, median of {args.repeats}, "
        f"{'cold' if args.cold else 'page-cache'} reads, {os.cpu_count()} CPUs, "
        f"jax {jax.__version__}"
    )
    print(
        f"{'tool':<56} {'save s':>7} {'x floor':>7} {'load s':>7} {'x floor':>7} "
        f"{'save +MiB':>9} {'load +MiB':>9}"
    )
    for tool, r in results.items():
        s = statistics.median(r["save"]["times"])
        ld = statistics.median(r["load"]["times"])
        print(
            f"{ops[tool][2]:<56} {s:7.2f} {s / floor['save']:7.2f} {ld:7.2f} "
            f"{ld / floor['load']:7.2f} {r['save']['extra_kib'] / 1024:9.0f} "
            f"{r['load']['extra_kib'] / 1024:9.0f}"
        )
    print(
        f"(throughput of the floor: save {gib / floor['save']:.2f} GiB/s, "
        f"load {gib / floor['load']:.2f} GiB/s)"
    )
    for k, v in inspect.items():
        print(f"{k:<30} {v * 1000:8.1f} ms")
    if "treeguard" in results:
        print(
            f"\nratios, each taken within one round: median [min, max] over {args.repeats} rounds"
        )
        tg = results["treeguard"]
        goals = _DEVICE_GOALS if args.device else _GOALS
        for name, op, other, base_op, goal in goals:
            if other not in results or op not in tg:
                continue
            ratios = [
                a / b
                for a, b in zip(tg[op]["times"], results[other][base_op]["times"], strict=True)
            ]
            mid = statistics.median(ratios)
            verdict = "met" if mid <= goal else f"MISSED by {mid / goal - 1:.0%}"
            print(
                f"{name:<52} {mid:5.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]  "
                f"goal <= {goal}x: {verdict}"
            )


if __name__ == "__main__":
    main()
