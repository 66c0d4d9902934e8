"""``save`` refuses, before it writes a byte, a tree whose header no reader
would take: it reads the header it laid out in the reader's own budget, so
that every file it writes reads back (``read_header``, ``load``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeguard as tg

_REFUSED = (
    r"^1 invalid leaf or node in the tree:\n  <root>: the header of [0-9,]+ bytes for {leaves} "
    r"in {nodes} would be refused by read_header and load: reading it would "
    r"cost more than their [0-9,]+ bytes of objects \(3 per byte of header past 4 MiB\); "
    r"{part}: its [0-9,]+ bytes of JSON would take about [0-9,]+ bytes of objects, over the "
    r"[0-9,]+ its reader allows\n"
    r"hint: nothing was written; save the tree as several checkpoints \(a part of it in each\) "
    r"or with treeguard.save_sharded, or as fewer leaves and containers \(stack leaves of one "
    r"shape into one array\), and keep large documents out of metadata=$"
)


def _nested(n: int) -> dict[str, Any]:
    """The costliest honest shape per byte of header found: containers
    nested three deep, each holding one child under a key found nowhere
    else, each leaf of a shape of its own (zero-size)."""
    return {f"a{i}": {f"b{i}": {f"c{i}": np.zeros((0, i + 1), np.float32)}} for i in range(n)}


def _empty_lists(n: int) -> dict[str, Any]:
    """Metadata that costs about 24 bytes of objects per byte of its JSON."""
    return {"x": [[]] * n}


def _refused_untouched(tmp_path: Path, save: Any, pattern: str) -> None:
    """``save(path)`` raises the pinned refusal; the file already at
    ``path`` is untouched and no temporary file is left beside it."""
    path = tmp_path / "c.safetensors"
    tg.save(path, {"w": np.ones(2, np.float32)})
    before = path.read_bytes()
    with pytest.raises(tg.InvalidTreeError, match=pattern) as e:
        save(path)
    assert e.value.path == ""
    assert os.listdir(tmp_path) == ["c.safetensors"]
    assert path.read_bytes() == before


def test_metadata_no_reader_would_take_is_refused_before_a_byte_is_written(
    tmp_path: Path,
) -> None:
    # 240 KB of empty lists, about 6.2 MB of objects: written by save, then
    # refused by every read as over the header's budget
    pattern = _REFUSED.format(leaves="1 leaf", nodes="1 container", part="treeguard.metadata")
    _refused_untouched(
        tmp_path,
        lambda p: tg.save(p, {"w": np.zeros(2, np.float32)}, metadata=_empty_lists(60_000)),
        pattern,
    )


@pytest.mark.slow  # its save runs in the idle scheduling class: 20 s while other tests load both cores
def test_save_async_refuses_it_too_and_writes_nothing(tmp_path: Path) -> None:
    def save(path: Path) -> None:
        tree = {"w": np.zeros(2, np.float32)}
        tg.save_async(path, tree, metadata=_empty_lists(60_000)).result()

    _refused_untouched(tmp_path, save, "treeguard.metadata: its")


def test_a_store_put_refuses_it_and_adds_no_version(tmp_path: Path) -> None:
    store = tg.ArtifactStore.init(tmp_path / "s")
    with pytest.raises(tg.InvalidTreeError, match="would be refused by read_header and load"):
        store.put({"w": np.zeros(2, np.float32)}, metadata=_empty_lists(60_000))
    assert store.versions() == []


@settings(max_examples=12, deadline=None)
@given(
    lists=st.integers(0, 80_000),
    shapes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=8),
    nest=st.booleans(),
)
def test_any_tree_save_accepts_reads_back(
    tmp_path_factory: pytest.TempPathFactory, lists: int, shapes: list[Any], nest: bool
) -> None:
    path = tmp_path_factory.mktemp("p") / "c.safetensors"
    leaves = {f"k{i}": np.zeros(s, np.int8) for i, s in enumerate(shapes)}
    tree = {f"n{i}": [v] for i, v in enumerate(leaves.values())} if nest else leaves
    try:
        tg.save(path, tree, metadata=_empty_lists(lists))
    except tg.InvalidTreeError as e:
        assert "would be refused by read_header and load" in e.message
        assert not path.exists()
        return
    header = tg.read_header(path)  # never a FormatError for a file save wrote
    assert header.spec == tg.spec_of(tree)
    assert len(header.metadata["x"]) == lists


@pytest.mark.slow  # 10,300 and 10,900 leaves in 20,000 containers or more: about 11 s
def test_nested_one_leaf_containers_read_back_up_to_where_save_refuses(tmp_path: Path) -> None:
    # 2 to 3 per cent either side of where the reader's budget ends for this
    # shape (10,546 read, 10,625 refused on the 2-core box); the larger was
    # written by save before, then refused by every read as over the budget
    tree = _nested(10_300)
    tg.save(tmp_path / "under.safetensors", tree)
    header = tg.read_header(tmp_path / "under.safetensors")
    assert header.spec == tg.spec_of(tree)
    loaded = tg.load(tmp_path / "under.safetensors")
    assert loaded["a10299"]["b10299"]["c10299"].shape == (0, 10_300)
    (tmp_path / "under.safetensors").unlink()
    pattern = _REFUSED.format(
        leaves="10,900 leaves", nodes="21,801 containers", part="treeguard.spec: spec"
    )
    _refused_untouched(tmp_path, lambda p: tg.save(p, _nested(10_900)), pattern)


def _header_bytes(path: Path) -> int:
    """The JSON header's length, as a safetensors file's first 8 bytes give it."""
    return int.from_bytes(path.read_bytes()[:8], "little")


def _deep_lists(n: int) -> dict[str, Any]:
    """Metadata of the dearest JSON per byte: lists nested 500 deep (each
    ``[]`` costs the reader 96 bytes of objects for its 2 bytes)."""
    deep: list[Any] = []
    for _ in range(500):
        deep = [deep]
    return {"x": [deep] * n}


@pytest.mark.slow  # a search of about 15 saves each: about 7 s in all
@pytest.mark.parametrize(
    ("tree", "metadata"),
    [
        ({"w": np.zeros(2, np.float32)}, _deep_lists),
        ({"w": np.zeros(2, np.float32)}, _empty_lists),
        ("nested", lambda n: {"x": n}),
    ],
    ids=["deep-lists", "empty-lists", "nested-containers"],
)
def test_a_header_save_does_not_read_back_is_within_every_readers_budget(
    tmp_path: Path, tree: Any, metadata: Any
) -> None:
    # save reads back no header of at most ALWAYS_READ bytes: a byte of header
    # costs a reader at most MAX_COST_PER_BYTE bytes of objects, so none can be
    # over its budget. The dearest contents at that size must read back.
    from treeguard._src.checkpoint.readback import ALWAYS_READ  # _src: the bound under test

    def small(n: int) -> bool:  # whether save leaves n's header unread
        path = tmp_path / f"{n}.safetensors"
        try:
            tg.save(path, _nested(n) if tree == "nested" else tree, metadata=metadata(n))
        except tg.InvalidTreeError:  # read back, and over the budget: a larger header
            return False
        return _header_bytes(path) <= ALWAYS_READ

    low, high = 1, 2
    while small(high):
        low, high = high, high * 2
    while high - low > 1:  # the most whose header save does not read back
        mid = (low + high) // 2
        low, high = (mid, high) if small(mid) else (low, mid)
    path = tmp_path / f"{low}.safetensors"
    assert ALWAYS_READ * 0.98 < _header_bytes(path) <= ALWAYS_READ
    assert tg.read_header(path).metadata is not None  # read in the budget, never refused
