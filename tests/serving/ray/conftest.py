"""A local Ray cluster for the Ray Serve tests, run in a child process.

The test process never imports ray (Ray takes over its driver's SIGTERM and
starts a dozen processes): ``driver.py`` runs the cluster on 127.0.0.1 and
answers commands; the tests load it through Ray's HTTP proxy with clients
of their own. Teardown stops Serve and Ray, then kills by pid whatever the
child left behind. Without ray installed, these tests skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

# the child process imports these (and ray); the test process never does
collect_ignore = ["driver.py", "picky.py"]

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (pip install 'treeguard[ray]')", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class Cluster:
    """The child process that runs the cluster, and the proxy's URL."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.log = open(folder / "driver.log", "wb")  # noqa: SIM115 - closed in close()
        env = dict(os.environ, TREEGUARD_PICKY_PIDS=str(folder / "picky-pids"))
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
        self.picky_pids = folder / "picky-pids"
        # Ray's sockets live under its temp dir, and a Unix socket's path is at
        # most 107 bytes: pytest's folders (deeper under xdist) are too long.
        self.ray_dir = tempfile.mkdtemp(prefix="tgray-", dir="/tmp")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "driver.py"), self.ray_dir, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._answer(240.0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith("@@ "):
                self._lines.put(line[3:])
        self._lines.put("")

    def _answer(self, deadline_s: float) -> Any:
        try:
            line = self._lines.get(timeout=deadline_s)  # a safety stop, never a verdict
        except queue.Empty:
            raise AssertionError(f"the Ray driver did not answer in {deadline_s} s") from None
        if not line:
            raise AssertionError(f"the Ray driver exited ({self.proc.poll()}); see driver.log")
        out = json.loads(line)
        if not out["ok"]:
            raise AssertionError(out["trace"])
        return out.get("result")

    def call(self, op: str, deadline_s: float = 300.0, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.proc.stdin.flush()
        return self._answer(deadline_s)

    def close(self) -> None:
        below = descendants(self.proc.pid)
        with contextlib.suppress(Exception):
            self.call("stop", deadline_s=120.0)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        for pid in below | descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("ray"))
    try:
        yield c
    finally:
        c.close()
