"""Sharded checkpoints received from elsewhere: a FIFO or a forged shape is
refused by name before tensorstore opens or allocates anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner
from subproc import run_python

import treeguard as tg
from treeguard._cli.main import main

FIFO = """
import os, sys
import jax.numpy as jnp
import treeguard as tg
from click.testing import CliRunner
from treeguard._cli.main import main

d = sys.argv[1]
tg.save_sharded(d, {"w": jnp.ones(4)})
data = next(e for e in os.listdir(d) if e.startswith("data-"))
os.mkfifo(os.path.join(d, data, "d", "pipe"))
try:
    tg.load_sharded(d, {"w": jnp.ones(4)})
except tg.FormatError as e:
    print("load:", str(e).splitlines()[0])
res = CliRunner().invoke(main, ["ckpt", "verify", d])
print("verify:", res.exit_code, res.stderr.splitlines()[0])
"""


def test_a_fifo_in_the_data_directory_is_refused_not_waited_on(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    proc = run_python(FIFO, str(d), timeout=120)  # a read that blocked would time out here
    assert proc.returncode == 0, proc.stderr
    data = next(e for e in os.listdir(d) if e.startswith("data-"))
    why = f"{d}: '{data}/d/pipe' is not a regular file but a FIFO; treeguard reads none of those"
    assert proc.stdout.splitlines() == [f"load: {why}", f"verify: 2 error: {why}"]


def _forge_shape(directory: Path, n: int) -> None:
    """The manifest claims ``f32[n]`` for ``['w']``, its shard covering it all."""
    path = directory / "treeguard.sharded.json"
    doc = json.loads(path.read_text())
    doc["arrays"][0]["shape"] = [n]
    doc["arrays"][0]["shards"][0]["index"] = [[0, n]]
    doc["spec"]["tree"]["children"][0][1]["shape"] = [n]
    path.write_text(json.dumps(doc))


def test_a_shape_claiming_far_more_than_the_files_hold_is_refused_first(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    tg.save_sharded(d, {"w": jnp.zeros(4)})
    n = 1 << 30  # 4 GiB of float32 in a directory of a few KiB
    _forge_shape(d, n)
    like = {"w": jax.ShapeDtypeStruct((n,), jnp.float32, sharding=jnp.zeros(1).sharding)}
    with pytest.raises(tg.FormatError) as info:
        tg.load_sharded(d, like)
    on_disk = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert str(info.value) == (
        f"{d}: {_FORGED.format(claimed=4 * n, on_disk=on_disk)}\n"
        "hint: get a fresh copy of the checkpoint"
    )
    res = CliRunner().invoke(main, ["ckpt", "verify", str(d)])
    assert res.exit_code == 2 and "the shapes are forged" in res.stderr


_FORGED = (
    "its arrays claim {claimed:,} bytes, its files hold {on_disk:,}; the data is truncated or "
    "the shapes are forged (treeguard writes sharded arrays uncompressed: every array byte is "
    "a stored byte)"
)

#: Writes ``DIR/honest`` (``{'w': f32[4]}``), ``DIR/bomb``: the same
#: manifest claiming ``f32[N]`` with every digest recomputed, over data that
#: orbax wrote zstd-compressed: N zeros in a few KiB, which is all a reader
#: that trusts the claim allocates, and ``DIR/chunk`` (below). Attackers'
#: files, built in a child so that this process never holds the arrays.
BUILD_BOMB = """
import json, os, shutil, sys
import blake3, jax.numpy as jnp, orbax.checkpoint as ocp
import treeguard as tg

out, n = sys.argv[1], int(sys.argv[2])
tg.save_sharded(os.path.join(out, "honest"), {"w": jnp.ones(4, jnp.float32)})
bomb = os.path.join(out, "bomb")
tg.save_sharded(bomb, {"w": jnp.ones(4, jnp.float32)})
path = os.path.join(bomb, "treeguard.sharded.json")
doc = json.load(open(path))
data = os.path.join(bomb, doc["data"])
shutil.rmtree(data)
handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=True)
with ocp.Checkpointer(handler) as c:
    c.save(data, args=ocp.args.PyTreeSave({"w": jnp.zeros((n,), jnp.float32)}))
h, zeros, left = blake3.blake3(), bytes(1 << 24), 4 * n
while left:
    h.update(zeros[: min(left, len(zeros))])
    left -= min(left, len(zeros))
doc["arrays"][0]["shape"] = [n]
doc["arrays"][0]["shards"][0]["index"] = [[0, n]]
doc["arrays"][0]["shards"][0]["blake3"] = h.hexdigest()
doc["spec"]["tree"]["children"][0][1]["shape"] = [n]
open(path, "w").write(json.dumps(doc))

# the chunk bomb: the manifest still claims 16 bytes, but the array's one
# chunk of n values, zstd-compressed, is decoded whole to read them
chunk = os.path.join(out, "chunk")
tg.save_sharded(chunk, {"w": jnp.ones(4, jnp.float32)})
data = os.path.join(chunk, json.load(open(os.path.join(chunk, "treeguard.sharded.json")))["data"])
import numpy as np, tensorstore as ts
arr = ts.open({
    "driver": "zarr3",
    "kvstore": {"driver": "ocdbt", "base": f"file://{data}/", "path": "w/"},
    "metadata": {
        "shape": [4], "data_type": "float32", "fill_value": 0.0,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [n]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": 1, "checksum": False}}],
    },
    "create": True, "delete_existing": True,
}).result()
arr[:4] = np.ones(4, np.float32)
"""

#: ``treeguard ckpt verify DIR`` in a fresh interpreter: its exit code, its
#: first line, then the child's own peak resident memory (KiB).
VERIFY_PEAK = """
import resource, sys
from click.testing import CliRunner
from treeguard._cli.main import main

res = CliRunner().invoke(main, ["ckpt", "verify", sys.argv[1]])
print(res.exit_code)
print((res.stderr or res.stdout).splitlines()[0])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _verify_peak(directory: Path) -> tuple[int, str, int]:
    proc = run_python(VERIFY_PEAK, str(directory), timeout=300)
    assert proc.returncode == 0, proc.stderr
    code, line, peak = proc.stdout.splitlines()[-3:]
    return int(code), line, int(peak) * 1024


def _bytes_under(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@pytest.mark.slow
def test_claim_bombs_are_refused_in_the_memory_of_an_honest_file(tmp_path: Path) -> None:
    # claim bombs: sharded checkpoints of a few KiB whose data holds a
    # compressed array, or a compressed chunk, so that a reader that trusts
    # them allocates what they claim (64 MiB each here, twice over on a read)
    n = 16 << 20
    built = run_python(BUILD_BOMB, str(tmp_path), str(n), timeout=300)
    assert built.returncode == 0, built.stderr
    code, line, honest_peak = _verify_peak(tmp_path / "honest")
    assert code == 0, line
    bomb, chunk = tmp_path / "bomb", tmp_path / "chunk"
    for where, why in [
        (bomb, _FORGED.format(claimed=4 * n, on_disk=_bytes_under(bomb))),
        (chunk, "array 'w': codec 'zstd': treeguard writes sharded arrays uncompressed"),
    ]:
        size = _bytes_under(where)
        assert size < 256 * 1024  # a few KiB on disk
        code, line, peak = _verify_peak(where)
        assert code == 2 and line.startswith(f"error: {where}: {why}"), line
        # refused before tensorstore allocates: the memory of verifying an
        # honest file of the same tree, never the claim's
        assert peak <= honest_peak + 4 * size + (16 << 20), (where, peak, honest_peak, size)
        assert peak / honest_peak < 1.1, (where, peak, honest_peak)
    with pytest.raises(tg.FormatError, match="the shapes are forged"):
        tg.load_sharded(bomb, {"w": jax.ShapeDtypeStruct((n,), jnp.float32, sharding=_one())})


def _one() -> jax.sharding.Sharding:
    return jax.sharding.make_single_device_sharding(jax.devices()[0])


def test_a_link_or_a_deep_nest_in_the_data_directory_is_refused_by_name(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    tg.save_sharded(d, {"w": jnp.ones(4)})
    data = next(e for e in os.listdir(d) if e.startswith("data-"))
    link = d / data / "d" / "elsewhere"
    os.symlink(tmp_path, link)
    with pytest.raises(tg.FormatError) as info:
        tg.load_sharded(d, {"w": jnp.ones(4)})
    why = f"'{data}/d/elsewhere' is not a regular file but a symbolic link"
    assert str(info.value).startswith(f"{d}: {why}; treeguard reads none of those")
    link.unlink()
    deep = d / data / "d" / "/".join(["n"] * 65)
    deep.mkdir(parents=True)
    with pytest.raises(tg.FormatError, match="holds directories nested more than 64 deep"):
        tg.load_sharded(d, {"w": jnp.ones(4)})


#: Rewrites the stored array ``w`` of ``DIR`` (``{'w': f32[4]}``, written by
#: save_sharded) with tensorstore: shape ``SHAPE``, one chunk of ``CHUNK``
#: elements, the codecs named (``zstd`` compresses), its four values written
#: unless ``WRITE`` is 0. The manifest is left as it is: it claims 16 bytes.
REWRITE = """
import json, os, sys
import numpy as np, tensorstore as ts

d, shape, chunk, codecs, write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
data = os.path.join(d, json.load(open(os.path.join(d, "treeguard.sharded.json")))["data"])
named = {"bytes": {"name": "bytes", "configuration": {"endian": "little"}},
         "zstd": {"name": "zstd", "configuration": {"level": 1, "checksum": False}}}
spec = {
    "driver": "zarr3",
    "kvstore": {"driver": "ocdbt", "base": f"file://{data}/", "path": "w/"},
    "metadata": {
        "shape": [shape], "data_type": "float32", "fill_value": 0.0,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [named[c] for c in codecs.split(",")],
    },
    "create": True, "delete_existing": True,
}
arr = ts.open(spec).result()
if write == "1":
    arr[:4] = np.ones(4, np.float32)
"""


def _rewritten(tmp_path: Path, shape: int, chunk: int, codecs: str, write: bool) -> Path:
    d = tmp_path / "ck"
    tg.save_sharded(d, {"w": jnp.ones(4, jnp.float32)})
    proc = run_python(REWRITE, str(d), str(shape), str(chunk), codecs, "1" if write else "0")
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.mark.parametrize(
    ("shape", "chunk", "codecs", "write", "why"),
    [
        # a compressed chunk: decoded whole, to what it claims
        (4, 1 << 20, "bytes,zstd", True, "codec 'zstd': treeguard writes sharded arrays "
         "uncompressed, with bytes, crc32c, sharding_indexed only; a compressed chunk decodes "
         "to its claimed size whatever its stored size"),
        # a chunk beyond its array, never written: filled whole to read 16 bytes
        (4, 1 << 28, "bytes", False, "a chunk of shape [268435456] in an array of shape [4]: "
         "a chunk is decoded whole, so it may not reach beyond its array"),
    ],
    ids=["compressed-chunk", "chunk-beyond-array"],
)  # fmt: skip
def test_stored_array_metadata_claiming_what_the_files_cannot_hold_is_refused_first(
    tmp_path: Path, shape: int, chunk: int, codecs: str, write: bool, why: str
) -> None:
    d = _rewritten(tmp_path, shape, chunk, codecs, write)
    with pytest.raises(tg.FormatError) as info:
        tg.load_sharded(d, {"w": jnp.ones(4, jnp.float32)})
    assert str(info.value) == f"{d}: array 'w': {why}\nhint: get a fresh copy of the checkpoint"
    res = CliRunner().invoke(main, ["ckpt", "verify", str(d)])
    assert res.exit_code == 2 and why in " ".join(res.stderr.split())


def test_a_stored_array_larger_than_the_files_is_refused_first(tmp_path: Path) -> None:
    n = 1 << 28  # 1 GiB of float32, no chunk written: tensorstore would fill it
    d = _rewritten(tmp_path, n, 1 << 20, "bytes", False)
    with pytest.raises(tg.FormatError) as info:
        tg.load_sharded(d, {"w": jnp.ones(4, jnp.float32)})
    on_disk = _bytes_under(d)
    assert str(info.value) == (
        f"{d}: {_FORGED.format(claimed=4 * n, on_disk=on_disk)}\n"
        "hint: get a fresh copy of the checkpoint"
    )
