"""A local store whose checkpoint cannot be read for a moment: a read error
during ``verify`` is read again, or reported as an error, and never recorded
as a verdict on an intact file (the bucket's rule, in test_store_lies.py).

The refusal is real: a write lease on the file, as a file server holding an
oplock takes one, makes every non-blocking open of it fail with ``EAGAIN``
until the lease is released; the kernel tells the holder (``SIGIO``) that
an open was refused, and the holder here releases it then, or never."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treeguard import ArtifactStore, StorageError

#: ``fcntl.F_SETLEASE`` and ``F_GETLEASE`` (Linux), which older Pythons do not name.
F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)


def _params() -> dict[str, Any]:
    return {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}


@contextlib.contextmanager
def _leased(path: Path, *, release: bool) -> Iterator[list[int]]:
    """Holds a write lease on ``path``; yields the list of the refusals the
    kernel reported. With ``release``, the lease goes at the first refusal,
    so only the first open fails; without, every open fails until the end."""
    fd = os.open(path, os.O_WRONLY)
    refused: list[int] = []

    def on_refusal(signum: int, frame: Any) -> None:
        refused.append(signum)
        if release:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)

    before = signal.signal(signal.SIGIO, on_refusal)
    try:
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        os.close(fd)
        signal.signal(signal.SIGIO, before)
        # gVisor (the TPU machine's sandbox) refuses leases on every file
        pytest.skip(f"the filesystem of {path} grants no file leases ({e.strerror})")
    try:
        yield refused
    finally:
        if fcntl.fcntl(fd, F_GETLEASE) != fcntl.F_UNLCK:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, before)


def test_a_read_refused_once_during_verify_is_read_again_not_rejected(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    with _leased(tmp_path / "versions" / v / "model.safetensors", release=True) as refused:
        info = store.verify(v)
    assert refused, "no open was refused: the test did not test anything"
    assert (info.status, info.reason) == ("verified", None)


def test_a_read_refused_on_every_try_is_an_error_and_no_verdict(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    with (
        _leased(tmp_path / "versions" / v / "model.safetensors", release=False) as refused,
        pytest.raises(StorageError) as e,
    ):
        store.verify(v)
    assert refused
    assert e.value.message == (
        f"reading version {v} for its verdict failed 3 times (last: version {v}: its "
        "checkpoint no longer reads: Resource temporarily unavailable); no verdict was recorded"
    )
    assert e.value.context == str(tmp_path / "versions" / v)
    assert store.info(v).status == "candidate"  # nothing recorded: verify it again once it reads
    assert store.verify(v).status == "verified"
