"""Ports on 127.0.0.1 for the servers the tests start: the one home of
picking them.

A port the kernel handed out by binding port 0 is an *ephemeral* one: the
kernel hands the same range to every outgoing connection as its local port,
so in the seconds before the server we started binds it, a client socket
anywhere on the machine (a test's HTTP client, SeaweedFS's own gRPC calls,
a Ray worker) may take it, and the server fails "address already in use".
The ports here come from below that range and above Ray's worker ports,
split between the pytest-xdist workers by residue, never handed out twice
by one process, and each checked free by a bind when handed out.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["ephemeral", "free_port", "free_ports", "port_range"]

#: Ray's workers take ports up to this one by default (``max_worker_port``).
_RAY_WORKERS_TOP = 19999

_given: set[int] = set()


def ephemeral() -> range:
    """The kernel's ephemeral ports (read from ``/proc``; Linux's default
    where it cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def port_range() -> range:
    """The ports handed out: above Ray's worker ports and below the
    ephemeral range, or above it; where neither leaves 1,024 ports (an
    ephemeral range widened to most ports), those below 32768, whose race
    only reserving them (``ip_local_reserved_ports``) would end."""
    taken = ephemeral()
    if taken.start - (_RAY_WORKERS_TOP + 1) >= 1024:
        return range(_RAY_WORKERS_TOP + 1, taken.start)
    if 65536 - taken.stop >= 1024:
        return range(taken.stop, 65536)
    return range(_RAY_WORKERS_TOP + 1, 32768)


def _worker() -> tuple[int, int]:
    """This process's xdist worker index and the number of workers (0 of 1
    outside xdist); the controller, if it picks ports, shares index 0."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    return index % max(count, 1), max(count, 1)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1, each free when handed out.

    Raises:
        RuntimeError: when no free port is left in this worker's share.
    """
    index, count = _worker()
    share = [p for p in port_range() if p % count == index and p not in _given]
    random.shuffle(share)
    picked: list[int] = []
    for port in share:
        if len(picked) == n:
            break
        if _bindable(port):
            picked.append(port)
    if len(picked) < n:
        raise RuntimeError(f"only {len(picked)} of {n} free ports left in {port_range()}")
    _given.update(picked)
    return picked


def free_port() -> int:
    """One port on 127.0.0.1, free when handed out (see :func:`free_ports`)."""
    return free_ports(1)[0]
