"""``save`` on a disk that fails its write or its sync: the ``OSError``
names the checkpoint (before, a bare ``[Errno 5] Input/output error``), the
file it would replace is left whole and no temp file stays."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

import treeguard as tg


@pytest.mark.parametrize("call", ["fsync", "write"])
def test_a_save_the_disk_fails_names_the_checkpoint_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    target = tmp_path / "params.safetensors"
    tg.save(target, {"w": np.zeros(4, np.float32)})
    before = target.read_bytes()
    real = getattr(os, call)

    def failing(fd: int, *args: object) -> object:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".params"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, *args)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each call writes")
    monkeypatch.setattr(os, call, failing)
    with pytest.raises(OSError) as e:
        tg.save(target, {"w": np.ones(4, np.float32)})
    assert (e.value.errno, e.value.filename) == (errno.EIO, str(target))
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["params.safetensors"]
