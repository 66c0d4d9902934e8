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
        f"{d}: its arrays claim {4 * n:,} bytes, its files hold {on_disk:,}; more than 1032x "
        "is a forged shape, not compression\nhint: get a fresh copy of the checkpoint"
    )
    res = CliRunner().invoke(main, ["ckpt", "verify", str(d)])
    assert res.exit_code == 2 and "is a forged shape, not compression" in res.stderr


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
