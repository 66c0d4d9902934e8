"""Model surgery with a report: a head added, a layer removed, a layer renamed,
on the bundled nnx CNN and equinox MLP trained with adam through
``optax_step``; every bad option refused by key path."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click.testing import CliRunner
from flax import nnx

import treeguard as tg
from tests.drawn import cnn_params, drawn
from treeguard.examples import cnn, eqx_mlp


class CNNWithHead(cnn.CNN):
    """The bundled CNN with a second head: a new leaf group to initialise."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        super().__init__(rngs=rngs)
        self.aux = nnx.Linear(cnn.CLASSES, 2, rngs=rngs)


def _params(module_type: type, seed: int) -> Any:
    return nnx.split(module_type(rngs=nnx.Rngs(params=jax.random.key(seed))), nnx.Param)[1]


def _train(params: Any, loss: Any, batch: Any, steps: int) -> tuple[Any, Any, list[float]]:
    step = tg.optax_step(optax.adam(1e-2))
    state = step.init(params)
    grad = jax.jit(jax.value_and_grad(loss))
    losses = []
    for _ in range(steps):
        value, grads = grad(params, batch)
        params, state = step(params, grads, state)
        losses.append(float(value))
    return params, state, losses


def _cnn_batch() -> dict[str, Any]:
    return {k: jnp.asarray(v[:32]) for k, v in cnn.splits()["train"].items()}


def _leaf(tree: Any, path: str) -> np.ndarray:
    spec = tg.spec_of(tree)
    leaves = jax.tree.leaves(tree)
    return np.asarray(leaves[[leaf.path for leaf in spec.leaves].index(path)])


# Its tests share one xdist group: on two workers the module's fixture would
# otherwise be made once on each (a CNN trained for 3 steps, 5.5 s each).
@pytest.fixture(scope="module")
def trained_cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    params, _, losses = _train(cnn.init(jax.random.key(0)), cnn.loss, _cnn_batch(), 3)
    assert all(np.isfinite(losses))
    path = tmp_path_factory.mktemp("surgery") / "cnn.safetensors"
    tg.save(path, params, metadata={"step": 3})
    return path, params


@pytest.mark.slow
@pytest.mark.xdist_group("trained_cnn")
def test_a_head_added_is_initialised_and_training_resumes(trained_cnn: Any) -> None:
    path, old = trained_cnn
    new = _params(CNNWithHead, 1)
    tree, report = tg.load(path, like=new, missing="init", init=new, report=True)
    assert report.initialised == ("['aux']['bias'].value", "['aux']['kernel'].value")
    assert report.dropped == () and report.renamed == ()
    for leaf in tg.spec_of(old).leaves:
        np.testing.assert_array_equal(_leaf(tree, leaf.path), _leaf(old, leaf.path))
    np.testing.assert_array_equal(
        _leaf(tree, "['aux']['kernel'].value"), _leaf(new, "['aux']['kernel'].value")
    )
    model = nnx.merge(nnx.graphdef(CNNWithHead(rngs=nnx.Rngs(0))), tree)
    batch = _cnn_batch()

    def loss(p: Any, b: Any) -> jax.Array:
        logits = nnx.merge(nnx.graphdef(model), p)(b["image"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["label"]).mean()

    _, _, losses = _train(tree, loss, batch, 2)
    assert all(np.isfinite(losses))


@pytest.mark.slow
@pytest.mark.xdist_group("trained_cnn")
def test_without_options_the_added_head_is_still_an_error(trained_cnn: Any) -> None:
    path, _ = trained_cnn
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=_params(CNNWithHead, 1))
    assert [(m.path, m.kind) for m in info.value.mismatches] == [("['aux']", "missing")]


def test_a_layer_removed_is_dropped_and_reported(tmp_path: Path) -> None:
    # the models' forms with drawn values: their initializers compiled cost 8 s of CPU
    old = nnx.state(drawn(lambda: CNNWithHead(rngs=nnx.Rngs(0)), 2), nnx.Param)
    path = tmp_path / "with_head.safetensors"
    tg.save(path, old)
    new = cnn_params(3)
    tree, report = tg.load(path, like=new, unexpected="drop", report=True)
    assert [c.line() for c in report.changes] == [
        "dropped ['aux']['bias'].value f32[2]",
        "dropped ['aux']['kernel'].value f32[10,2]",
    ]
    np.testing.assert_array_equal(
        _leaf(tree, "['linear2']['kernel'].value"), _leaf(old, "['linear2']['kernel'].value")
    )


@pytest.mark.slow
def test_a_layer_renamed_on_the_equinox_mlp_keeps_its_values(tmp_path: Path) -> None:
    batch = {k: jnp.asarray(v[:32]) for k, v in eqx_mlp.splits()["train"].items()}
    old, _, _ = _train(eqx_mlp.init(jax.random.key(0)), eqx_mlp.loss, batch, 3)
    path = tmp_path / "mlp.safetensors"
    tg.save(path, old)
    # the middle layer removed: the last layer moves from .layers[2] to .layers[1]
    new = eqx.filter(eqx.nn.MLP(2, 1, 8, 1, key=jax.random.key(5)), eqx.is_array)
    tree, report = tg.load(
        path, like=new, rename={".layers[2]": ".layers[1]"}, unexpected=[".layers[1]"], report=True
    )
    assert report.renamed == (".layers[1].bias", ".layers[1].weight")
    assert report.dropped == (".layers[1].bias", ".layers[1].weight")
    assert "renamed .layers[1].weight f32[1,8] (from .layers[2].weight)" in str(report)
    np.testing.assert_array_equal(
        np.asarray(tree.layers[1].weight), np.asarray(old.layers[2].weight)
    )
    np.testing.assert_array_equal(
        np.asarray(tree.layers[0].weight), np.asarray(old.layers[0].weight)
    )


def test_init_as_a_function_of_the_key_path(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    tg.save(path, {"body": np.ones(3, np.float32)})
    like = {"body": np.zeros(3, np.float32), "head": np.zeros((2, 2), np.float32)}
    seen = []

    def init(p: str) -> np.ndarray:
        seen.append(p)
        return np.full((2, 2), 0.25, np.float32)

    tree = tg.load(path, like=like, missing="init", init=init)
    assert seen == ["['head']"]
    np.testing.assert_array_equal(tree["head"], np.full((2, 2), 0.25, np.float32))


@pytest.mark.slow
@pytest.mark.xdist_group("trained_cnn")
def test_the_report_goes_into_the_metadata_of_what_is_saved(
    trained_cnn: Any, tmp_path: Path
) -> None:
    path, _ = trained_cnn
    new = _params(CNNWithHead, 1)
    tree, report = tg.load(path, like=new, missing="init", init=new, report=True)
    out = tmp_path / "new.safetensors"
    tg.save(out, tree, metadata={"step": 3}, surgery=report)
    meta = tg.read_header(out).metadata
    assert meta["step"] == 3
    assert [c["path"] for c in meta["treeguard.surgery"]["changes"]] == list(report.initialised)
    assert meta["treeguard.surgery"]["changes"][1] == {
        "action": "initialised",
        "path": "['aux']['kernel'].value",
        "shape": [10, 2],
        "dtype": "float32",
    }


# -- bad input, each refused by key path ------------------------------------------


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.safetensors"
    tg.save(path, {"body": np.ones(3, np.float32), "old": np.ones(2, np.float32)})
    return path


_LIKE = {"body": np.zeros(3, np.float32), "head": np.zeros(4, np.float32)}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"missing": "init"},
            tg.ConfigError,
            'missing="init" needs init=: the values of the leaves the checkpoint lacks\n'
            "hint: pass init=new_params (a tree like `like`) or a function of the key path",
        ),
        (
            {"init": _LIKE},
            tg.ConfigError,
            'init= is used only with missing="init"\n'
            'hint: pass missing="init" to initialise the leaves the checkpoint lacks',
        ),
        (
            {"missing": "zeros"},
            tg.ConfigError,
            "missing must be 'error' or 'init', got 'zeros'\n"
            'hint: missing="init" with init= gives new leaves their values',
        ),
        (
            {"unexpected": "ignore"},
            tg.ConfigError,
            "unexpected must be 'error', 'drop' or a list of key paths, got 'ignore'\n"
            'hint: unexpected="drop" leaves every stored leaf `like` lacks unused',
        ),
        (
            {"unexpected": ["['olld']"], "missing": "init", "init": _LIKE},
            tg.ConfigError,
            "ignore: ['olld'] names no leaf or subtree of the checkpoint\n"
            "hint: did you mean ['old']?",
        ),
    ],
    ids=[
        "init-missing",
        "init-without-missing",
        "missing-unknown",
        "unexpected-unknown",
        "drop-typo",
    ],
)
def test_bad_surgery_options_are_refused(
    small: Path, options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error) as info:
        tg.load(small, like=_LIKE, **options)
    assert str(info.value).endswith(message)


def test_an_init_leaf_of_another_shape_or_missing_is_named(small: Path) -> None:
    init = {"body": np.zeros(3, np.float32), "head": np.zeros(5, np.float32)}
    like = {**_LIKE, "tail": np.zeros(1, np.int8)}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(small, like=like, missing="init", init=init, unexpected="drop")
    assert str(info.value).endswith(
        "2 mismatches between `init` and `like`:\n"
        "  ['head']: shape (4,) in `like`, (5,) in `init`\n"
        "  ['tail']: missing: i8[1] in `like`, absent in `init`\n"
        "hint: init gives each leaf the checkpoint lacks its value, of `like`'s shape and "
        "dtype, at `like`'s key path: pass the new model's params in `like`'s form"
    )


def test_options_only_relax_what_they_name(small: Path) -> None:
    like = {"body": np.zeros(2, np.float32), "head": np.zeros(4, np.float32)}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(small, like=like, missing="init", init=like, unexpected="drop")
    assert [(m.path, m.kind) for m in info.value.mismatches] == [("['body']", "shape")]


# -- ckpt migrate ------------------------------------------------------------------


def test_ckpt_migrate_writes_a_verified_checkpoint_and_prints_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treeguard._cli.main import main

    old = tmp_path / "old.safetensors"
    tg.save(
        old,
        {"body": np.ones(3, np.float32), "old": np.ones(2, np.float32), "x": np.ones(1)},
        metadata={"step": 9},
    )
    spec = tmp_path / "new.json"
    tg.spec_of(
        {"body": np.zeros(3, np.float32), "head": np.zeros(4, np.float32), "y": np.ones(1)}
    ).save(spec)
    (tmp_path / "newmodel.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            params = {"body": np.zeros(3, np.float32), "head": np.full(4, 0.5, np.float32),
                      "y": np.zeros(1)}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    new = tmp_path / "new.safetensors"
    runner = CliRunner()
    args = ["ckpt", "migrate", str(old), str(new), "--like", str(spec)]
    result = runner.invoke(main, args)
    assert result.exit_code == 1
    assert "3 mismatches" in result.output or "4 mismatches" in result.output
    for path in ("['head']", "['old']", "['x']", "['y']"):
        assert path in result.output
    assert not new.exists()
    result = runner.invoke(
        main, [*args, "--init", "newmodel:params", "--drop", "['old']", "--rename", "['x']=['y']"]
    )
    assert result.exit_code == 0, result.output
    assert "initialised ['head'] f32[4]" in result.output
    assert "renamed ['y'] f64[1] (from ['x'])" in result.output
    assert "dropped ['old'] f32[2]" in result.output
    tg.verify_file(new)
    h = tg.read_header(new)
    assert h.metadata["step"] == 9
    assert h.metadata["migrated_from"]["digest"] == tg.read_header(old).digest
    assert len(h.metadata["treeguard.surgery"]["changes"]) == 3
