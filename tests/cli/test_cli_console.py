"""What the commands print from a file has its control characters spelled out."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from subproc import run_python

import treeguard as tg
from treeguard import LeafSpec
from treeguard._cli.main import main


def test_spec_spells_out_escapes_in_a_file_s_names_and_symbols(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    tg.spec_of({"a": {"w\x1b[2J": LeafSpec(("B\x1b]0;x\x07", 2), "float32")}}).save(path)
    res = CliRunner().invoke(main, ["spec", str(path)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert r"['w\x1b[2J'] f32[B\x1b]0;x\x07,2]  symbolic params  -" in res.output


def _tricky_spec(path: Path) -> Path:
    tree = {
        ":smile:": LeafSpec((3,), "float32"),  # an emoji code rich's markup would replace
        "[b]x\\": {"c\tz": LeafSpec(("B", 2), "int8")},
        "e": {},
        "l": [LeafSpec((1,), "bool"), (LeafSpec((), "float16"), None)],
        "é漢": LeafSpec((0, 2), "bfloat16"),
    }
    tg.spec_of(tree).save(path)
    return path


# rich's Tree on a UTF-8 stream without styles, as `treeguard spec` prints it
_TRICKY = """\
{path}  5 leaves  symbolic dims  -
├── [':smile:'] f32[3]  3 params  12 B
├── ['[b]x\\\\'] dict  1 leaves
│   └── ['c\\tz'] i8[B,2]  symbolic params  -
├── ['e'] dict  0 leaves  0 params
├── ['l'] list  2 leaves  2 params
│   ├── [0] bool[1]  1 params  1 B
│   └── [1] tuple  1 leaves  1 params
│       ├── [0] f16[]  1 params  2 B
│       └── [1] none  0 leaves  0 params
└── ['é漢'] bf16[0,2]  0 params  0 B
"""


def test_spec_prints_without_rich_what_rich_prints(tmp_path: Path) -> None:
    path = _tricky_spec(tmp_path / "s.json")
    plain = CliRunner(env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None})
    # FORCE_COLOR="" leaves a pipe uncoloured but sends the tree through rich
    through_rich = CliRunner(env={"FORCE_COLOR": "", "TTY_COMPATIBLE": None})
    res, rich_res = (
        plain.invoke(main, ["spec", str(path)]),
        through_rich.invoke(main, ["spec", str(path)]),
    )
    assert res.exit_code == rich_res.exit_code == 0, res.output + rich_res.output
    assert rich_res.stdout == _TRICKY.format(path=path)
    assert res.stdout == rich_res.stdout


def test_spec_of_a_leaf_prints_without_rich_what_rich_prints(tmp_path: Path) -> None:
    path = tmp_path / "leaf.json"
    tg.spec_of(LeafSpec((2,), "int32")).save(path)
    outs = [
        CliRunner(env={"FORCE_COLOR": color, "TTY_COMPATIBLE": None})
        .invoke(main, ["spec", str(path)])
        .stdout
        for color in (None, "")
    ]
    assert outs == [f"{path}  1 leaves  2 params  8 B\n└── i32[2]\n"] * 2


_MODULES_OF_SPEC = """\
import os, sys
from treeguard._cli.main import main
os.environ.pop("TTY_COMPATIBLE", None)
os.environ.pop("FORCE_COLOR", None)
os.environ.update(dict(arg.split("=", 1) for arg in sys.argv[2:]))
main(["spec", sys.argv[1]], standalone_mode=False)
print(sorted(m for m in ("rich", "jax") if m in sys.modules))
"""


def test_spec_of_a_checkpoint_into_a_pipe_imports_neither_rich_nor_jax(tmp_path: Path) -> None:
    import numpy as np

    ckpt = tmp_path / "m.safetensors"
    tg.save(ckpt, {"w": np.zeros((2, 3), np.float32)})
    piped = run_python(_MODULES_OF_SPEC, str(ckpt))  # stdout: a pipe
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.splitlines() == [
        f"{ckpt}  1 leaves  6 params  24 B",
        "└── ['w'] f32[2,3]  6 params  24 B",
        "[]",
    ]
    colored = run_python(_MODULES_OF_SPEC, str(ckpt), "FORCE_COLOR=1")  # rich's, on a pipe
    assert colored.returncode == 0, colored.stderr
    assert colored.stdout.splitlines()[-1] == "['rich']"
