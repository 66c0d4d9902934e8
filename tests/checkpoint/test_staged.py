"""A load onto an accelerator reads through a few reused staging buffers:
a buffer is read into again only once the arrays placed from it are on
their devices, a batch larger than a buffer gets one of its own, and the
buffers go to the next load. On the CPU, where ``jax.device_put`` may alias
host memory, no load stages (each array keeps its own buffer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeguard as tg
from treeguard._src.checkpoint import staged  # _src: staging needs an accelerator

ACCELERATOR = jax.default_backend() != "cpu"


class _Slow:
    """Stands for arrays still on their way to a device: ready once waited for."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def block_until_ready(self) -> _Slow:
        self.log.append(f"waited {self.name}")
        return self


class _Failed:
    """Stands for arrays whose transfer failed: waiting for them raises."""

    def block_until_ready(self) -> None:
        raise RuntimeError("RESOURCE_EXHAUSTED: the transfer failed")


def _taken(n: int = 2, size: int = 64) -> Any:
    return lambda: [np.zeros(size, np.uint8) for _ in range(n)]


def test_a_buffer_is_reused_only_after_its_transfers_are_done() -> None:
    log: list[str] = []
    stage = staged.Staging(_taken(2))
    first = stage.buffer(10)
    stage.hold([_Slow(log, "a")])
    second = stage.buffer(10)
    stage.hold([_Slow(log, "b")])
    assert first is not second and log == []
    again = stage.buffer(10)  # the first buffer's turn: its arrays are waited for first
    assert again is first and log == ["waited a"]
    stage.close()
    assert log == ["waited a", "waited b"]  # nothing is kept while a transfer reads


def test_a_batch_larger_than_a_buffer_gets_its_own_and_holds_none() -> None:
    log: list[str] = []
    stage = staged.Staging(_taken(1))
    assert stage.buffer(staged.SLOT + 1) is None
    stage.hold([_Slow(log, "own")])  # placed from its own buffer: nothing to wait for
    assert stage.buffer(8) is not None and log == []
    stage.close()


def test_the_buffers_go_to_the_next_load_and_a_concurrent_load_gets_its_own() -> None:
    with staged.Staging() as one:
        mine = one.buffer(8)
        with staged.Staging() as two:  # a load while the first holds the kept buffers
            theirs = two.buffer(8)
            assert theirs is not mine
    with staged.Staging() as three:  # the set closed first is the one kept
        assert three.buffer(8) is theirs


def test_a_failed_transfer_is_raised_not_swallowed() -> None:
    stage = staged.Staging(_taken(2))
    stage.buffer(8)
    stage.hold([_Failed()])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        stage.close()
    again = staged.Staging(_taken(1))
    again.buffer(8)
    again.hold([_Failed()])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        again.buffer(8)  # its turn comes again: the failure is the load's error


def test_a_host_memory_space_of_an_accelerator_is_not_staged() -> None:
    class _Device:
        platform = "tpu"

    class _Sharding:
        device_set = frozenset({_Device()})

        def __init__(self, kind: str | None) -> None:
            self.memory_kind = kind

    class _Ref:
        def __init__(self, kind: str | None) -> None:
            self.sharding = _Sharding(kind)

    assert staged.wanted([_Ref("device"), _Ref(None)])
    assert not staged.wanted([_Ref("device"), _Ref("pinned_host")])


def test_no_load_stages_on_the_cpu() -> None:
    cpu = jax.devices("cpu")[0]
    assert not staged.wanted([jax.device_put(jnp.ones(2), cpu)])
    assert not staged.wanted([jnp.ones(2), np.ones(2)])  # a host leaf: each keeps its buffer
    assert not staged.wanted([jax.ShapeDtypeStruct((2,), jnp.float32)])  # no sharding


def _tree() -> dict[str, Any]:
    big = staged.SLOT // 4 + 1024  # f32 values: one tensor larger than a buffer
    leaves = {f"l{i}": jnp.full((3 * 1024 * 1024,), i, jnp.float32) for i in range(8)}
    return leaves | {"big": jnp.arange(big, dtype=jnp.float32), "key": jnp.int32(7)}


@pytest.mark.skipif(not ACCELERATOR, reason="stages only onto an accelerator")
def test_a_load_onto_the_accelerator_through_the_buffers_is_exact(tmp_path: Path) -> None:
    tree = _tree()
    assert staged.wanted(jax.tree.leaves(tree))
    path = tmp_path / "ckpt.safetensors"
    tg.save(path, tree)
    for _ in range(2):  # the second load reads into the buffers the first kept
        got = tg.load(path, like=tree)
        for k, v in tree.items():
            assert np.array_equal(np.asarray(got[k]), np.asarray(v)), k
            assert got[k].sharding == v.sharding


@pytest.mark.skipif(not ACCELERATOR, reason="stages only onto an accelerator")
def test_a_changed_byte_past_the_first_buffers_is_refused_and_the_next_load_is_exact(
    tmp_path: Path,
) -> None:
    tree = _tree()
    path = tmp_path / "ckpt.safetensors"
    tg.save(path, tree)
    header = tg.read_header(path)
    victim = next(t for t in header.tensors if t.name == "['l6']")
    good = path.read_bytes()
    bad = bytearray(good)
    bad[header.data_start + victim.begin + 5] ^= 1
    path.write_bytes(bytes(bad))
    with pytest.raises(tg.IntegrityError, match=r"\['l6'\]"):
        tg.load(path, like=tree)
    path.write_bytes(good)
    got = tg.load(path, like=tree)
    assert all(np.array_equal(np.asarray(got[k]), np.asarray(v)) for k, v in tree.items())
