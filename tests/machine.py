"""The CPU devices that tests of meshes take, whatever the default backend.

``conftest.py`` asks JAX for eight CPU devices. On a machine whose default
backend is a TPU or a GPU, ``jax.devices()`` is that accelerator's (one chip
here), so a test that needs several devices takes them from the CPU backend
explicitly; on the CPU box the two are the same devices.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import socket
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import jax
import pytest


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


#: The two sizes a probe of ``ru_maxrss`` touches: the line through them gives
#: how the mark grows per byte (its slope) apart from what the probe's own code
#: costs (its offset).
PEAK_PROBE_SIZES = (8 << 20, 40 << 20)


@dataclasses.dataclass(frozen=True)
class PeakRssLine:
    """How a forked child's peak resident set (``ru_maxrss``) grows with the
    bytes it touches: ``slope`` bytes of growth per byte touched, plus
    ``offset`` bytes whatever it touches.

    The offset is mostly the pages of code (shared libraries) that the child
    maps again as it runs: a fork copies none of its parent's page tables for
    them, and each page it runs brings its neighbours with it (``RssFile``
    grew, ``RssAnon`` did not). So it depends on the code the child runs and
    on the machine: on the 2-core CPU box, 1.8 MB for a fresh interpreter
    touching its bytes with ``np.ones``, 0 MB for the serving tests' child
    writing to a fresh mapping, 2.3 MB for that child's smallest request;
    about 9.7 MB under the TPU machine's gVisor for the fresh interpreter. The
    slope is the kernel's accounting: 1 where each byte is counted once, as
    on both machines (an 8 MiB probe alone read 1.21 and 2.14 bytes a byte
    there, the offset taken for a byte counted twice).
    """

    slope: float
    offset: float

    def __str__(self) -> str:
        return (
            f"ru_maxrss grows by {self.slope:.3f} bytes per byte touched "
            f"plus {self.offset / 1e6:.2f} MB"
        )


def peak_rss_line(growth: Callable[[int], int]) -> PeakRssLine:
    """The line through ``growth(n)`` at the two ``PEAK_PROBE_SIZES``, where
    ``growth(n)`` is how many bytes a forked child's ``ru_maxrss`` grew by as
    it touched ``n`` fresh bytes (one probe each, in the process whose peaks
    a test bounds, so that its own accounting is the one measured)."""
    small, large = PEAK_PROBE_SIZES
    low, high = growth(small), growth(large)
    slope = (high - low) / (large - small)
    return PeakRssLine(slope, low - slope * small)


def needs_peak_rss_counted_once(line: PeakRssLine) -> None:
    """Skips the calling test, saying why, where ``ru_maxrss`` does not grow
    by about one byte per byte touched (``line.slope`` outside 0.9 to 1.1),
    so that a bound on peak memory in bytes cannot be held to. An offset
    alone skips nothing: a bound allows for what it measures of it
    (``tests/serving/test_json_bounds.py``)."""
    if not 0.9 <= line.slope <= 1.1:
        pytest.skip(
            f"this kernel's {line}, not one byte per byte, so a bound on peak "
            "memory in bytes cannot be checked here"
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
