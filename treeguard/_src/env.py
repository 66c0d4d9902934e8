"""The environment fingerprint: what produced an artifact or a report.

Every checkpoint and every verification report records where it was made, so
a difference between two runs can be traced to a changed library, backend or
precision setting rather than guessed at.
"""

from __future__ import annotations

import functools
import platform
import sys
from typing import Any

import numpy as np

#: The keys ``environment()`` always returns, in report order.
KEYS: tuple[str, ...] = (
    "python",
    "jax",
    "jaxlib",
    "numpy",
    "ml_dtypes",
    "backend",
    "device_kind",
    "device_count",
    "x64",
    "matmul_precision",
    "platform",
)


@functools.cache  # the module imported stays the one it is, whatever is installed since
def _version(dist: str) -> str:
    # importlib.metadata (email, zipfile, csv...) costs a command that only reads a file
    # (``treeguard spec``) more than any other import it makes: only once a fingerprint is taken
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def environment() -> dict[str, object]:
    """The fingerprint of the running environment, as JSON-ready values.

    Returns:
      A new dict with, in this order: ``python``, ``jax``, ``jaxlib``,
      ``numpy`` and ``ml_dtypes`` versions; the default ``backend`` (``cpu``,
      ``gpu``, ``tpu``); the first device's ``device_kind``; the
      ``device_count``; whether ``x64`` is enabled; the default
      ``matmul_precision`` (``None`` for JAX's default); and the OS and
      machine as ``platform``. Every value is a str, int, bool or None.

    Raises:
      RuntimeError: if JAX cannot initialise any backend.

    Example:
      >>> env = environment()
      >>> list(env) == list(KEYS)
      True
      >>> import jax
      >>> env["jax"] == jax.__version__, isinstance(env["device_count"], int)
      (True, True)
    """
    import jax  # lazy: reading files never imports jax

    config: Any = jax.config
    devices = jax.devices()
    precision = config.jax_default_matmul_precision
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "numpy": np.__version__,
        "ml_dtypes": _version("ml_dtypes"),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "none",
        "device_count": len(devices),
        "x64": bool(config.jax_enable_x64),
        "matmul_precision": None if precision is None else str(precision),
        "platform": f"{sys.platform}-{platform.machine()}",
    }


def environment_diff(
    recorded: dict[str, Any], current: dict[str, Any] | None = None
) -> list[tuple[str, object, object]]:
    """The keys on which a recorded fingerprint differs from another one.

    Args:
      recorded: a fingerprint read back from an artifact.
      current: the one to compare with; the running environment by default.

    Returns:
      ``(key, recorded value, current value)`` for each differing key, in
      ``KEYS`` order, then any extra keys in sorted order. A key absent on
      one side shows as ``None`` there.

    Example:
      >>> env = environment()
      >>> environment_diff(env, env)
      []
      >>> environment_diff({**env, "jax": "0.0.1"})[0][:2]
      ('jax', '0.0.1')
    """
    now = environment() if current is None else current
    extra = sorted((set(recorded) | set(now)) - set(KEYS))
    return [
        (k, recorded.get(k), now.get(k)) for k in (*KEYS, *extra) if recorded.get(k) != now.get(k)
    ]
