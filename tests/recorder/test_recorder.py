"""The NaN flight recorder on a small model: the bundle of the first
non-finite step, its refusals, and its replay by ``diagnose --bundle``."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click.testing import CliRunner

import treeguard as tg
from treeguard._cli.main import main
from treeguard.diagnose import replay_bundle

from . import nanmodels as nm

GOOD = {"x": jnp.array([1.0, 4.0, 9.0])}
BAD = {"x": jnp.array([1.0, -4.0, 9.0])}


def _train(directory: Path, **options: Any) -> tg.RecordedStep:
    recorder = tg.FlightRecorder(directory, **{"batch": "record", **options})
    return recorder.wrap(tg.optax_step(optax.sgd(0.1)), loss=nm.tiny_loss)


def _fail(train: tg.RecordedStep, params: Any, state: Any, batch: Any = BAD) -> tg.NonFiniteError:
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, state, batch)
    return info.value


def _diagnose(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["diagnose", *args])
    return result.exit_code, result.output


def test_the_batch_is_a_choice_written_in_the_code(tmp_path: Path) -> None:
    with pytest.raises(tg.ConfigError) as info:
        tg.FlightRecorder(tmp_path / "nan")
    text = str(info.value)
    assert text.startswith('FlightRecorder needs batch=\nhint: pass batch="record" to keep')
    assert 'batch="digest" to keep only its spec and digest' in text
    assert "personal data" in text
    with pytest.raises(tg.ConfigError, match="batch must be 'record' or 'digest', got 'raw'"):
        tg.FlightRecorder(tmp_path / "nan", batch="raw")  # type: ignore[arg-type]
    with pytest.raises(tg.ConfigError, match="keep must be an int of at least 1, got 0"):
        tg.FlightRecorder(tmp_path / "nan", batch="record", keep=0)
    assert not (tmp_path / "nan").exists()  # nothing is written before a bundle is


def test_the_first_nonfinite_step_leaves_a_bundle_and_names_its_first_leaf(
    tmp_path: Path,
) -> None:
    train = _train(tmp_path / "nan")
    params = {"w": jnp.ones(3)}
    state = train.init(params)
    for _ in range(3):
        params, state, loss = train(params, state, GOOD)
        assert np.isfinite(loss)
    assert train.step_number == 3 and not (tmp_path / "nan").exists()
    before = jax.tree.map(np.asarray, params)
    e = _fail(train, params, state)
    assert (e.where, e.path) == ("the loss", "")
    assert e.bundle == str(tmp_path / "nan" / "000001-step3")
    assert e.bundle_error is None and e.exit_code == 1
    lines = str(e).splitlines()
    assert lines[:2] == [
        "step 3: 1 leaf holds NaN or Inf in the loss:",
        "  <root>: 1 of 1 value (f32[])",
    ]
    assert f"flight recorder bundle: {e.bundle}" in lines
    assert lines[-1].startswith("hint: the step was not applied")
    assert f"treeguard diagnose --bundle {e.bundle} MODULE:ATTR" in lines[-1]
    # no value of the batch or the params (the temporary path may hold any digits)
    assert "-4" not in str(e).replace(str(e.bundle), "")
    assert train.step_number == 3  # the step was not taken
    bundle = tg.read_bundle(e.bundle)
    assert (bundle.step, bundle.first, bundle.batch_mode) == (3, ("the loss", ""), "record")
    assert [f.tree for f in bundle.nonfinite] == ["the loss", "the grads", "the updated params"]
    bundle.verify()
    stored = bundle.load_state("params", params)
    np.testing.assert_array_equal(np.asarray(stored["w"]), before["w"])  # bit for bit
    np.testing.assert_array_equal(bundle.load_batch()["x"], np.asarray(BAD["x"]))
    assert sorted(os.listdir(e.bundle)) == ["BUNDLE.json", "batch.safetensors", "state.safetensors"]
    manifest = json.loads((Path(e.bundle) / "BUNDLE.json").read_text())
    assert manifest["format"] == "treeguard.bundle/1"
    assert manifest["environment"]["jax"] == jax.__version__


def test_the_prng_key_of_the_step_is_kept(tmp_path: Path) -> None:
    recorder = tg.FlightRecorder(tmp_path, batch="digest")
    train = recorder.wrap(
        tg.optax_step(optax.sgd(0.1)),
        loss=lambda p, b, k: nm.tiny_loss(p, b) + 0.0 * jax.random.uniform(k),
    )
    params = {"w": jnp.ones(3)}
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, train.init(params), BAD, key=jax.random.key(7))
    bundle = tg.read_bundle(info.value.bundle)  # type: ignore[arg-type]
    assert bundle.has_key
    key = bundle.load_state("key", jax.random.key(0))
    assert (jax.random.key_data(key) == jax.random.key_data(jax.random.key(7))).all()


def test_keep_bounds_the_bundles_by_the_recorders_own_count(tmp_path: Path) -> None:
    train = _train(tmp_path, keep=2)
    params = {"w": jnp.ones(3)}
    state = train.init(params)
    paths = [_fail(train, params, state).bundle for _ in range(3)]
    assert [os.path.basename(p or "") for p in paths] == [
        "000001-step0",
        "000002-step0",
        "000003-step0",
    ]
    assert sorted(os.listdir(tmp_path)) == ["000002-step0", "000003-step0"]


def test_a_digest_only_bundle_keeps_no_batch_and_checks_the_one_given(tmp_path: Path) -> None:
    train = _train(tmp_path, batch="digest")
    params = {"w": jnp.ones(3)}
    e = _fail(train, params, train.init(params))
    assert sorted(os.listdir(e.bundle)) == ["BUNDLE.json", "state.safetensors"]  # type: ignore[arg-type]
    with pytest.raises(tg.diagnose.DiagnosisError, match="kept only the batch's spec and digest"):
        replay_bundle(e.bundle, nm.tiny)  # type: ignore[arg-type]
    with pytest.raises(tg.IntegrityError) as info:
        replay_bundle(e.bundle, nm.tiny, batch={"x": jnp.array([1.0, -4.0, 9.5])})  # type: ignore[arg-type]
    assert info.value.path == "['x']" and info.value.exit_code == 1
    assert str(info.value).startswith(
        "the batch given: 1 batch leaf differs from the digest the bundle recorded: ['x']"
    )
    with pytest.raises(tg.TreeMismatchError):
        replay_bundle(e.bundle, nm.tiny, batch={"x": jnp.ones(4)})  # type: ignore[arg-type]
    replay = replay_bundle(e.bundle, nm.tiny, batch=BAD)  # type: ignore[arg-type]
    assert (replay.stage, replay.sites[0].primitive) == ("loss", "sqrt")
    assert replay.sites[0].source.startswith(nm.marked_line("tiny_loss"))


def _no_bundle(train: tg.RecordedStep, reason: str) -> tg.RecorderError:
    params = {"w": jnp.ones(3)}
    e = _fail(train, params, train.init(params))
    assert e.bundle is None and isinstance(e.bundle_error, tg.RecorderError)
    assert e.__cause__ is e.bundle_error and e.bundle_error.reason == reason
    assert str(e).startswith("step 0: 1 leaf holds NaN or Inf in the loss:")
    assert "the flight recorder wrote no bundle: " in str(e)
    return e.bundle_error


def test_a_recorder_directory_that_is_a_link_still_raises_the_nan_error(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    error = _no_bundle(_train(tmp_path / "link"), "a symbolic link")
    assert str(error) == (
        f"{tmp_path / 'link'}: the recorder's directory is a symbolic link\n"
        "hint: point the recorder at a real directory; it never follows a link"
    )
    assert os.listdir(tmp_path / "real") == []
    (tmp_path / "file").write_text("")
    _no_bundle(_train(tmp_path / "file"), "not a directory")


@contextlib.contextmanager
def small_file_limit() -> Iterator[None]:
    """Files written meanwhile fail past 4 KiB with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_write_that_fails_leaves_nothing_and_is_reported_with_the_nan_error(
    tmp_path: Path,
) -> None:
    recorder = tg.FlightRecorder(tmp_path, batch="digest")
    train = recorder.wrap(tg.optax_step(optax.sgd(0.1)), loss=nm.tiny_loss)
    params = {"w": jnp.ones(2048)}  # 8 KiB of params
    state = train.init(params)
    batch = {"x": jnp.full(2048, -1.0)}
    train(params, state, {"x": jnp.ones(2048)})  # compiled before the limit
    with small_file_limit(), pytest.raises(tg.NonFiniteError) as info:
        train(params, state, batch)
    error = info.value.bundle_error
    assert isinstance(error, tg.RecorderError) and error.reason == "EFBIG"
    assert str(error).startswith(f"{tmp_path}: writing the params and optimizer state failed: ")
    assert isinstance(error.__cause__, OSError)
    assert os.listdir(tmp_path) == []  # no half bundle, no temporary directory


def test_a_step_function_jitted_with_donation_is_recorded_with_its_inputs(tmp_path: Path) -> None:
    @jax.jit
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss = nm.tiny_loss(params, batch)
        return jax.tree.map(lambda p: p - 0.1 * loss, params), opt_state, loss

    donating = jax.jit(step, donate_argnums=(0,))
    train = tg.FlightRecorder(tmp_path, batch="record").wrap(donating)
    params = {"w": jnp.ones(3)}
    params, _, _ = train(params, (), GOOD)
    before = np.asarray(params["w"])
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, (), BAD)
    assert not params["w"].is_deleted()  # the recorder's program does not donate
    e = info.value
    assert (e.where, e.path) == ("the loss", "")
    assert "in the updated params" in str(e)
    stored = tg.read_bundle(e.bundle).load_state("params", params)  # type: ignore[arg-type]
    np.testing.assert_array_equal(np.asarray(stored["w"]), before)
    # a plain (not jitted) step is checked after it runs, in one dispatch
    plain = tg.FlightRecorder(tmp_path, batch="record").wrap(step.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(tg.NonFiniteError, match="step 0: 1 leaf holds NaN or Inf in the loss"):
        plain(params, (), BAD)


def test_a_step_function_with_an_inf_in_its_state_is_refused_by_leaf(tmp_path: Path) -> None:
    dtypes = {"bf16": jnp.bfloat16, "f32": jnp.float32}
    state = {n: jnp.full((5, 3), jnp.finfo(d).max, d) for n, d in dtypes.items()}

    @jax.jit
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        return params, {n: opt_state[n] + batch[n] for n in dtypes}, jnp.sum(params["w"])

    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(step)
    zeros = {n: jnp.zeros((5, 3), d) for n, d in dtypes.items()}
    params = {"w": jnp.ones(3)}
    params, state, _ = train(params, state, zeros)  # at the largest values, still finite
    assert train.step_number == 1 and not any(tmp_path.iterdir())
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, state, dict(zeros, bf16=zeros["bf16"].at[4, 2].set(-jnp.inf)))
    e = info.value
    assert (e.where, e.path, e.state_counts) == ("the updated state", "['bf16']", {"['bf16']": 1})
    assert e.bundle == str(tmp_path / "000001-step1") and train.step_number == 1


def test_an_eager_step_returning_host_values_is_judged_at_their_own_dtype(
    tmp_path: Path,
) -> None:
    # without x64, a numpy f64 beyond f32's range would turn Inf on the device
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        return params, opt_state, np.float64(batch) * 1e10

    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(step)
    params, state = {"w": jnp.ones(2)}, {"m": np.zeros(2)}
    _, _, loss = train(params, state, 1e30)
    assert loss == np.float64(1e40) and not any(tmp_path.iterdir())
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, state, np.inf)
    assert info.value.where == "the loss"
    with pytest.raises(tg.NonFiniteError) as info:
        train({"w": jnp.array([1.0, jnp.nan])}, state, 1.0)  # a device leaf still counts
    assert info.value.path == "['w']"


def test_what_the_recorder_refuses_to_wrap(tmp_path: Path) -> None:
    recorder = tg.FlightRecorder(tmp_path, batch="record")
    with pytest.raises(tg.ConfigError, match="recorded with the loss it is trained on"):
        recorder.wrap(tg.optax_step(optax.sgd(0.1)))
    with pytest.raises(tg.ConfigError, match="on_nonfinite='skip'"):
        recorder.wrap(tg.optax_step(optax.sgd(0.1), on_nonfinite="skip"), loss=nm.tiny_loss)
    with pytest.raises(tg.ConfigError, match="loss= goes with an OptaxStep"):
        recorder.wrap(lambda p, s, b: (p, s), loss=nm.tiny_loss)
    with pytest.raises(tg.ConfigError, match="not a function or an OptaxStep"):
        recorder.wrap(3)
    train = recorder.wrap(lambda p, s, b: p)
    with pytest.raises(tg.ConfigError, match="returned dict, not a tuple"):
        train({"w": jnp.ones(3)}, (), GOOD)


def test_diagnose_bundle_names_the_equation_and_its_line(tmp_path: Path) -> None:
    params = {"w": jnp.ones(3)}
    train = _train(tmp_path)
    e = _fail(train, params, train.init(params))
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny")
    assert code == 1, out
    assert out.splitlines()[:2] == [
        f"bundle {e.bundle}: step 0, recorded first in the loss",
        f"first non-finite value: forward equation 0 (sqrt) at {nm.marked_line('tiny_loss')} "
        "(tiny_loss): 1 nan in f32[3] from finite inputs f32[3]",
    ]
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["stage"] == "loss" and doc["sites"][0]["primitive"] == "sqrt"
    code, out = _diagnose(
        "--bundle", str(e.bundle), "recorder.nanmodels:tiny", "--batch", str(e.bundle)
    )
    assert code == 2
    code, out = _diagnose("recorder.nanmodels:tiny", "--batch", "b.safetensors")
    assert code == 2 and "--batch goes with --bundle" in out


def test_diagnose_bundle_finds_a_nan_born_in_the_optimizer(tmp_path: Path) -> None:
    train = tg.FlightRecorder(tmp_path, batch="record").wrap(
        tg.optax_step(nm.exploding), loss=nm.tiny_loss
    )
    params = {"w": jnp.ones(3)}
    e = _fail(train, params, train.init(params), GOOD)
    assert (e.where, e.path) == ("the updated params", "['w']")
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny_exploding")
    assert code == 1, out
    assert f"(exp) at {nm.marked_line('_explode')}" in out
    # the same bundle replayed on a model whose optimizer stays finite: not reproduced
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny_tame")
    assert code == 3 and "the step is not reproduced from the bundle" in out
    # and on a model whose optimizer state has another structure: every mismatch
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny")
    assert code == 1 and "node type tuple in `like`, optax._src.base.EmptyState" in out


def test_diagnose_bundle_checks_a_digest_only_bundles_batch(tmp_path: Path) -> None:
    train = _train(tmp_path / "nan", batch="digest")
    params = {"w": jnp.ones(3)}
    e = _fail(train, params, train.init(params))
    code, out = _diagnose("--bundle", str(e.bundle), "recorder.nanmodels:tiny")
    assert code == 2 and 'kept only the batch\'s spec and digest (batch="digest")' in out
    tg.save(tmp_path / "other.safetensors", {"x": jnp.array([1.0, -4.0, 8.0])})
    code, out = _diagnose(
        "--bundle",
        str(e.bundle),
        "recorder.nanmodels:tiny",
        "--batch",
        str(tmp_path / "other.safetensors"),
    )
    assert code == 1 and "1 batch leaf differs from the digest the bundle recorded: ['x']" in out
    tg.save(tmp_path / "batch.safetensors", BAD)
    code, out = _diagnose(
        "--bundle",
        str(e.bundle),
        "recorder.nanmodels:tiny",
        "--batch",
        str(tmp_path / "batch.safetensors"),
    )
    assert code == 1 and nm.marked_line("tiny_loss") in out


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_a_tampered_bundle_is_refused(tmp_path: Path) -> None:
    train = _train(tmp_path / "nan", keep=4)
    params = {"w": jnp.ones(3)}
    state = train.init(params)
    bundles = [Path(_fail(train, params, state).bundle or "") for _ in range(4)]
    # a tensor's bytes changed
    _flip_last_byte(bundles[0] / "state.safetensors")
    code, out = _diagnose("--bundle", str(bundles[0]), "recorder.nanmodels:tiny")
    assert code == 1 and "1 tensor corrupt (blake3 mismatch):\n  ['params']['w']: f32[3]" in out
    # a file swapped for another valid checkpoint
    tg.save(bundles[1] / "batch.safetensors", GOOD)
    code, out = _diagnose("--bundle", str(bundles[1]), "recorder.nanmodels:tiny")
    assert code == 1 and "the file changed since its digest was recorded" in out, out
    # the manifest edited by hand
    manifest = bundles[2] / "BUNDLE.json"
    manifest.write_text(manifest.read_text().replace('"step":0', '"step":9'))
    code, out = _diagnose("--bundle", str(bundles[2]), "recorder.nanmodels:tiny")
    assert code == 1 and "the manifest does not match its own digest" in out
    # a file removed, and a directory that is no bundle
    (bundles[3] / "batch.safetensors").unlink()
    code, out = _diagnose("--bundle", str(bundles[3]), "recorder.nanmodels:tiny")
    assert code == 2 and "the bundle's batch.safetensors is missing" in out
    code, out = _diagnose("--bundle", str(tmp_path), "recorder.nanmodels:tiny")
    assert code == 2 and "no flight-recorder bundle here (no BUNDLE.json)" in out
    (tmp_path / "link").symlink_to(bundles[3])
    code, out = _diagnose("--bundle", str(tmp_path / "link"), "recorder.nanmodels:tiny")
    assert code == 2 and "the bundle is a symbolic link" in out
