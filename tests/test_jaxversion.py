"""A jax older than the supported floor is refused when treeguard's code is
first imported, naming the supported range; newer versions are accepted.

Each version is installed as a fake jax (the installed jax's own
``version.py`` with its version replaced, and an ``__init__`` that says it
was imported) and a name whose module imports jax is looked up, as a user would."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from subproc import ROOT, run_python

MESSAGE = (
    "treeguard needs jax >= 0.10 (CI runs 0.10.2, 0.11.2 and 0.12.1); "
    "this environment has jax 0.9.2\n"
    "hint: pip install -U 'jax>=0.10' 'jaxlib>=0.10'"
)
SUPPORTED = ["0.10.0", "0.10.2", "0.11.2", "0.12.0.1", "1.0.0", "0.13.0rc1"]
OLDER = ["0.9.2", "0.4.38", "0.1"]

# For each version: a fresh import of treeguard against a fake jax of that version.
_IMPORT_EACH = """
import importlib, json, pathlib, sys
fake = pathlib.Path(sys.argv[1])
results = {}
for version in json.loads(sys.argv[2]):
    (fake / "version.py").write_text(sys.argv[3].replace("@VERSION@", version))
    for name in [m for m in sys.modules if m.split(".")[0] in ("treeguard", "jax")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    import treeguard
    try:
        treeguard.count_nonfinite  # its module imports jax
        results[version] = "imported without jax"
    except ImportError as e:
        results[version] = str(e)
    except RuntimeError as e:  # the gate let it through to jax itself
        results[version] = str(e)
print(json.dumps(results))
"""


def _installed_version_py() -> str:
    """The installed jax's ``version.py``, its version left as ``@VERSION@``."""
    spec = importlib.util.find_spec("jax")
    assert spec is not None and spec.origin is not None
    text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    text, n = re.subn(r'^_version(: str)? = "[^"]+"', '_version = "@VERSION@"', text, flags=re.M)
    assert n == 1, "the installed jax's version.py no longer sets _version"
    return text


def _import_with(tmp_path: Path, versions: list[str]) -> dict[str, str]:
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('the fake jax was imported')\n")
    done = run_python(
        _IMPORT_EACH,
        str(fake),
        json.dumps(versions),
        _installed_version_py(),
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_supported_versions_pass_and_older_ones_fail_at_import_with_the_range(
    tmp_path: Path,
) -> None:
    # the installed jax's version.py, read without importing jax: a supported
    # version reaches jax's own import (the fake's error), an older one never does
    results = _import_with(tmp_path, SUPPORTED + OLDER)
    for version in SUPPORTED:
        assert results[version] == "the fake jax was imported", version
    for version in OLDER:
        assert results[version] == MESSAGE.replace("0.9.2", version)


def test_a_bare_version_file_is_read_too(tmp_path: Path) -> None:
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('the fake jax was imported')\n")
    (fake / "version.py").write_text('_version = "0.9.2"\n')
    code = "import treeguard\ntry:\n    treeguard.check\nexcept ImportError as e:\n    print(e)\n"
    done = run_python(code, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == MESSAGE
