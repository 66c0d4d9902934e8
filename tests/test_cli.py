"""The command line, in process through click's CliRunner: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import pytest
from click.testing import CliRunner, Result
from corpus import seed_params

import treeguard as tg
from treeguard._cli.main import main


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def specs(tmp_path: Path) -> tuple[Path, Path]:
    good = tmp_path / "good.json"
    tg.spec_of(seed_params()).save(good)
    changed = seed_params()
    changed["dense_2"] = changed.pop("dense2")
    changed["dense1"]["b"] = jnp.zeros((2, 3))
    bad = tmp_path / "bad.json"
    tg.spec_of(changed).save(bad)
    return good, bad


def test_spec_prints_the_tree(specs: tuple[Path, Path]) -> None:
    out = _run("spec", str(specs[0]))
    assert out.exit_code == 0, out.stderr
    assert "4 leaves  13 params  52 B" in out.stdout
    assert "['w'] f32[2,3]  6 params  24 B" in out.stdout
    assert "['dense1'] dict  2 leaves  9 params" in out.stdout


def test_spec_json_is_the_file(specs: tuple[Path, Path]) -> None:
    out = _run("spec", str(specs[0]), "--json")
    assert out.exit_code == 0
    assert out.stdout == specs[0].read_text()


def test_diff_match_exits_0(specs: tuple[Path, Path]) -> None:
    out = _run("diff", str(specs[0]), str(specs[0]))
    assert out.exit_code == 0
    assert "match" in out.stdout


def test_diff_mismatch_exits_1_and_lists_everything(specs: tuple[Path, Path]) -> None:
    good, bad = specs
    out = _run("diff", str(good), str(bad))
    assert out.exit_code == 1
    lines = out.stdout.splitlines()
    assert lines[0] == f"3 mismatches between {bad} and {good}:"
    assert f"  ['dense1']['b']: shape (3,) in {good}, (2, 3) in {bad}" in lines
    assert lines[-1] == f"hint: `['dense_2']` in {bad}: did you mean `['dense2']`?"


def test_diff_json(specs: tuple[Path, Path]) -> None:
    out = _run("diff", str(specs[0]), str(specs[1]), "--json")
    assert out.exit_code == 1
    payload = json.loads(out.stdout)
    assert payload["match"] is False
    assert payload["mismatches"][0] == {
        "path": "['dense1']['b']",
        "kind": "shape",
        "expected": [3],
        "actual": [2, 3],
    }


@pytest.mark.parametrize("content", ["{", '{"format": "treeguard.spec/7", "tree": {}}', "\x00\x01"])
def test_unreadable_input_exits_2(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text(content)
    out = _run("spec", str(bad))
    assert out.exit_code == 2
    assert out.stderr.startswith(f"error: {bad}: ")


def test_missing_file_and_usage_exit_2(tmp_path: Path) -> None:
    assert _run("spec", str(tmp_path / "nope.json")).exit_code == 2
    assert _run("diff", "only-one").exit_code == 2
    assert _run("no-such-command").exit_code == 2


_JAX_FREE_CHILD = r"""
import contextlib, io, json, sys

import treeguard, treeguard._cli.main

after_import = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("jax", "jaxlib")
    or m in ("treeguard.verify", "treeguard.serving", "treeguard.bench", "treeguard.diagnose")
)
main = treeguard._cli.main.main
ckpt, spec, store, foreign = sys.argv[1:5]


def helps(group, path):
    yield [*path, "--help"]
    for name in getattr(group, "list_commands", lambda ctx: [])(None):
        yield from helps(group.get_command(None, name), [*path, name])


runs = []
for args in [
    ["spec", ckpt], ["spec", "--json", ckpt], ["spec", spec], ["diff", spec, ckpt],
    ["ckpt", "inspect", ckpt], ["ckpt", "inspect", "--json", ckpt],
    ["store", "ls", store], ["store", "ls", "--json", store],
    ["spec", foreign], ["ckpt", "inspect", foreign], ["diff", foreign, foreign],
    *helps(main, []),
]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main.main(args, prog_name="treeguard", standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = e.code
    runs.append([args, code, "jax" in sys.modules, len(out.getvalue())])
print(json.dumps({"after_import": after_import, "runs": runs}))
"""


def test_file_only_commands_never_import_jax(tmp_path: Path) -> None:
    import ml_dtypes
    import numpy as np
    from subproc import run_python

    tree = {"enc": {"w": np.ones((2, 3), np.float32)}, "h": np.zeros(2, ml_dtypes.bfloat16)}
    ckpt, spec, store = tmp_path / "m.safetensors", tmp_path / "m.spec.json", tmp_path / "store"
    tg.save(ckpt, tree)
    tg.spec_of(tree).save(spec)
    tg.ArtifactStore(store).put(tree)
    foreign = Path(__file__).parent / "data" / "chess_cv_pieces.safetensors"  # written by MLX
    out = run_python(_JAX_FREE_CHILD, str(ckpt), str(spec), str(store), str(foreign))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["after_import"] == []
    runs = report["runs"]
    helps = [args for args, *_ in runs if args[-1] == "--help"]
    assert ["ckpt", "inspect", "--help"] in helps and ["serve", "run", "--help"] in helps
    assert len(helps) >= 15
    for args, code, jax_loaded, printed in runs:
        assert (code, jax_loaded) == (0, False), args
        assert printed > 0, args


def test_every_ml_dtypes_type_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    import ml_dtypes
    import numpy as np

    numeric = sorted(
        name
        for name in dir(ml_dtypes)
        if name.startswith(("float", "int", "uint", "bfloat"))
        and isinstance(getattr(ml_dtypes, name), type)
    )
    assert {"bfloat16", "float8_e4m3fn", "int4"} <= set(numeric)
    for name in numeric:
        dtype = np.dtype(getattr(ml_dtypes, name))
        path = tmp_path / f"{name}.safetensors"
        tg.save(path, {"w": np.zeros(4, dtype)})
        assert tg.read_header(path).spec.leaves[0].dtype == dtype, name
        assert tg.load(path)["w"].dtype == dtype, name


def test_long_key_paths_are_never_cut(tmp_path: Path) -> None:
    import numpy as np

    stem = "encoder.layer.5.attention.self." + "q" * 140
    tree = {
        f"{stem}.a": {"kernel": np.zeros((2, 2), np.float32)},
        f"{stem}.b": {"kernel": np.zeros((2, 2), np.float32)},
    }
    ckpt = tmp_path / "long.safetensors"
    tg.save(ckpt, tree)
    paths = [f"['{stem}.a']['kernel']", f"['{stem}.b']['kernel']"]
    assert all(len(p) > 150 for p in paths)

    def lines(*args: str) -> list[str]:
        out = _run(*args)
        assert out.exit_code in (0, 1), out.output
        return out.stdout.splitlines()

    inspected = lines("ckpt", "inspect", str(ckpt))
    for path in paths:
        assert sum(path in line for line in inspected) == 1, path
    assert not any("…" in line for line in inspected)
    shown = lines("spec", str(ckpt))
    for key in (f"['{stem}.a']", f"['{stem}.b']"):
        assert any(key in line for line in shown), key
    changed = tmp_path / "changed.json"
    tg.spec_of({**tree, f"{stem}.b": {"kernel": np.zeros(3, np.float32)}}).save(changed)
    diffed = lines("diff", str(ckpt), str(changed))
    assert any(paths[1] in line and "shape" in line for line in diffed), diffed
    root = tmp_path / "store"
    tg.ArtifactStore(root).put(tree)
    listed = lines("store", "ls", str(root))
    assert not any("…" in line for line in listed)


def test_a_safetensors_file_that_begins_with_a_brace_is_read_as_one(tmp_path: Path) -> None:
    # A header of 123 bytes makes the file's first byte "{", as a spec JSON's is:
    # spec tells the two apart by the zero bytes of the header's length.
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    header = header.ljust(123).encode()
    path = tmp_path / "brace.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    assert path.read_bytes()[:1] == b"{"
    out = _run("spec", str(path))
    assert out.exit_code == 0, out.output
    assert "['w'] f32[1]  1 params  4 B" in out.stdout
    spec = tmp_path / "w.spec.json"
    tg.spec_of({"w": jnp.zeros(1)}).save(spec)
    assert _run("diff", str(spec), str(path)).exit_code == 0
