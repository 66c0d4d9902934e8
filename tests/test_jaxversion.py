"""A jax older than the supported floor is refused when treeguard's code is
first imported, naming the supported range; newer versions are accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
from subproc import ROOT, run_python

# The version gate on purpose: ``import treeguard`` runs it once, with the installed jax.
from treeguard._src.jaxversion import (  # _src: the version gate runs once at import
    check_jax_version,
    installed_jax,
)

MESSAGE = (
    "treeguard needs jax >= 0.10 (CI runs 0.10.2, 0.11.2 and 0.12.0.1); "
    "this environment has jax 0.9.2\n"
    "hint: pip install -U 'jax>=0.10' 'jaxlib>=0.10'"
)


@pytest.mark.parametrize(
    "version", ["0.10.0", "0.10.2", "0.11.2", "0.12.0.1", "1.0.0", "0.13.0rc1"]
)
def test_supported_versions_pass(version: str) -> None:
    check_jax_version(version)


@pytest.mark.parametrize("version", ["0.9.2", "0.4.38", "0.1"])
def test_older_versions_are_refused_with_the_range(version: str) -> None:
    with pytest.raises(ImportError) as e:
        check_jax_version(version)
    assert str(e.value) == MESSAGE.replace("0.9.2", version)


def test_the_installed_jax_is_read_without_importing_it() -> None:
    import jax

    assert installed_jax() == jax.__version__


def test_an_old_jax_fails_at_import_with_the_range(tmp_path: Path) -> None:
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('the fake jax was imported')\n")
    (fake / "version.py").write_text('_version = "0.9.2"\n')
    code = "import treeguard\ntry:\n    treeguard.check\nexcept ImportError as e:\n    print(e)\n"
    done = run_python(code, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == MESSAGE
