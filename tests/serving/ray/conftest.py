"""A local Ray cluster for the Ray Serve tests, run in a child process.

The test process never imports ray (Ray takes over its driver's SIGTERM and
starts a dozen processes): ``driver.py`` runs the cluster on 127.0.0.1 and
answers commands; the tests load it through Ray's HTTP proxy with clients
of their own. Teardown stops Serve and Ray, then kills by pid whatever the
child left behind. Without ray installed, these tests skip.

The ``haproxy_cluster`` fixture runs Ray Serve's HAProxy ingress instead of
Ray's proxy. Its HAProxy binds a stats page and an exporter on every
interface, so its driver runs in a network namespace of its own (``unshare
--net``, as root) and ``bridge.py`` carries the ingress port out to this
process's 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge import can_isolate, forward, tcp_listener, unix_connector
from ports import free_port

HERE = Path(__file__).resolve().parent

# the child process imports these (and ray); the test process never does
collect_ignore = ["driver.py", "picky.py", "bridge.py", "isolated_cli.py"]

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (pip install 'treeguard[ray]')", allow_module_level=True)


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
    """The child process that runs the cluster, and its ingress's URL
    (``ingress``: ``"proxy"``, Ray's; ``"haproxy"``, in a namespace of its own)."""

    def __init__(self, folder: Path, ingress: str = "proxy") -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.log = open(folder / "driver.log", "wb")  # noqa: SIM115 - closed in close()
        env = dict(os.environ, TREEGUARD_PICKY_PIDS=str(folder / "picky-pids"))
        # the models here and the server tests' (``ailing`` builds on ``tinymodel``)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")]
        )
        self.picky_pids = folder / "picky-pids"
        # Ray's sockets live under its temp dir, and a Unix socket's path is at
        # most 107 bytes: pytest's folders (deeper under xdist) are too long.
        self.ray_dir = tempfile.mkdtemp(prefix="tgray-", dir="/tmp")
        command = [sys.executable, str(HERE / "driver.py"), self.ray_dir, str(self.port), ingress]
        self._bridge: Any = None
        if ingress == "haproxy":
            # the driver's own network namespace, its loopback up; the URL is a bridge's
            command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "-"]
            command += [sys.executable, str(HERE / "driver.py"), self.ray_dir, "8000", ingress]
            self._bridge = tcp_listener(self.port)
            forward(self._bridge, unix_connector(os.path.join(self.ray_dir, "ingress.sock")))
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._answer(240.0)

    def fetch(self, url: str) -> str:
        """The body of a GET of ``url``, sent from the driver (which sees the
        replicas' own ports even from its own network namespace)."""
        return str(self.call("fetch", url=url))

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
            self.log.flush()
            tail = Path(self.log.name).read_bytes()[-3000:].decode(errors="replace")
            raise AssertionError(
                f"the Ray driver exited ({self.proc.poll()}); its log ends:\n{tail}"
            )
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
        if self._bridge is not None:
            self._bridge.close()
        self.log.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("ray"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def haproxy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = can_isolate()
    if why is not None:
        pytest.skip(f"the HAProxy cluster binds every interface, so it runs isolated: {why}")
    c = Cluster(tmp_path_factory.mktemp("haproxy"), ingress="haproxy")
    try:
        yield c
    finally:
        c.close()
