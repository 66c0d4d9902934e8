"""The pieces of the protocol: the model contract, the cases, the key
tracking, the comparison, and the checks that the broken variants do not
reach (environment, configuration errors, skipped checks)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from onecheck import check, context, example_hashes, generate_cases
from refpaths import references_of
from subproc import run_python

import treeguard
from treeguard import ConfigError, LeafSpec, environment, spec_of
from treeguard.examples import mlp
from treeguard.verify import (
    CHECKS,
    InvalidInput,
    LeafError,
    Model,
    References,
    Tolerance,
    compare_trees,
    record_references,
    run,
    trace_keys,
)

BASE = mlp.model


def test_check_names_are_stable() -> None:
    assert CHECKS == (
        "contract",
        "keys",
        "finite",
        "negative",
        "transforms",
        "environment",
        "regression",
        "training",
        "splits",
        "performance",
    )


# -- Model ----------------------------------------------------------------------


def test_model_refuses_a_batch_spec_without_batch_axis() -> None:
    with pytest.raises(
        ConfigError, match=r"has no batch axis 'B'; hint: write the batch dimension"
    ):
        dataclasses.replace(BASE, batch_spec=spec_of({"x": LeafSpec((8, 2), "float32")}))


def test_model_refuses_negative_tolerance() -> None:
    with pytest.raises(
        ConfigError, match=r"tolerance rtol is -1.0\nhint: pass a finite number >= 0"
    ):
        dataclasses.replace(BASE, rtol=-1.0)


def test_model_refuses_non_functions() -> None:
    with pytest.raises(ConfigError, match=r"Model.apply is 3, not a function"):
        dataclasses.replace(BASE, apply=3)


def test_per_dtype_tolerance() -> None:
    m = dataclasses.replace(BASE, tolerances={"bf16": Tolerance(1e-2, 1e-3)})
    assert m.tolerance_for(jnp.bfloat16) == Tolerance(1e-2, 1e-3)
    assert m.tolerance_for(jnp.float32) == Tolerance(1e-5, 1e-6)
    assert m.tolerance_table() == {
        "default": {"rtol": 1e-5, "atol": 1e-6},
        "bfloat16": {"rtol": 1e-2, "atol": 1e-3},
    }


# -- cases ----------------------------------------------------------------------


def test_cases_are_deterministic_and_cover_the_protocol() -> None:
    a, b = generate_cases(BASE), generate_cases(BASE)
    assert [c.name for c in a] == ["standard", "single", "zeros", "boundary", "invalid_shape"]
    for x, y in zip(a, b):
        jax.tree.map(np.testing.assert_array_equal, x.batch, y.batch)
    by = {c.name: c for c in a}
    assert by["single"].batch["x"].shape == (1, 2)
    assert not by["zeros"].batch["x"].any()
    assert set(np.unique(by["boundary"].batch["x"])) == {-1.0, 1.0}
    assert by["invalid_shape"].batch["x"].shape == (8, 3)
    assert by["invalid_shape"].raises == (ValueError,)
    assert by["invalid_shape"].note == "['x'] is f32[8,3] where the contract says f32[B,2]"


def test_cases_follow_the_seed() -> None:
    other = generate_cases(dataclasses.replace(BASE, seed=1))[0].batch["x"]
    assert not np.array_equal(other, generate_cases(BASE)[0].batch["x"])


def test_cases_for_int_and_bf16_leaves() -> None:
    spec = spec_of({"ids": LeafSpec(("B", 3), "int32"), "h": LeafSpec(("B",), "bfloat16")})
    m = dataclasses.replace(BASE, batch_spec=spec, output_spec=None, bounds=(0.0, 9.0))
    by = {c.name: c for c in generate_cases(m)}
    assert by["standard"].batch["ids"].dtype == np.int32
    assert by["standard"].batch["h"].dtype == ml_dtypes.bfloat16
    assert set(np.unique(by["boundary"].batch["ids"])) == {0, 9}
    assert by["invalid_shape"].batch["ids"].shape == (8, 4)


# -- keys -----------------------------------------------------------------------


def test_trace_keys_sees_no_reuse_in_the_example() -> None:
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):
        trace = trace_keys(mlp.init, key, names=["k"])
        assert trace.reuses == () and trace.consumed == 3
        jax.tree.map(np.testing.assert_array_equal, trace.outputs, mlp.init(key))


def test_trace_keys_catches_a_legacy_key_jax_misses() -> None:
    def draw_twice(key: jax.Array) -> jax.Array:
        return jax.random.normal(key, (2,)) + jax.random.uniform(key, (2,))

    with jax.debug_key_reuse(True):
        draw_twice(jax.random.PRNGKey(0))  # JAX's checker does not follow legacy keys
    (reuse,) = trace_keys(draw_twice, jax.random.PRNGKey(0), names=["the init key"]).reuses
    assert reuse.legacy and reuse.origin == "the init key"
    assert reuse.first.startswith("a random draw at test_checks.py:")
    assert reuse.again.endswith("draw_twice)")


def test_trace_keys_names_the_origin_of_a_key_made_inside() -> None:
    def seeded(_: jax.Array) -> jax.Array:
        k = jax.random.key(42)
        a, _b = jax.random.split(k)
        return jax.random.normal(a, ()) + jax.random.normal(a, ())

    (reuse,) = trace_keys(seeded, jnp.zeros(())).reuses
    assert reuse.origin.startswith("split[0] of created from a seed at test_checks.py:")


def test_fold_in_with_distinct_data_is_not_reuse() -> None:
    def folded(key: jax.Array) -> jax.Array:
        return sum(jax.random.normal(jax.random.fold_in(key, i), ()) for i in range(3))

    assert trace_keys(folded, jax.random.key(0)).reuses == ()

    def folded_twice(key: jax.Array) -> jax.Array:
        return jax.random.normal(jax.random.fold_in(key, 1), ()) + jax.random.normal(
            jax.random.fold_in(key, 1), ()
        )

    (reuse,) = trace_keys(folded_twice, jax.random.key(0), names=["key"]).reuses
    assert reuse.origin.startswith("fold_in of key")


def test_trace_keys_follows_cond_branches() -> None:
    def branchy(key: jax.Array, flag: jax.Array) -> jax.Array:
        def twice(k: jax.Array) -> jax.Array:
            return jax.random.normal(k, ()) + jax.random.normal(k, ())

        return jax.lax.cond(flag, twice, lambda k: jax.random.normal(k, ()), key)

    assert len(trace_keys(branchy, jax.random.key(0), jnp.bool_(True)).reuses) == 1
    assert trace_keys(branchy, jax.random.key(0), jnp.bool_(False)).reuses == ()


# -- compare --------------------------------------------------------------------


def leaf_error(actual: Any, expected: Any, tol: Tolerance) -> LeafError:
    """The error of one leaf, through ``compare_trees``."""
    found, (err,) = compare_trees({"x": actual}, {"x": expected}, tolerance=lambda d: tol)
    assert found == []
    return err


def test_leaf_error_numbers() -> None:
    err = leaf_error(np.float32([1.0, 2.0, 4.0]), np.float32([1.0, 2.0, 5.0]), Tolerance(0.1, 0.0))
    assert (err.bad, err.size, err.max_abs) == (1, 3, 1.0)
    assert err.max_rel == pytest.approx(0.2) and err.ratio == pytest.approx(2.0)


def test_leaf_error_nan_equals_nan_but_not_a_number() -> None:
    tol = Tolerance(0.0, 0.0)
    assert leaf_error(np.float32([np.nan]), np.float32([np.nan]), tol).ok
    assert not leaf_error(np.float32([np.nan]), np.float32([1.0]), tol).ok
    assert not leaf_error(np.float32([np.inf]), np.float32([-np.inf]), tol).ok


def test_compare_trees_in_bf16() -> None:
    a = {"w": jnp.ones(4, jnp.bfloat16)}
    e = {"w": jnp.ones(4, jnp.bfloat16).at[0].set(1.5)}
    found, errs = compare_trees(a, e, tolerance=lambda d: Tolerance(0.0, 0.1))
    assert found == [] and errs[0].describe().startswith("['w'] bf16[4]: 1 of 4 elements beyond")


def test_compare_trees_reports_structure() -> None:
    found, errs = compare_trees(
        {"w": np.ones(2)}, {"w": np.ones(3)}, tolerance=lambda d: Tolerance(0, 0)
    )
    assert [m.kind for m in found] == ["shape"] and errs == []


# -- checks the variants do not reach ---------------------------------------------


_ctx = context


def test_environment_fails_when_x64_differs(tmp_path: Path) -> None:
    loaded = References.load(record_references(BASE, tmp_path / "r.safetensors"))
    assert check("environment", _ctx(BASE, loaded)).status == "pass"
    changed = dataclasses.replace(loaded, environment={**loaded.environment, "x64": True})
    result = check("environment", _ctx(BASE, changed))
    assert result.status == "fail"
    assert result.evidence[0].startswith(
        "x64: True in the references, False in this run; the references were computed with other dtypes"
    )


def test_environment_does_not_block_a_rerecord(tmp_path: Path) -> None:
    loaded = References.load(record_references(BASE, tmp_path / "r.safetensors"))
    changed = dataclasses.replace(loaded, environment={**loaded.environment, "x64": True})
    ctx = context(BASE, changed, record=True)
    result = check("environment", ctx)
    assert result.status == "pass"
    assert "x64: True in the old references, False in this run; re-recording" in result.evidence[-1]


def test_environment_tolerates_a_version_change(tmp_path: Path) -> None:
    loaded = References.load(record_references(BASE, tmp_path / "r.safetensors"))
    changed = dataclasses.replace(loaded, environment={**loaded.environment, "jax": "0.0.1"})
    result = check("environment", _ctx(BASE, changed))
    assert result.status == "pass"
    assert any(e.startswith("jax differs: '0.0.1' in the references") for e in result.evidence)
    assert f"jax: {environment()['jax']}" in result.evidence


def test_negative_names_the_wrong_exception() -> None:
    m = dataclasses.replace(
        BASE,
        invalid_inputs=[InvalidInput("rank3", {"x": np.ones((2, 2, 2), np.float32)}, KeyError)],
    )
    result = check("negative", _ctx(m))
    assert result.status == "fail"
    assert result.evidence[0].startswith(
        "invalid case 'rank3' (declared by the model): raised ValueError (batch['x'] must have "
        "shape (B, 2), got (2, 2, 2)) instead of KeyError"
    )


def test_checks_without_data_are_skipped() -> None:
    m = dataclasses.replace(BASE, splits=None, update=None, references=None)
    report = run(m, bench=False)
    assert {c.name: c.status for c in report.checks if c.status == "skip"} == {
        "regression": "skip",
        "training": "skip",
        "splits": "skip",
        "performance": "skip",
    }
    assert report.exit_code == 0


def test_a_crashing_apply_fails_with_the_exception_as_evidence() -> None:
    def broken(params: Any, batch: Any) -> Any:
        raise RuntimeError("boom")

    report = run(dataclasses.replace(BASE, apply=broken), bench=False)
    assert report["contract"].evidence == ["RuntimeError: boom"]
    with pytest.raises(treeguard.VerificationError) as raised:
        report.raise_if_failed()
    e = raised.value
    assert e.exit_code == 1 and isinstance(e, AssertionError)
    assert e.failed == report.failed and e.evidence["contract"] == ["RuntimeError: boom"]
    assert str(e).splitlines()[:2] == [
        f"treeguard verify {report.model}: {len(e.failed)} checks failed: {', '.join(e.failed)}",
        "  contract: RuntimeError: boom",
    ]
    assert (
        str(e).splitlines()[-1].startswith("hint: the report (Report.write or `treeguard verify`)")
    )


def test_a_passing_run_raises_nothing() -> None:
    run(BASE, bench=False).raise_if_failed()


def test_missing_references_is_a_configuration_error(tmp_path: Path) -> None:
    m = dataclasses.replace(BASE, references=tmp_path / "none.safetensors")
    with pytest.raises(
        ConfigError, match=r"no references at .*none.safetensors; hint: record them"
    ):
        run(m, bench=False)


def test_record_writes_references_and_then_they_are_used(tmp_path: Path) -> None:
    declared = tmp_path / "r.safetensors"
    path = references_of(declared, jax.default_backend())  # the declared file on the CPU
    spec = tmp_path / "p.spec.json"
    m = dataclasses.replace(BASE, references=declared, params_spec=spec)
    report = run(m, record=True, bench=False)
    assert report.passed and report.recorded == str(path) and spec.exists()
    assert report["regression"].evidence[0] == f"recorded 5 cases to {path}"
    again = run(m, bench=False)
    assert again.passed and again["regression"].summary.startswith("28 leaves on 4 cases")


def test_record_is_refused_when_a_check_fails(tmp_path: Path) -> None:
    declared = tmp_path / "r.safetensors"
    path = references_of(declared, jax.default_backend())  # the declared file on the CPU
    m = dataclasses.replace(
        BASE, references=declared, update=lambda p, g: jax.tree.map(lambda a, b: a + b, p, g)
    )
    report = run(m, record=True, bench=False)
    assert not path.exists()
    assert report.failed == ["regression", "training"]
    assert (
        report["regression"].evidence[0]
        == f"not recorded to {path}: training failed; fix them first"
    )


def test_rerecord_lists_what_changed(tmp_path: Path) -> None:
    path = record_references(BASE, tmp_path / "r.safetensors")

    def init(key: jax.Array) -> Any:
        p = mlp.init(key)
        p["dense1"]["b"] = p["dense1"]["b"] + 0.5
        return p

    report = run(dataclasses.replace(BASE, init=init, references=path), record=True, bench=False)
    assert report.passed
    assert report["regression"].evidence[1].startswith("changed: params: ['dense1']['b'] f32[3]")


def test_splits_hash_content_not_identity() -> None:
    x = np.arange(8.0).reshape(4, 2)
    assert example_hashes({"x": x})[1] == example_hashes({"x": x[1:2].copy()})[0]
    assert example_hashes({"x": x})[1] != example_hashes({"x": x.astype(np.float32)})[1]
    with pytest.raises(ValueError, match="leaves disagree on the number of examples"):
        example_hashes({"x": x, "y": np.ones(3)})


def test_public_namespace() -> None:
    import treeguard.verify as v

    assert v.__all__ == sorted(v.__all__)
    # pytest may rewrite an installed plugin's package and add "@py_builtins" names.
    public = {n for n in dir(v) if n.isidentifier() and not n.startswith("_")}
    assert public == set(v.__all__)
    assert v.Model is Model and v.run is run and v.CHECKS == CHECKS


# -- review fixes -----------------------------------------------------------------


def test_compare_trees_compares_complex_leaves_as_complex() -> None:
    found, errs = compare_trees(
        {"z": np.complex64([1 + 1j])},
        {"z": np.complex64([1 + 5j])},
        tolerance=lambda d: Tolerance(0.0, 0.1),
    )
    assert found == [] and errs[0].bad == 1 and errs[0].max_abs == pytest.approx(4.0)
    assert errs[0].describe().startswith("['z'] c64[1]: 1 of 1 elements beyond tolerance")
    same = leaf_error(np.complex128([2 - 3j]), np.complex128([2 - 3j]), Tolerance(0.0, 0.0))
    assert same.ok and same.max_abs == 0.0


def _rewrite_manifest(src: Path, dst: Path, **changes: Any) -> Path:
    meta = dict(treeguard.read_header(src).metadata)
    meta.update(changes)
    treeguard.save(dst, treeguard.load(src), metadata=meta)
    return dst


def test_references_never_import_a_module_they_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from treeguard import FormatError

    marker = tmp_path / "imported"
    (tmp_path / "tg_side_effect.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Boom(Exception):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    src = record_references(BASE, tmp_path / "r.safetensors")
    cases = References.load(src).manifest["cases"]
    cases[-1]["raises"] = ["tg_side_effect.Boom"]
    hostile = _rewrite_manifest(src, tmp_path / "hostile.safetensors", cases=cases)
    with pytest.raises(
        FormatError, match=r"name the exception .tg_side_effect.Boom., which is neither"
    ):
        References.load(hostile, exceptions=[ValueError])  # what BASE declares
    assert not marker.exists() and "tg_side_effect" not in sys.modules


class BadBatchError(ValueError):
    """What the model below declares for its invalid input."""


def _apply_refusing_rank3(params: Any, batch: Any) -> Any:
    if np.ndim(batch["x"]) == 3:
        raise BadBatchError("rank 3")
    return mlp.apply(params, batch)


def test_references_resolve_the_exceptions_the_model_declares(tmp_path: Path) -> None:
    from treeguard import FormatError, InvalidTreeError

    m = dataclasses.replace(
        BASE,
        apply=_apply_refusing_rank3,
        invalid_inputs=[
            InvalidInput("rank3", {"x": np.ones((2, 2, 2), np.float32)}, BadBatchError)
        ],
    )
    path = record_references(m, tmp_path / "r.safetensors")
    loaded = References.load(path, exceptions=[ValueError, BadBatchError])  # m declares them
    assert [c.raises for c in loaded.cases if c.negative] == [(ValueError,), (BadBatchError,)]
    with pytest.raises(FormatError, match=r"BadBatchError'.*hint: declare it in"):
        References.load(path)  # the model's own exception is resolved only when declared
    # treeguard's own errors resolve without being declared.
    m2 = dataclasses.replace(BASE, invalid_raises=(InvalidTreeError, ValueError))
    again = References.load(record_references(m2, tmp_path / "r2.safetensors"))
    assert again.cases[-1].raises == (InvalidTreeError, ValueError)
    assert run(dataclasses.replace(m, references=path), bench=False).passed


def test_references_with_a_malformed_format_are_a_format_error(tmp_path: Path) -> None:
    from treeguard import FormatError

    src = record_references(BASE, tmp_path / "r.safetensors")
    bad = _rewrite_manifest(src, tmp_path / "bad.safetensors", format="treeguard.regression/one")
    with pytest.raises(FormatError, match=r"format 'treeguard.regression/one' is not 'treeguard"):
        References.load(bad)
    newer = _rewrite_manifest(src, tmp_path / "new.safetensors", format="treeguard.regression/2")
    with pytest.raises(FormatError, match="newer than this treeguard reads"):
        References.load(newer)


def _run_isolated(code: str) -> str:
    """Runs ``code`` in a fresh interpreter (a cyclic tree that slips past
    the guard overflows the stack) and returns its stdout."""
    proc = run_python(textwrap.dedent(code))  # on the CPU: this process holds any accelerator
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_trace_keys_refuses_a_cyclic_argument_first() -> None:
    out = _run_isolated(
        """
        import jax
        from treeguard import InvalidTreeError
        from treeguard.verify import trace_keys

        cyclic = {"key": jax.random.key(0)}
        cyclic["self"] = cyclic
        try:
            trace_keys(lambda d: jax.random.normal(d["key"]), cyclic)
        except InvalidTreeError as e:
            print("refused:", " ".join(str(e).split()))
        # The interpreter is intact: the next trace works as usual.
        trace = trace_keys(lambda k: jax.random.normal(k, (2,)), jax.random.key(1))
        print("then:", trace.consumed, trace.reuses)
        """
    )
    assert out.startswith("refused: ") and "cycl" in out.splitlines()[0]
    assert out.splitlines()[-1] == "then: 1 ()"


def test_cyclic_data_is_refused_by_the_path_formatter() -> None:
    out = _run_isolated(
        """
        import numpy as np
        from treeguard import InvalidTreeError
        from tests.onecheck import Case, example_hashes  # a case and its hash: no public name

        cyclic = {"x": np.ones((2, 1))}
        cyclic["self"] = cyclic
        for f in (example_hashes, lambda t: Case("c", t).summary()):
            try:
                f(cyclic)
            except InvalidTreeError as e:
                print("refused:", "cycl" in str(e))
        """
    )
    assert out == "refused: True\nrefused: True\n"


@jax.tree_util.register_pytree_node_class
class _Rebuilt:
    """A params container whose aux data counts its rebuilds: a container
    that is not stable under flatten/unflatten, so its grads differ from it."""

    def __init__(self, w: Any, rebuilds: int = 0) -> None:
        self.w = w
        self.rebuilds = rebuilds

    def tree_flatten(self) -> tuple[tuple[Any], int]:
        return (self.w,), self.rebuilds

    @classmethod
    def tree_unflatten(cls, aux: int, children: Any) -> _Rebuilt:
        return cls(*children, rebuilds=aux + 1)


def test_contract_does_not_claim_grads_match_when_they_do_not() -> None:
    m = dataclasses.replace(
        BASE,
        init=lambda key: _Rebuilt(jax.random.normal(key, (2, 1))),
        apply=lambda p, b: b["x"] @ p.w,
        loss=lambda p, b: jnp.mean((b["x"] @ p.w - b["y"]) ** 2),
        params_spec=None,
        update=None,
    )
    result = check("contract", _ctx(m))
    assert result.status == "fail"
    assert any(e.startswith("case 'standard' grads: <root>: node data ") for e in result.evidence)
    assert "grads match the params' spec" not in result.evidence
    assert "grads match the params' spec" in check("contract", _ctx(BASE)).evidence


def test_finite_names_each_non_finite_leaf() -> None:
    def loss(params: Any, batch: Any) -> jax.Array:
        return mlp.loss(params, batch) * jnp.where(params["dense2"]["b"][0] == 0, jnp.nan, 1.0)

    result = check("finite", _ctx(dataclasses.replace(BASE, loss=loss)))
    assert result.status == "fail"
    assert "case 'standard' loss is non-finite: nan" in result.evidence
    assert "case 'standard' grads ['dense1']['b'] f32[3]: 3 of 3 non-finite (nan)" in (
        result.evidence
    )


def test_cases_for_complex_and_four_bit_int_leaves() -> None:
    spec = spec_of(
        {
            "z": LeafSpec(("B", 2), "complex64"),
            "s": LeafSpec((), "complex128"),  # a scalar: no axis to reverse
            "q": LeafSpec(("B",), "int4"),
            "u": LeafSpec(("B",), "uint4"),
        }
    )
    m = dataclasses.replace(BASE, batch_spec=spec, output_spec=None, bounds=(1.0, 5.0))
    by = {c.name: c for c in generate_cases(m)}
    z = by["standard"].batch["z"]
    assert z.dtype == np.complex64
    for part in (z.real, z.imag):
        assert part.min() >= 1.0 and part.max() <= 5.0 and len(np.unique(part)) > 1
    assert set(np.unique(by["boundary"].batch["z"].real)) == {1.0, 5.0}
    assert by["boundary"].batch["s"] == 1.0 + 1.0j
    for name, dtype in (("q", ml_dtypes.int4), ("u", ml_dtypes.uint4)):
        assert by["standard"].batch[name].dtype == dtype
        values = by["standard"].batch[name].astype(np.int32)
        assert values.min() >= 1 and values.max() <= 5
        assert set(np.unique(by["boundary"].batch[name].astype(np.int32))) == {1, 5}
