"""A byte-for-byte bridge between a TCP port and a Unix socket, for a Ray
cluster that runs in a network namespace of its own.

Ray Serve's HAProxy binds its stats page and Prometheus exporter on every
interface; the HAProxy tests run their cluster in a private network
namespace (nothing but its own loopback) so nothing listens outside
127.0.0.1. The driver there forwards a Unix socket to HAProxy's port, and
the test process forwards a port on its own 127.0.0.1 to that socket, so
clients nobody here wrote (tritonclient, httpx) reach HAProxy unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Callable


def _pump(src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    if not done.acquire(blocking=False):  # the second direction to end closes both
        src.close()
        dst.close()


def forward(listener: socket.socket, connect: Callable[[], socket.socket]) -> threading.Thread:
    """Accepts on ``listener`` until it is closed; joins each connection to a
    new one from ``connect``, both ways. Returns the accepting thread."""

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener was closed
                return
            with contextlib.suppress(OSError):  # a Unix socket has no Nagle to turn off
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                upstream = connect()
            except OSError:
                client.close()
                continue
            done = threading.Semaphore(1)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b, done), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return thread


def unix_listener(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(64)
    return s


def tcp_listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    return s


def unix_connector(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s

    return connect


def tcp_connector(port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    return connect


def can_isolate() -> str | None:
    """Why a cluster cannot run in a network namespace of its own, or None."""
    if os.geteuid() != 0:
        return "a network namespace of its own (unshare --net) needs root"
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found"
    return None
