"""What every process of a multi-host job does together: agree on a name,
gather small byte strings (which is also a barrier).

Each helper is a no-op in a single process, so one code path serves a laptop
and a pod. All of them are collectives: every process must call them in the
same order, which the callers guarantee by walking the manifest in order.
"""

from __future__ import annotations

import jax
import numpy as np


def process_index() -> int:
    """This process's index in the job (0 alone)."""
    return int(jax.process_index())


def process_count() -> int:
    """How many processes the job has (1 alone)."""
    return int(jax.process_count())


def broadcast_text(text: str) -> str:
    """Process 0's ``text`` (ASCII, the same length everywhere) in every process."""
    if process_count() == 1:
        return text
    from jax.experimental import multihost_utils  # lazy: reading files never imports jax

    raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    out = multihost_utils.broadcast_one_to_all(raw)
    return bytes(np.asarray(out, dtype=np.uint8)).decode("ascii")


def allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's ``data``, in process order, in every process."""
    if process_count() == 1:
        return [data]
    from jax.experimental import multihost_utils  # lazy: reading files never imports jax

    sizes = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int64)))
    sizes = sizes.reshape(-1)
    width = max(int(sizes.max()), 1)
    buf = np.zeros(width, dtype=np.uint8)
    buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), width)
    return [bytes(rows[i, : int(n)]) for i, n in enumerate(sizes)]


def any_process(flags: np.ndarray) -> np.ndarray:
    """The element-wise OR of a uint8 vector over every process."""
    if process_count() == 1:
        return flags
    from jax.experimental import multihost_utils  # lazy: reading files never imports jax

    rows = np.asarray(multihost_utils.process_allgather(flags.astype(np.uint8)))
    out: np.ndarray = rows.reshape(-1, flags.shape[0]).max(axis=0)
    return out
