"""The CPU devices that tests of meshes take, whatever the default backend.

``conftest.py`` asks JAX for eight CPU devices. On a machine whose default
backend is a TPU or a GPU, ``jax.devices()`` is that accelerator's (one chip
here), so a test that needs several devices takes them from the CPU backend
explicitly; on the CPU box the two are the same devices.
"""

from __future__ import annotations

import functools
import math
import socket
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import jax
import pytest

from tests.subproc import run_python


def cpu_devices(n: int) -> list[Any]:
    """The first ``n`` CPU devices; the test is skipped, saying why, when fewer exist."""
    found = jax.devices("cpu")
    if len(found) < n:
        pytest.skip(f"needs {n} CPU devices, the CPU backend has {len(found)}")
    return found[:n]


def cpu_mesh(
    shape: Sequence[int], names: Sequence[str], axis_types: tuple[Any, ...] | None = None
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` over CPU devices, whatever the default backend."""
    return jax.make_mesh(
        tuple(shape), tuple(names), axis_types, devices=cpu_devices(math.prod(shape))
    )


def on_accelerator() -> bool:
    """Whether the default backend is a TPU or a GPU rather than the CPU."""
    return jax.default_backend() != "cpu"


@functools.cache
def inet_sockets() -> bool:
    """Whether this machine lets a process open an internet socket on the
    loopback (the TPU machine lets none, only unix sockets)."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
    except OSError:
        return False
    return True


def needs_inet_sockets() -> None:
    """Skips the calling test, saying why, where no internet socket can be opened."""
    if not inet_sockets():
        pytest.skip("this machine opens no internet socket, not even on the loopback")


#: How close a float32 result computed on an accelerator is to one computed on
#: the host: a TPU's default matmul precision rounds the inputs to bfloat16
#: (about three digits, seen 2e-4 on the bundled MLP's outputs).
ACCELERATOR_TOLERANCE = {"rtol": 5e-3, "atol": 1e-3}


def matmul_tolerance(rtol: float, atol: float) -> dict[str, float]:
    """``rtol`` and ``atol`` on the CPU backend; no tighter than
    ``ACCELERATOR_TOLERANCE`` on another, where float32 matmuls round."""
    if not on_accelerator():
        return {"rtol": rtol, "atol": atol}
    return {
        "rtol": max(rtol, ACCELERATOR_TOLERANCE["rtol"]),
        "atol": max(atol, ACCELERATOR_TOLERANCE["atol"]),
    }


# A forked child's ``ru_maxrss`` starts at what it holds; it then allocates and
# touches a known number of bytes and prints how much the mark grew.
_PEAK_PROBE = """
import os, resource, sys
import numpy as np
pid = os.fork()
if pid:
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
touched = np.ones(int(sys.argv[1]), np.uint8)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, flush=True)
os._exit(0)
"""


@functools.cache
def peak_rss_per_byte() -> float:
    """How much a forked child's peak resident set (``ru_maxrss``) grows per
    byte of a freshly allocated and touched 8 MiB array: about 1 on Linux
    (1.2 on the CPU box), 2.1 under the TPU machine's gVisor."""
    size = 8 << 20
    done = run_python(_PEAK_PROBE, str(size))
    assert done.returncode == 0, done.stderr
    return int(done.stdout) / size


def needs_peak_rss_counted_once() -> None:
    """Skips the calling test, saying why, where ``ru_maxrss`` counts a touched
    byte more than once, so that a bound on peak memory in bytes cannot be held
    to (gVisor's accounting on the TPU machine: 17.9 MB for 8 MiB)."""
    per_byte = peak_rss_per_byte()
    if per_byte > 1.5:
        pytest.skip(
            f"this kernel's ru_maxrss grows by {per_byte:.1f} bytes per byte allocated and "
            "touched, so a bound on peak memory in bytes cannot be checked here"
        )


def traced_peak(run: Callable[[], Any]) -> tuple[Any, int]:
    """What ``run`` returns and the most bytes of Python objects it held at
    once (tracemalloc, started and stopped around it); an exception it raises
    propagates."""
    tracemalloc.start()
    try:
        out = run()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
