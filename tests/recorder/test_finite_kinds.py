"""One finite check for host arrays, for every float kind: float16/32/64,
complex, bfloat16 and each float8 (and float4/6) of ml_dtypes, whose dtype
kind is ``'V'`` (``float8_e5m2``'s is ``'f'``), so ``kind in "fc"`` misses
them. Each gate that reads host arrays goes through it; each is shown here
refusing a NaN or Inf of each kind, through the public calls that read host
arrays: ``find_nonfinite`` (the count), ``nan_origin`` (NaN apart from Inf)
and the release check ``model.finite`` of ``serving.verify_version``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import treeguard
from treeguard.diagnose import nan_origin
from treeguard.serving import verify_version
from treeguard.verify import Model, run

ML_FLOATS = sorted(
    n for n in dir(ml_dtypes) if n.startswith(("float", "bfloat")) and n[-1].isalnum()
)


def _dtypes() -> list[np.dtype[Any]]:
    out = [np.dtype(t) for t in (np.float16, np.float32, np.float64, np.complex64, np.complex128)]
    for name in ML_FLOATS:
        try:
            out.append(np.dtype(getattr(ml_dtypes, name)))
        except TypeError:  # ``finfo`` and the like
            continue
    return out


#: every float kind numpy and ml_dtypes know, real and complex
FLOATS = _dtypes()
NOT_FLOATS = [np.dtype(t) for t in (bool, np.int8, np.uint32, np.int64)] + [
    np.dtype(ml_dtypes.int4),
    np.dtype(ml_dtypes.uint4),
]


def _bad_values(dtype: np.dtype[Any]) -> list[float]:
    """The non-finite values ``dtype`` can hold (float4 and float6 hold none)."""
    out = []
    for v in (np.nan, np.inf, -np.inf):
        held = np.array([v], np.float64).astype(dtype)
        if not np.isfinite(held.astype(np.complex128)).all():
            out.append(v)
    return out


def _top(dtype: np.dtype[Any]) -> Any:
    real = np.float32 if dtype.kind == "c" else dtype
    return ml_dtypes.finfo(real).max


def test_every_float_kind_is_known() -> None:
    names = {dt.name for dt in FLOATS}
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"} <= names
    assert any(dt.kind == "V" for dt in FLOATS)  # the kind ``in "fc"`` missed


_INT_HINT = "hint: integer or bool params cannot take a float or complex update"


def _update_hint(param: np.dtype[Any], update: np.dtype[Any]) -> str:
    """The hint of ``apply_updates`` refusing an update of another dtype."""
    with pytest.raises(treeguard.TreeMismatchError) as e:
        treeguard.apply_updates({"w": np.zeros(3, param)}, {"w": np.zeros(3, update)})
    return str(e.value).splitlines()[-1]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_an_update_of_every_float_kind_is_a_float_update(dtype: np.dtype[Any]) -> None:
    # an int param refuses it as a float update; a param of that kind takes
    # an int update's refusal as a cast's, not as an int param's
    assert _update_hint(np.dtype(np.int8), dtype).startswith(_INT_HINT)
    assert not _update_hint(dtype, np.dtype(np.int8)).startswith(_INT_HINT)


@pytest.mark.parametrize("dtype", NOT_FLOATS, ids=str)
def test_ints_bools_and_keys_are_not_floats(dtype: np.dtype[Any]) -> None:
    assert _update_hint(dtype, np.dtype(np.float32)).startswith(_INT_HINT)
    assert treeguard.find_nonfinite({"x": np.zeros(3, dtype)}) == {}


def test_the_release_check_passes_ints_bools_and_keys(store: treeguard.ArtifactStore) -> None:
    assert _refused(store, {dt.name: np.zeros((3, 1), dt) for dt in NOT_FLOATS}) == []


def test_verify_draws_every_real_float_kind_as_a_float() -> None:
    # between the bounds 0.5 and 1.5, the generated cases draw floats for each
    # real float kind (not all 1), and the one integer 1 for numpy's int kinds
    # (verify draws bools as bools, and no int4)
    seen: list[dict[str, np.ndarray[Any, Any]]] = []

    def apply(params: Any, batch: Any) -> Any:
        seen.append({k: np.asarray(v) for k, v in batch.items()})
        return {"y": params["w"] * jnp.ones(batch["int8"].shape[0])}

    kinds = [dt for dt in FLOATS if dt.kind != "c"] + [dt for dt in NOT_FLOATS if dt.kind in "iu"]
    model = Model(
        init=lambda key: {"w": jnp.ones(())},
        apply=apply,
        loss=lambda p, b: jnp.sum(apply(p, b)["y"]),
        batch_spec=treeguard.spec_of(
            {dt.name: treeguard.LeafSpec(("B",), dt.name) for dt in kinds}
        ),
        bounds=(0.5, 1.5),
        batch_size=64,
        rtol=1e-3,
        atol=1e-3,
    )
    run(model, bench=False)
    first = seen[0]  # the standard batch
    for dt in kinds:
        drawn = first[dt.name].astype(np.float64)
        assert first[dt.name].dtype == dt
        assert (drawn == 1).all() == (dt not in FLOATS), (dt, drawn)


def _count(x: np.ndarray[Any, Any]) -> int:
    """The NaN and Inf values of one host array, counted at its own dtype."""
    return sum(treeguard.find_nonfinite({"x": x}).values())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> treeguard.ArtifactStore:
    return treeguard.ArtifactStore(tmp_path_factory.mktemp("finite") / "s")


def _apply(params: Any, batch: Any) -> Any:
    return jnp.zeros(1)  # one function: jit compiles it once for every version


def _loss(params: Any, batch: Any) -> Any:
    return jnp.zeros(())


_BATCH = treeguard.spec_of({"x": treeguard.LeafSpec(("B",), "float32")})


def _refused(store: treeguard.ArtifactStore, tree: dict[str, Any]) -> list[str]:
    """The leaves the release check ``model.finite`` names (host arrays, each at its
    own dtype; the first 5), in flatten order; empty when it passes the version."""
    model = Model(
        init=lambda key: tree, apply=_apply, loss=_loss, batch_spec=_BATCH, rtol=1e-3, atol=1e-3
    )
    info = verify_version(store, store.put(tree), model, like=treeguard.spec_of(tree))
    failed = [c for c in info.checks if not c.ok]
    assert [c.name for c in failed] in ([], ["model.finite"]), failed
    if not failed:
        assert info.status == "verified"
        return []
    head = "ValueError: NaN or Inf in "
    assert info.status == "rejected" and failed[0].detail.startswith(head)
    return failed[0].detail.removeprefix(head).split(", ")


#: Around the release check's few-values path (read in Python up to 64 values).
SIZES = [1, 64, 65, 1000]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("size", SIZES)
def test_the_host_check_finds_one_nan_or_inf_wherever_it_sits(
    store: treeguard.ArtifactStore, dtype: np.dtype[Any], size: int
) -> None:
    # a few values are read in Python, more with numpy, a block at a time: both
    # see every position, and the largest finite value is finite
    x = np.full((size, 1), _top(dtype), dtype)
    signed = _count(np.array([-1.0]).astype(dtype)) == 0  # not float8_e8m0fnu
    clean = {"top": x, "neg": -x} if signed else {"top": x}
    assert _count(x) == 0 and (_count(-x) == 0 or not signed)
    ats = sorted({0, size // 2, size - 1})
    bads = _bad_values(dtype)
    for bad in bads:
        for at in ats:
            y = x.copy()
            y[at, 0] = bad
            assert _count(y) == 1, (bad, at)
    # the release check, one version for each kind and size: a leaf poisoned at
    # each position, the bad values taken in turn (each reads alike in Python)
    poisoned = {}
    for i, at in enumerate(ats if bads else []):
        y = poisoned[f"bad{i}"] = x.copy()
        y[at, 0] = bads[i % len(bads)]
    assert _refused(store, clean | poisoned) == [f"['{name}']" for name in poisoned]


def _births(x: np.ndarray[Any, Any]) -> list[tuple[str, int]]:
    """The kind (``nan``, ``inf`` or both) and count of the non-finite values
    ``log`` makes of ``x``'s finite values, counted at ``x``'s dtype."""
    return [(s.kind, s.count) for s in nan_origin(jnp.log, x)]


#: The real float kinds that hold -1, 0 and NaN: log makes NaN and -Inf (or NaN) of them.
SIGNED = [
    dt
    for dt in FLOATS
    if dt.kind != "c"
    and _bad_values(dt)
    and np.isfinite(np.array([-1.0, 0.0]).astype(dt).astype(np.float32)).all()
]


@pytest.mark.parametrize("dtype", SIGNED, ids=str)
def test_nan_and_inf_are_told_apart_at_every_float_kind(dtype: np.dtype[Any]) -> None:
    # log(-1) is NaN; log(0) is -Inf, or NaN where the kind has no Inf
    x = np.ones(9, np.float32)
    x[[0, 4, 8]] = -1.0
    assert _births(x.astype(dtype)) == [("nan", 3)]
    kind = "inf" if np.isinf(np.array([-np.inf]).astype(dtype).astype(np.float32))[0] else "nan"
    assert _births(np.zeros(9, dtype)) == [(kind, 9)]
    assert _births(np.ones(9, dtype)) == []


#: Host arrays are read this many values at a time (``nonfinite._BLOCK``).
BLOCK = 1 << 22


def test_the_host_check_counts_across_blocks() -> None:
    # a bfloat16 leaf of two blocks, NaN and Inf on both sides of their boundary
    x = np.ones(BLOCK + 8, ml_dtypes.bfloat16)
    x[[0, BLOCK - 1, BLOCK, BLOCK + 7]] = [np.nan, np.inf, -np.inf, np.nan]
    assert _count(x) == 4
    born = np.ones(BLOCK + 8, ml_dtypes.bfloat16)
    born[[0, BLOCK + 7]] = -1.0  # log: NaN, one in each block
    assert _births(born) == [("nan", 2)]
    born[[BLOCK - 1, BLOCK]] = 0.0  # log: -Inf on both sides of the boundary
    assert _births(born) == [("nan+inf", 4)]
    born[[0, BLOCK + 7]] = 1.0
    assert _births(born) == [("inf", 2)]
    strided = np.ones((10, 10), np.float32)[:, ::3]  # not contiguous
    strided[4, 2] = np.nan
    assert _count(strided) == 1


@pytest.mark.parametrize("dtype", [dt for dt in FLOATS if _bad_values(dt)], ids=str)
def test_find_nonfinite_names_the_path_at_every_float_kind(dtype: np.dtype[Any]) -> None:
    tree = {"a": np.ones(3, np.float32), "w": np.ones((2, 3), dtype)}
    assert treeguard.find_nonfinite(tree) == {}
    tree["w"][1, 2] = _bad_values(dtype)[0]
    assert treeguard.find_nonfinite(tree) == {"['w']": 1}


def test_the_message_names_the_path_count_dtype_and_shape_of_every_float_kind() -> None:
    # a refused update's message (a served version's refusal, the same lines for
    # each leaf, is pinned in tests/serving/test_finite_gate.py); one update of
    # a leaf of each kind, so the updater compiles once
    kinds = [dt for dt in FLOATS if _bad_values(dt)]
    tree = {dt.name: np.ones((2, 3), dt) for dt in kinds}
    ones = {dt.name: np.ones((2, 3), dt) for dt in kinds}  # float8_e8m0fnu has no 0
    treeguard.apply_updates(tree, ones, on_nonfinite="raise")  # finite: no refusal
    for dt in kinds:
        tree[dt.name][1, 2] = _bad_values(dt)[0]
    with pytest.raises(treeguard.NonFiniteError) as info:
        treeguard.apply_updates(tree, ones, on_nonfinite="raise")
    lines = str(info.value).splitlines()
    assert lines[0] == f"{len(kinds)} leaves hold NaN or Inf in the updated params:"
    for line, name in zip(lines[1 : len(kinds) + 1], sorted(tree), strict=True):
        assert line.startswith(f"  ['{name}']: 1 of 6 values (") and line.endswith("[2,3])")
    assert lines[len(kinds) + 1].startswith("hint: ")
    with pytest.raises(treeguard.NonFiniteError) as one:
        treeguard.apply_updates(
            {"w": tree["bfloat16"]}, {"w": ones["bfloat16"]}, on_nonfinite="raise"
        )
    assert str(one.value).splitlines()[:2] == [
        "1 leaf holds NaN or Inf in the updated params:",
        "  ['w']: 1 of 6 values (bf16[2,3])",
    ]


def test_a_float8_nan_born_in_a_conversion_is_located() -> None:
    # 1000 lies beyond float8_e4m3fn's range (448), which has no Inf: the
    # conversion gives NaN from finite inputs, and the locator sees it there
    def f(x: Any) -> Any:
        return (x * 1000.0).astype(jnp.float8_e4m3fn)

    sites = nan_origin(f, jnp.linspace(0.0, 1.0, 4))
    assert [(s.primitive, s.kind) for s in sites] == [("convert_element_type", "nan")]
    assert sites[0].count == 2 and sites[0].summary == "float8_e4m3fn[4]"


@pytest.mark.parametrize("dtype", [dt for dt in FLOATS if _bad_values(dt)], ids=str)
def test_the_recorder_refuses_a_host_value_of_every_float_kind(tmp_path, dtype) -> None:
    # an eager step returning numpy values: each is judged on the host, at its own dtype
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        return params, opt_state, np.full(3, batch, np.float64).astype(dtype)

    train = treeguard.FlightRecorder(tmp_path, batch="digest").wrap(step)
    params, state = {"w": jnp.ones(2)}, {"m": np.zeros(2)}
    train(params, state, 1.0)
    assert not any(tmp_path.iterdir())
    with pytest.raises(treeguard.NonFiniteError) as info:
        train(params, state, _bad_values(dtype)[0])
    assert info.value.where == "the loss"


def _leaves(values: np.ndarray[Any, Any], cast: bool) -> Iterator[np.ndarray[Any, Any]]:
    """``values`` as leaves the host check reads by a cast to float32 (leaves of
    a few values of an ml_dtypes float) or directly (one leaf of many values:
    bfloat16's exponent bits, numpy's own ufunc): ``values`` cut in pieces, or
    repeated."""
    if cast:
        for start in range(0, values.size, 256):
            yield values[start : start + 256]
    else:
        yield np.tile(values, -(-(1 << 17) // max(values.size, 1)))  # the values, many times


def _counted(values: np.ndarray[Any, Any], cast: bool) -> int:
    """The NaN and Inf values of ``values``, through leaves read one way (a
    count over repeated values divided by the repeats)."""
    leaves = list(_leaves(values, cast))
    found = treeguard.find_nonfinite({f"{i:03d}": x for i, x in enumerate(leaves)})
    total = sum(x.size for x in leaves)
    if total == 0:
        return 0
    assert sum(found.values()) % (total // values.size) == 0
    return sum(found.values()) // (total // values.size)


@pytest.mark.parametrize("cast", [True, False], ids=["cast", "direct"])
@pytest.mark.parametrize("dtype", [dt for dt in FLOATS if dt.kind == "V"], ids=str)
def test_every_bit_pattern_of_an_ml_dtypes_float_is_judged_as_float32_judges_it(
    dtype: np.dtype[Any], cast: bool
) -> None:
    # each way the check reads a block (a cast for a few values, bfloat16's
    # exponent bits, numpy's own ufunc) against every value the dtype holds
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}").view(dtype)
    want = ~np.isfinite(bits.astype(np.float32))
    assert _counted(bits, cast) == int(want.sum())
    assert _counted(bits[~want], cast) == 0
    if want.any():
        assert _counted(bits[want][-1:], cast) == 1 and _counted(bits[want], cast) == want.sum()
