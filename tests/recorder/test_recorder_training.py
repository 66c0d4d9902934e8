"""The flight recorder in real training loops: the bundled nnx CNN and
equinox MLP trained with ``optax.adam`` through ``optax_step``, a NaN
injected by the data at step k, found by the recorder and located by
``diagnose --bundle`` at its line; and a recorder on a disk that is full or
read-only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click.testing import CliRunner
from subproc import ROOT, run_python

import treeguard as tg
from treeguard._cli.main import main

from . import nanmodels as nm

pytestmark = pytest.mark.slow

K = 4


def _batches(split: dict[str, np.ndarray], size: int) -> list[dict[str, jax.Array]]:
    n = len(next(iter(split.values())))
    return [{k: jnp.asarray(v[i : i + size]) for k, v in split.items()} for i in range(0, n, size)]


def _train_until_nan(
    model: Any, loss: Any, poison: Any, directory: Path, batch: str
) -> tuple[tg.NonFiniteError, Any, dict[str, jax.Array]]:
    """Trains ``model`` with adam through ``optax_step`` under a recorder;
    the batch of step ``K`` is poisoned. Returns the error, the params from
    before step ``K`` and that batch."""
    train = tg.FlightRecorder(directory, batch=batch).wrap(  # type: ignore[arg-type]
        tg.optax_step(optax.adam(1e-2)), loss=loss
    )
    params = model.init(jax.random.key(0))
    state = train.init(params)
    batches = _batches(model.split_data()["train"], 8)
    for step in range(K):
        params, state, value = train(params, state, batches[step])
        assert np.isfinite(value)
    bad = poison(batches[K])
    before = jax.tree.map(np.asarray, params)
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, state, bad)
    assert train.step_number == K
    return info.value, before, bad


def _poison_x(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {**batch, "x": batch["x"].at[3, 1].set(1.5)}


def _poison_image(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {**batch, "image": batch["image"].at[2, 4, 4, 0].set(2.0)}


CASES = [
    pytest.param(nm.eqx_model, nm.eqx_loss, _poison_x, "eqx_model", id="equinox-mlp"),
    pytest.param(nm.cnn_model, nm.cnn_loss, _poison_image, "cnn_model", id="nnx-cnn"),
]


@pytest.mark.parametrize(("model", "loss", "poison", "attr"), CASES)
def test_a_nan_at_step_k_is_recorded_and_located_at_its_line(
    tmp_path: Path, model: Any, loss: Any, poison: Any, attr: str
) -> None:
    e, before, _ = _train_until_nan(model, loss, poison, tmp_path / "nan", "record")
    assert e.bundle == str(tmp_path / "nan" / f"000001-step{K}")
    assert (e.where, e.path) == ("the loss", "")
    bundle = tg.read_bundle(e.bundle)
    stored = bundle.load_state("params", jax.eval_shape(model.init, jax.random.key(0)))
    for a, b in zip(jax.tree.leaves(stored), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), b)  # the params from before step K
    code, out = _replay(e.bundle, attr)
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0] == f"bundle {e.bundle}: step {K}, recorded first in the loss"
    fn = loss.__name__
    assert lines[1].startswith("first non-finite value: forward equation ")
    assert f" at {nm.marked_line(fn)} ({fn}): 1 nan in " in lines[1]


def test_a_digest_only_bundle_is_replayed_with_the_batch_saved_apart(tmp_path: Path) -> None:
    e, _, bad = _train_until_nan(nm.eqx_model, nm.eqx_loss, _poison_x, tmp_path / "nan", "digest")
    batch_file = tmp_path / "step4-batch.safetensors"
    tg.save(batch_file, bad)
    code, out = _replay(str(e.bundle), "eqx_model", "--batch", str(batch_file))
    assert code == 1 and nm.marked_line("eqx_loss") in out
    tg.save(batch_file, _poison_x({**bad, "y": bad["y"] + 1.0}))
    code, out = _replay(str(e.bundle), "eqx_model", "--batch", str(batch_file))
    assert code == 1
    assert "1 batch leaf differs from the digest the bundle recorded: ['y']" in out


def _replay(bundle: str, attr: str, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["diagnose", "--bundle", bundle, f"recorder.nanmodels:{attr}", *options]
    )
    return result.exit_code, result.output


_ON_A_SMALL_DISK = textwrap.dedent(
    """
    import subprocess, sys
    import jax.numpy as jnp, optax
    import treeguard as tg
    from recorder import nanmodels as nm

    where, options = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", where], check=True)
    train = tg.FlightRecorder(where + "/nan", batch="record").wrap(
        tg.optax_step(optax.sgd(0.1)), loss=nm.tiny_loss
    )
    params = {"w": jnp.ones(65536)}
    state = train.init(params)
    try:
        train(params, state, {"x": -jnp.ones(65536)})
    except tg.NonFiniteError as e:
        assert e.bundle is None and e.__cause__ is e.bundle_error, e
        print(type(e.bundle_error).__name__, e.bundle_error.reason)
        print(str(e).splitlines()[0])
        import os
        print(sorted(os.listdir(where + "/nan")) if os.path.isdir(where + "/nan") else "none")
    """
)


@pytest.mark.parametrize(
    ("options", "reason"),
    [("size=64k", "ENOSPC"), ("size=1m,ro", "EROFS")],
    ids=["full-disk", "read-only"],
)
def test_a_full_or_read_only_disk_still_raises_the_nan_error(
    tmp_path: Path, options: str, reason: str
) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here to mount a small tmpfs in a private namespace")
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip("user namespaces are not available here")
    where = tmp_path / "disk"
    where.mkdir()
    done = run_python(
        "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])",
        unshare,
        "-rm",
        sys.executable,
        "-c",
        _ON_A_SMALL_DISK,
        str(where),
        options,
        env={"PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests")))},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"RecorderError {reason}"
    assert lines[1] == "step 0: 1 leaf holds NaN or Inf in the loss:"
    assert lines[2] in ("[]", "none")  # no half bundle left behind
