"""A checkpoint header's cost: peak memory and time of ``read_header``.

The header of a single-file checkpoint is JSON. Parsed into Python objects
it costs several times its bytes (a dict, two lists and their ints per
tensor), and a hostile header costs more (an empty list is 56 bytes for the
3 of ``[],``). This writes one honest checkpoint of many tiny tensors and
headers that are hostile as JSON, each of about ``--hostile-mib``, then
reads each with ``treeguard.read_header`` in a fresh child process, which
reports its own peak resident memory (``VmHWM``; ``ru_maxrss`` would
start at the parent's) past what importing
treeguard and reading one small checkpoint already took, and the verdict.
``--time`` also times ``read_header`` of the honest file (the median of
``--repeats`` reads in one child, wall clock and CPU time; the CPU time
is the steadier where other work shares the cores).

Each ``--src`` is a checkout whose ``treeguard`` the children import, so one
run compares the code before a change with the code after it:

    .venv/bin/python benchmarks/header_memory.py --src ../main --src . --time
    .venv/bin/python benchmarks/header_memory.py --tensors 5000 --hostile-mib 3

The goal: at most 4x the header's bytes past the baseline (and a fixed
4 MiB), honest or not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve()
_ROOT = _HERE.parents[1]

#: The child: warm up on a small file, then read the one given; prints JSON.
_CHILD = """
import json, statistics, sys, time
import treeguard
small, path, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
treeguard.read_header(small)
def peak():  # this process's own high-water mark (ru_maxrss starts at the parent's)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
base = peak()
times, cpu = [], []
verdict = "read"
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time()
    try:
        treeguard.read_header(path)
    except treeguard.TreeguardError as e:
        verdict = type(e).__name__ + ": " + e.message[:70]
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"peak": peak() - base, "verdict": verdict,
                  "time": statistics.median(times), "cpu": statistics.median(cpu)}))
"""


def _honest(path: Path, tensors: int) -> None:
    """Many tiny tensors, four to a block, with names like a real model's."""
    parts = ("attention_query_kernel", "attention_query_bias", "mlp_up_kernel", "mlp_up_bias")
    tree: dict[str, dict[str, np.ndarray]] = {}
    for i in range(tensors):
        tree.setdefault(f"transformer_block_{i // 4:06d}", {})[parts[i % 4]] = np.zeros(
            1, np.float32
        )
    import treeguard

    treeguard.save(path, tree)


def _raw(path: Path, header: bytes) -> None:
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def _hostile(folder: Path, mib: int) -> dict[str, Path]:
    """Headers that are hostile as JSON, each of about ``mib`` MiB."""
    n = mib << 20
    cases = {
        "empty lists": b'{"x":[' + b"[]," * (n // 3) + b"[]]}",
        "empty objects": b'{"x":[' + b"{}," * (n // 3) + b"{}]}",
        "short keys": b"{" + b",".join(b'"%x":0' % i for i in range(n // 10)) + b"}",
        "floats": b'{"x":[' + b"0.5," * (n // 4) + b"0.5]}",
        "short strings": b'{"x":[' + b'"ab",' * (n // 5) + b'"ab"]}',
        "one long string": b'{"x":"' + b"a" * n + b'"}',
    }
    # built to sit just under the reader's budget (3 times the bytes in objects,
    # past 4 MiB): a table of the usual form whose records cost 2.95 times its
    # bytes, and JSON the scanner leaves to ``json.loads`` (a long string and
    # empty lists, 88 + 8 bytes of objects each by ``Shape.cost``)
    entry = b'"%020x":{"dtype":"F32","shape":[],"data_offsets":[0,0]}'
    cases["table under budget"] = b"{" + b",".join(entry % i for i in range(n // 73)) + b"}"
    lists = (57 << 20) // 93 * n // (30 << 20)
    cases["JSON under budget"] = (
        b'{"x":"' + b"a" * (n - 3 * lists) + b'","y":[' + b"[]," * lists + b"[]]}"
    )
    # another tool's table, its fields in another order (which was read as JSON)
    entry = b'"model.layers.%d.mlp.w":{"shape":[2,2],"dtype":"F32","data_offsets":[%d,%d]}'
    count = n // 75
    cases["another order"] = (
        b"{" + b",".join(entry % (i, 16 * i, 16 * i + 16) for i in range(count)) + b"}"
    )
    cases["forged spec under budget"] = _forged_spec(n)
    cases["forged JSON spec under budget"] = _forged_json_spec(n)
    cases["forged hashes under budget"] = _forged_hashes(n)
    out = {}
    for name, header in cases.items():
        out[name] = folder / (name.replace(" ", "_") + ".safetensors")
        _raw(out[name], header)
    return out


def _forged(spec: str, pad: int, hashes: str = "{}") -> bytes:
    """A treeguard header holding ``spec``, ``hashes`` and a metadata string
    of ``pad`` bytes, its digest recomputed as a forger would."""
    # the format's own encoder and digest: no public face writes a forged header
    from treeguard._src.checkpoint import format as ck

    meta = {
        "treeguard.format": ck.FORMAT,
        "treeguard.spec": spec,
        "treeguard.hash": "blake3",
        "treeguard.hashes": hashes,
        "treeguard.env": "{}",
        "treeguard.metadata": "{}",
        "pad": "a" * pad,
    }
    meta["treeguard.digest"] = ck.header_digest(meta, {})
    return ck.encode_header(meta, {})


def _forged_spec(n: int) -> bytes:
    """A forged header whose spec is of the form ``TreeSpec.to_json`` writes
    and whose records cost all but a MiB of what the shared budget (3 times
    the header past 4 MiB) leaves: a distinct leaf, of its own shape, per
    child (about 7 times its bytes as records), the rest of the header a
    metadata string."""
    from treeguard._src.specscan import scan

    leaf = '[["key", "{0:x}"], {{"dtype": "float32", "kind": "leaf", "shape": [{0}], ' + (
        '"weak_type": false}}]'
    )

    def spec(k: int) -> str:
        children = ", ".join(leaf.format(i) for i in range(k))
        tree = '{"children": [' + children + '], "kind": "dict"}'
        return f'{{"format": "treeguard.spec/1", "num_leaves": {k}, "tree": {tree}}}'

    def cost(k: int) -> int:
        return scan(spec(k), 1 << 40)[2]  # type: ignore[index]

    # held: the header's strings (n), then the records: 3 n + 4 MiB in all
    target, k = 2 * n + (3 << 20), 100_000
    for _ in range(3):
        k = int(k * target / cost(k))
    while scan(text := spec(k), target) is None:  # at its peak it holds more
        k = int(k * 0.98)
    return _forged(text, max(0, n - len(json.dumps(text))))


def _forged_json_spec(n: int) -> bytes:
    """A forged header whose spec is JSON of another form (no blanks), empty
    lists costing just under the half of what the shared budget leaves that
    such a spec is parsed in, the rest of the header a metadata string."""
    lists = ((n >> 1) + (1 << 20)) // 104
    return _forged('{"tree":[' + "[]," * lists + "[]]}", n - 3 * lists)


def _forged_hashes(n: int) -> bytes:
    """A forged header whose ``treeguard.hashes`` is empty lists costing just
    under what the budget leaves past a one-leaf spec."""
    lists = (2 * n + (3 << 20)) // 104
    spec = (
        '{"format": "treeguard.spec/1", "num_leaves": 0, "tree": {"children": [], "kind": "dict"}}'
    )
    return _forged(spec, n - 3 * lists, '{"x":[' + "[]," * lists + "[]]}")


def _measure(src: Path, small: Path, path: Path, repeats: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(small), str(path), str(repeats)],
        env=env,
        cwd=src,  # ``-c`` puts the working directory first on the path
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=50_000)
    parser.add_argument("--hostile-mib", type=int, default=30)
    parser.add_argument("--src", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--time", action="store_true", help="time the honest header too")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    srcs = [s.resolve() for s in (args.src or [_ROOT])]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small, honest = folder / "small.safetensors", folder / "honest.safetensors"
        _honest(small, 4)
        _honest(honest, args.tensors)
        files = {f"honest, {args.tensors:,} tensors": honest, **_hostile(folder, args.hostile_mib)}
        print(f"peak memory past the baseline, as a multiple of the header ({sys.platform})")
        for case, path in files.items():
            size = int.from_bytes(path.read_bytes()[:8], "little")
            print(f"\n{case}: header {size / 2**20:.1f} MiB")
            for src in srcs:
                r = _measure(src, small, path, 1)
                peak = float(r["peak"])  # type: ignore[arg-type]
                print(f"  {src!s:40} {peak / 2**20:7.1f} MiB {peak / size:5.1f}x  {r['verdict']}")
        if args.time:
            print(f"\nread_header of the honest header, median of {args.repeats}")
            for src in srcs:
                r = _measure(src, small, honest, args.repeats)
                wall, cpu = float(r["time"]), float(r["cpu"])  # type: ignore[arg-type]
                print(f"  {src!s:40} {wall:.3f} s wall, {cpu:.3f} s CPU")


if __name__ == "__main__":
    main()
