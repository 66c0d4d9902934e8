"""One finite check for host arrays, for every float kind: float16/32/64,
complex, bfloat16 and each float8 (and float4/6) of ml_dtypes, whose dtype
kind is ``'V'`` (``float8_e5m2``'s is ``'f'``), so ``kind in "fc"`` misses
them. Each gate that reads host arrays goes through it; each is shown here
refusing a NaN or Inf of each kind."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import treeguard

# The host finite check itself, on purpose: its few-values Python path and its NaN/Inf
# split are read by gates behind a served model or a verify run alone, and its block and
# cast bounds are lowered here (the gates' refusals are shown through it below).
from treeguard._src import nonfinite  # _src: the host finite check, dtype by dtype
from treeguard.diagnose import nan_origin
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
    assert nonfinite.host_all_finite(np.zeros(3, dtype))
    assert treeguard.find_nonfinite({"x": np.zeros(3, dtype)}) == {}


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


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("size", [1, nonfinite.SMALL, nonfinite.SMALL + 1, 1000])
def test_the_host_check_finds_one_nan_or_inf_wherever_it_sits(
    dtype: np.dtype[Any], size: int
) -> None:
    # small arrays are read in Python, larger ones with numpy, a block at a
    # time: both see every position, and the largest finite value is finite
    x = np.full((size, 1), _top(dtype), dtype)
    signed = nonfinite.host_nonfinite(np.array([-1.0]).astype(dtype)) == 0  # not float8_e8m0fnu
    assert nonfinite.host_all_finite(x) and (nonfinite.host_all_finite(-x) or not signed)
    assert nonfinite.host_nonfinite(x) == 0 and nonfinite.host_nan_inf(x) == (0, 0)
    for bad in _bad_values(dtype):
        for at in sorted({0, size // 2, size - 1}):
            y = x.copy()
            y[at, 0] = bad
            assert not nonfinite.host_all_finite(y), (bad, at)
            assert nonfinite.host_nonfinite(y) == 1
            nan, inf = nonfinite.host_nan_inf(y)
            assert nan + inf == 1


def test_the_host_check_counts_across_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nonfinite, "_BLOCK", 7)
    x = np.ones(50, ml_dtypes.bfloat16)
    x[[0, 6, 7, 49]] = [np.nan, np.inf, -np.inf, np.nan]
    assert (
        nonfinite.host_nonfinite(x) == 4
        and nonfinite.host_nan_inf(x) == (2, 2)
        and not nonfinite.host_all_finite(x)
    )
    strided = np.ones((10, 10), np.float32)[:, ::3]  # not contiguous
    strided[4, 2] = np.nan
    assert nonfinite.host_nonfinite(strided) == 1


@pytest.mark.parametrize("dtype", [dt for dt in FLOATS if _bad_values(dt)], ids=str)
def test_find_nonfinite_and_its_message_name_the_path_and_dtype(dtype: np.dtype[Any]) -> None:
    tree = {"a": np.ones(3, np.float32), "w": np.ones((2, 3), dtype)}
    assert nonfinite.describe_nonfinite(tree, where="v1") is None
    tree["w"][1, 2] = _bad_values(dtype)[0]
    assert treeguard.find_nonfinite(tree) == {"['w']": 1}
    text = nonfinite.describe_nonfinite(tree, where="the params of v1")
    assert text is not None
    assert text.splitlines()[0] == "1 leaf holds NaN or Inf in the params of v1:"
    assert text.splitlines()[1].startswith("  ['w']: 1 of 6 values (")
    assert "[2,3])" in text


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


@pytest.mark.parametrize("cast", [True, False], ids=["cast", "direct"])
@pytest.mark.parametrize("dtype", [dt for dt in FLOATS if dt.kind == "V"], ids=str)
def test_every_bit_pattern_of_an_ml_dtypes_float_is_judged_as_float32_judges_it(
    monkeypatch: pytest.MonkeyPatch, dtype: np.dtype[Any], cast: bool
) -> None:
    # each way the check reads a block (a cast for a few values, bfloat16's
    # exponent bits, numpy's own ufunc) against every value the dtype holds
    monkeypatch.setattr(nonfinite, "_CAST", 1 << 20 if cast else 0)
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}").view(dtype)
    want = ~np.isfinite(bits.astype(np.float32))
    assert nonfinite.host_nonfinite(bits) == int(want.sum())
    assert nonfinite.host_nonfinite(bits[~want]) == 0 and nonfinite.host_all_finite(bits[~want])
    if want.any():
        assert (
            not nonfinite.host_all_finite(bits[want][-1:])
            and nonfinite.host_nonfinite(bits[want]) == want.sum()
        )
