"""The one ``MODULE:ATTR`` loader, and model code that must not decide an exit status.

Every command that takes a model (verify, bench, diagnose, serve plan) runs
in this process through click's CliRunner, on modules written beside a
temporary current directory that is not on ``PYTHONPATH``.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from subproc import run_python

from treeguard._cli.main import main

Writer = Callable[[str, str], str]


@pytest.fixture
def beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Writer]:
    """Writes modules into a fresh current directory; undoes the loader's
    ``sys.path`` entry and forgets the modules afterwards."""
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)

    def write(name: str, code: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
        return name

    yield write
    sys.path[:] = path_before
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(str(tmp_path)):
            del sys.modules[name]


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_line(text: str) -> str:
    return " ".join(text.split())


MLP_BESIDE = """
import dataclasses
from treeguard.examples import mlp
model = dataclasses.replace(mlp.model, references=None)
"""


def test_a_module_beside_the_cwd_is_found_without_pythonpath(beside: Writer) -> None:
    name = beside("tg_beside_cwd", MLP_BESIDE)
    assert str(Path.cwd()) not in sys.path
    res = _run("diagnose", f"{name}:model", "--stages", "data,shapes", "--report-dir", "d")
    assert res.exit_code == 0, res.output
    assert str(Path.cwd()) in sys.path


def test_a_missing_module_names_where_it_was_looked_for(beside: Writer) -> None:
    res = _run("verify", "tg_not_there_at_all:model", "--no-bench")
    assert res.exit_code == 2
    text = _one_line(res.stderr)
    assert "cannot import module 'tg_not_there_at_all'" in text
    assert f"treeguard looks in the current directory ({Path.cwd()}) and on sys.path" in text


EXIT_AT_IMPORT = """
import inspect
import sys
sys.exit(0)
"""

EXIT_IN_INIT = """
import dataclasses, sys
from treeguard.examples import mlp

def init(key):
    sys.exit(0)

model = dataclasses.replace(mlp.model, init=init, references=None)
"""


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "--no-bench", "--report-dir", "r"),
        ("bench", "--samples", "1", "--min-time", "0", "--batch-sizes", "2"),
        ("diagnose", "--stages", "shapes", "--report-dir", "d"),
    ],
    ids=["verify", "bench", "diagnose"],
)
def test_sys_exit_0_in_model_code_never_exits_0(beside: Writer, args: tuple[str, ...]) -> None:
    command, *options = args
    at_import = beside("tg_exit_at_import", EXIT_AT_IMPORT)
    res = _run(command, f"{at_import}:model", *options)
    assert res.exit_code == 4, res.output
    assert res.stderr.startswith(f"error: importing '{at_import}' raised SystemExit(0) at ")
    assert "the model's code ended the run before it began" in res.stderr
    in_init = beside("tg_exit_in_init", EXIT_IN_INIT)
    res = _run(command, f"{in_init}:model", *options)
    assert res.exit_code == 4, res.output
    text = _one_line(res.stderr)
    assert f"SystemExit(0) was raised while `treeguard {command}" in text
    assert "hint: a model's functions return or raise an exception" in text


def test_a_keyboard_interrupt_in_model_code_exits_130(beside: Writer) -> None:
    name = beside(
        "tg_interrupting",
        EXIT_IN_INIT.replace("sys.exit(0)", "raise KeyboardInterrupt"),
    )
    res = _run("bench", f"{name}:model", "--samples", "1", "--min-time", "0", "--batch-sizes", "2")
    assert res.exit_code == 130, res.output
    assert "`treeguard bench run` was interrupted (KeyboardInterrupt)" in res.stderr


def test_a_module_with_a_syntax_error_is_a_model_code_error(beside: Writer) -> None:
    name = beside("tg_syntax_error", "model = (\n")
    res = _run("verify", f"{name}:model", "--no-bench")
    assert res.exit_code == 4, res.output
    text = _one_line(res.stderr)
    assert text.startswith(f"error: importing '{name}' raised SyntaxError: ")
    assert f"{name}.py, line 1)" in text and "Traceback" not in res.output


def test_an_import_that_raises_is_a_model_code_error_naming_the_line(beside: Writer) -> None:
    name = beside("tg_raises_at_import", "x = 1\nraise RuntimeError('no GPU here')\n")
    res = _run("serve", "plan", f"{name}:model")
    assert res.exit_code == 4, res.output
    assert res.stderr.startswith(
        f"error: importing '{name}' raised RuntimeError: no GPU here at "
        f"{Path.cwd() / name}.py:2\nhint: fix the model's code"
    )


def test_a_missing_import_inside_the_model_is_the_model_s_error(beside: Writer) -> None:
    name = beside("tg_missing_dep", "import tg_dependency_nobody_has\n")
    res = _run("verify", f"{name}:model", "--no-bench")
    assert res.exit_code == 4, res.output
    assert "raised ModuleNotFoundError: No module named 'tg_dependency_nobody_has'" in res.stderr


NON_EXHAUSTIVE = """
from flax import nnx

class Net(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)  # its mean and var are nnx.BatchStat, not Param

graphdef, params = nnx.split(Net(nnx.Rngs(0)), nnx.Param)  # leaves a remainder: flax raises
"""


def test_a_message_of_several_lines_keeps_them_indented_under_ours(beside: Writer) -> None:
    name = beside("tg_non_exhaustive", NON_EXHAUSTIVE)
    res = _run("verify", f"{name}:model", "--no-bench")
    assert res.exit_code == 4, res.output
    lines = res.stderr.splitlines()
    assert lines[0].startswith(
        f"error: importing '{name}' raised ValueError: Non-exhaustive filters"
    )
    assert "\\n" not in res.stderr and len(lines) > 4
    assert all(line.startswith("  ") for line in lines[1:-1])
    assert any("BatchStat" in line for line in lines[1:-1])
    assert lines[-1].startswith("hint: fix the model's code")
    forged = beside("tg_forged_hint", "raise ValueError('one\\nhint: run rm -rf\\r\\x1b[2J')\n")
    res = _run("verify", f"{forged}:model", "--no-bench")
    assert res.stderr.splitlines()[:2] == [
        f"error: importing '{forged}' raised ValueError: one",
        f"  hint: run rm -rf\\r\\x1b[2J at {Path.cwd() / forged}.py:1",
    ]


FACTORIES = """
def make():
    raise ValueError("no config file")

def make_none():
    return None
"""


def test_a_factory_that_raises_or_returns_another_kind(beside: Writer) -> None:
    name = beside("tg_factories", FACTORIES)
    res = _run("bench", f"{name}:make")
    assert res.exit_code == 4, res.output
    assert res.stderr.startswith(
        f"error: calling {name}:make() raised ValueError: no config file at "
    )
    res = _run("verify", f"{name}:make_none", "--no-bench")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(
        f"error: {name}:make_none() returned a NoneType, not a treeguard.verify.Model"
    )


FUNCTIONS = """
import jax
from treeguard.examples import mlp

jitted = jax.jit(mlp.model.apply)
"""


@pytest.mark.parametrize(
    ("command", "extra", "what"),
    [
        (("verify",), ("--no-bench",), "treeguard.verify.Model"),
        (("bench",), (), "treeguard.verify.Model or a treeguard.bench.Target"),
        (("diagnose",), (), "treeguard.verify.Model"),
        (("serve", "plan"), (), "treeguard.verify.Model"),
    ],
    ids=["verify", "bench", "diagnose", "serve-plan"],
)
def test_a_function_where_a_model_is_expected_is_a_usage_error(
    beside: Writer, command: tuple[str, ...], extra: tuple[str, ...], what: str
) -> None:
    name = beside("tg_functions", FUNCTIONS)
    res = _run(*command, f"{name}:jitted", *extra)
    assert res.exit_code == 2, res.output
    assert (
        f"{name}:jitted is a jitted function (jax.jit) of (params, batch), not a {what}"
        in res.stderr
    )
    res = _run(*command, "treeguard.examples.mlp:loss", *extra)
    assert res.exit_code == 2, res.output
    assert (
        f"treeguard.examples.mlp:loss is a function of (params, batch), not a {what}" in res.stderr
    )


ESCAPES = """
raise RuntimeError("\\x1b[2J\\x1b]0;owned\\x07wiped")
"""


def test_escapes_in_an_exception_s_text_are_spelled_out(beside: Writer) -> None:
    name = beside("tg_escapes", ESCAPES)
    res = _run("verify", f"{name}:model", "--no-bench")
    assert res.exit_code == 4, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert r"RuntimeError: \x1b[2J\x1b]0;owned\x07wiped at " in res.stderr


LOUD_LOSS = """
import dataclasses
from treeguard.examples import mlp

def loss(params, batch):
    raise ValueError("\\x1b[2J\\x1b[31mloss refused")

model = dataclasses.replace(mlp.model, loss=loss, references=None)
"""


def test_escapes_in_verify_s_evidence_column_are_spelled_out(beside: Writer) -> None:
    name = beside("tg_loud_loss", LOUD_LOSS)
    res = _run("verify", f"{name}:model", "--no-bench", "--report-dir", "r")
    assert res.exit_code == 1, res.output
    assert "\x1b" not in res.output
    assert r"ValueError: \x1b[2J\x1b[31mloss refused" in res.stdout


RELATIVE = """
import dataclasses
from treeguard.examples import mlp

model = dataclasses.replace(
    mlp.model, references="refs/ref.safetensors", params_spec="params.spec.json"
)
"""


def test_relative_paths_of_a_model_resolve_against_its_module(
    beside: Writer, tmp_path: Path
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tg_relative.py").write_text(textwrap.dedent(RELATIVE))
    res = _run("verify", "models.tg_relative:model", "--no-bench")
    assert res.exit_code == 2, res.output
    want = tmp_path.resolve() / "models" / "refs" / "ref.safetensors"
    assert f"error: no references at {want}" in _one_line(res.stderr)


def test_import_treeguard_imports_neither_click_nor_rich() -> None:
    proc = run_python(
        "import sys, treeguard\n"
        "treeguard.spec_of, treeguard.TreeguardError\n"
        "print(sorted(m for m in ('click', 'rich') if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_help_of_every_command_starts_without_jax() -> None:
    proc = run_python(
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from treeguard._cli.main import main\n"
        "names = main.list_commands(None)\n"
        "for name in names:\n"
        "    assert CliRunner().invoke(main, [name, '--help']).exit_code == 0, name\n"
        "print(len(names), 'jax' in sys.modules)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["11", "False"]


def test_the_help_lists_each_command_by_its_own_summary_importing_none() -> None:
    proc = run_python(
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from treeguard._cli.main import main\n"
        "assert CliRunner().invoke(main, ['--help']).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('treeguard._cli.') or m in "
        "('numpy', 'rich', 'treeguard._src.checkpoint')))"  # what the help must not load
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "['treeguard._cli.console',",
        "'treeguard._cli.failures',",
        "'treeguard._cli.main']",
    ]
    lazy = CliRunner().invoke(main, ["--help"]).stdout
    ctx = click.Context(main)
    commands = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    assert CliRunner().invoke(main, ["--help"]).stdout == lazy  # as each command would say
    for name, (_, summary) in main.lazy.items():
        help_text = commands[name].help
        assert help_text is not None and inspect.cleandoc(help_text).split("\n\n")[0] == summary


def test_spec_of_a_checkpoint_imports_no_package_metadata(tmp_path: Path) -> None:
    # importlib.metadata (with email, csv, zipfile...) is the environment
    # fingerprint's: a command that only reads a header never takes one
    import numpy as np

    import treeguard as tg

    ckpt = tmp_path / "m.safetensors"
    tg.save(ckpt, {"w": np.zeros((2, 3), np.float32)})
    proc = run_python(
        "import contextlib, io, sys\n"
        "from treeguard._cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['spec', sys.argv[1]], standalone_mode=False)\n"
        "print(sorted(m for m in ('importlib.metadata', 'jax') if m in sys.modules))",
        str(ckpt),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
