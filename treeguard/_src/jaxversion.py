"""The range of jax releases treeguard supports, checked when treeguard's
code is first imported, from the installed package's ``version.py`` (so a
command that only reads files still does not import jax).

Features that differ between supported releases are probed where they are
used (``jax.set_mesh`` or ``jax.sharding.use_mesh``, a mesh's
``axis_types``), never compared by version; only the floor is a version.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

#: The oldest jax treeguard runs on: mesh axis types and ``jax.sharding.reshard``.
FLOOR = (0, 10)
_VERSION = re.compile(r'^_version(?::\s*str)?\s*=\s*"([^"]+)"', re.MULTILINE)
#: The releases CI runs, oldest first.
TESTED = ("0.10.2", "0.11.2", "0.12.1")


def supported_range() -> str:
    """The supported range in words.

    Example:
      >>> supported_range()
      'jax >= 0.10 (CI runs 0.10.2, 0.11.2 and 0.12.1)'
    """
    tested = ", ".join(TESTED[:-1]) + f" and {TESTED[-1]}"
    return f"jax >= {FLOOR[0]}.{FLOOR[1]} (CI runs {tested})"


def check_jax_version(found: str | None) -> None:
    """Refuses a jax older than ``FLOOR``.

    Args:
      found: the installed jax's version string, or None when its metadata
        cannot be read (a vendored jax): then nothing is checked.

    Raises:
      ImportError: naming the version found and the supported range.

    Example:
      >>> check_jax_version("0.12.0.1")
      >>> check_jax_version("0.9.2")
      Traceback (most recent call last):
      ...
      ImportError: treeguard needs jax >= 0.10 (CI runs 0.10.2, 0.11.2 and 0.12.1); \
this environment has jax 0.9.2
      hint: pip install -U 'jax>=0.10' 'jaxlib>=0.10'
    """
    if found is None:
        return
    m = re.match(r"(\d+)\.(\d+)", found)
    if m is None or (int(m.group(1)), int(m.group(2))) >= FLOOR:
        return
    floor = f"{FLOOR[0]}.{FLOOR[1]}"
    raise ImportError(
        f"treeguard needs {supported_range()}; this environment has jax {found}\n"
        f"hint: pip install -U 'jax>={floor}' 'jaxlib>={floor}'"
    )


def installed_jax() -> str | None:
    """The installed jax's version, read from its ``version.py`` without
    importing jax (or ``importlib.metadata``, which costs more to import than
    the check is worth); None when it cannot be read."""
    try:
        spec = importlib.util.find_spec("jax")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    if origin is None:
        return None
    try:
        text = (pathlib.Path(origin).parent / "version.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    m = _VERSION.search(text)
    return m.group(1) if m else None
