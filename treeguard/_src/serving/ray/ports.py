"""Ports for the servers a Ray cluster starts beside its ingress (HAProxy's
stats page and exporter, Ray's fallback proxy), kept out of the kernel's
ephemeral range.

Binding port 0 gets a port from the kernel's *ephemeral* range, the range it
also draws the local port of every outgoing connection from. Between that
pick and the bind of the server it is meant for (HAProxy's, seconds later,
once Ray has started), any connection made on the machine may take the same
port as its local end, and the server then fails with "Address already in
use". A port outside the range is never taken that way: only a server that
asks for it by number binds it.

The ports here lie above Ray's worker ports (``max_worker_port``, 19999 by
default), outside the ephemeral range (Linux's, read from ``/proc``) and
apart from the ports Ray Serve gives its replicas in HAProxy mode (30000 to
31000 for HTTP, 40000 to 41000 for gRPC, by default, or as Ray reads them
from the environment) and Ray's fixed ports above them (the dashboard
agent's, 52365). Each is checked free by a bind when picked, in a random
order, so that two clusters started at once are unlikely to pick the same
one. Where the ephemeral range leaves no such port (a host that widened it
to 1024-65535), they are picked inside it, as binding port 0 would, with a
``RuntimeWarning`` that says what that risks and how to avoid it.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import ConfigError

#: Where Linux keeps its ephemeral range, as ``LOW HIGH``.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
#: The range assumed where that file cannot be read (no ``/proc``: macOS,
#: Windows): Linux's default start to the top, which holds the IANA range
#: 49152-65535 that macOS and Windows use.
ELSEWHERE = range(32768, 65536)
#: The lowest port handed out: Ray's own ports (6379, 8000, 8265, 9000,
#: 10001, ...) and its workers' (10002-19999 by default) lie below.
LOWEST = 20000
#: The ports Ray Serve gives its replicas in HAProxy mode: the variables
#: Ray reads them from, each with its default.
REPLICA_PORTS = {
    "HTTP": (
        ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", 30000),
        ("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", 31000),
    ),
    "GRPC": (
        ("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", 40000),
        ("RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT", 41000),
    ),
}
#: Ray's fixed ports from ``LOWEST`` up: its dashboard agent's.
RAY_FIXED = frozenset({52365})


def replica_ports(environ: Mapping[str, str]) -> list[range]:
    """The ranges of ports Ray Serve gives its replicas, as Ray reads them
    from ``environ``.

    Raises:
      ConfigError: a variable that holds no port.
    """
    ranges = []
    for bounds in REPLICA_PORTS.values():
        low, high = (_port(environ, name, default) for name, default in bounds)
        ranges.append(range(low, high + 1))
    return ranges


def _port(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, str(default)).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(
            f"{name} is {text[:20]!r}, not a port",
            hint=f"set it to a port from 1 to 65535, or unset it (Ray's default is {default})",
        )
    return int(text)


def ephemeral_ports(source: str | os.PathLike[str] = EPHEMERAL_RANGE_FILE) -> range:
    """The kernel's ephemeral ports, read from ``source``.

    Args:
      source: a file that holds the range as ``LOW HIGH`` (Linux's
        ``ip_local_port_range``).

    Returns:
      The ports from ``LOW`` to ``HIGH``, both included; ``ELSEWHERE``
      where ``source`` cannot be read.

    Raises:
      ConfigError: when ``source`` holds something else than two ports.

    Example:
      >>> ephemeral_ports("/nowhere/ip_local_port_range")
      range(32768, 65536)
    """
    try:
        text = Path(source).read_text()
    except OSError:
        return ELSEWHERE
    fields = text.split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields) or int(fields[0]) > int(fields[1]):
        raise ConfigError(
            f"{os.fspath(source)} holds {text.strip()[:40]!r}, not a range of ports 'LOW HIGH'",
            hint="the kernel's range reads as two ports, LOW HIGH: "
            "see sysctl net.ipv4.ip_local_port_range",
        )
    return range(int(fields[0]), int(fields[1]) + 1)


def quiet_ports(ephemeral: range, replicas: Sequence[range] = ()) -> list[int]:
    """The ports that may be handed out: from ``LOWEST`` up, outside
    ``ephemeral``, ``replicas`` and ``RAY_FIXED``, in increasing order."""
    return [
        port
        for port in range(LOWEST, 65536)
        if port not in ephemeral and port not in RAY_FIXED and not any(port in r for r in replicas)
    ]


def _free(port: int) -> bool:
    """Whether a bind to ``port`` on every interface succeeds now (HAProxy
    binds its stats page and exporter there); any error but "Address
    already in use" (a machine that allows no internet socket) is raised."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def pick_free(candidates: Sequence[int], count: int) -> list[int]:
    """``count`` distinct ports of ``candidates`` (those of ``quiet_ports``),
    tried in a random order, each free (a bind to it succeeded) when picked.

    Raises:
      ConfigError: when fewer than ``count`` of ``candidates`` are free.
    """
    unique = list(dict.fromkeys(candidates))
    picked: list[int] = []
    for port in random.sample(unique, len(unique)):
        if len(picked) == count:
            break
        if _free(port):
            picked.append(port)
    if len(picked) < count:
        raise ConfigError(
            f"{count} {'port' if count == 1 else 'ports'} wanted for servers, and "
            f"{len(picked)} of the {len(unique)} outside the kernel's ephemeral range "
            f"{'is' if len(picked) == 1 else 'are'} free",
            hint="stop the servers that hold them, or narrow the ephemeral range "
            "(net.ipv4.ip_local_port_range) to leave more ports outside it",
        )
    return picked


def server_ports(
    count: int,
    *,
    source: str | os.PathLike[str] = EPHEMERAL_RANGE_FILE,
    environ: Mapping[str, str] | None = None,
) -> list[int]:
    """``count`` distinct ports for servers, outside the kernel's ephemeral
    range (read from ``source``) and Ray's ports (its replicas' as read from
    ``environ``, ``os.environ`` by default), each free when picked; inside
    the ephemeral range, with a ``RuntimeWarning``, where it leaves none.

    Raises:
      ConfigError: fewer than ``count`` free ports, or a replica port
        variable that holds no port.
    """
    ephemeral = ephemeral_ports(source)
    replicas = replica_ports(os.environ if environ is None else environ)
    candidates = quiet_ports(ephemeral, replicas)
    if not candidates:
        warnings.warn(
            f"the kernel's ephemeral ports {ephemeral.start}-{ephemeral.stop - 1} "
            f"(from {os.fspath(source)}) leave no port from {LOWEST} up for HAProxy's "
            "servers: they are picked among the ephemeral ones, where an outgoing "
            "connection may take one before HAProxy binds it; narrow the range, for "
            "example sysctl -w net.ipv4.ip_local_port_range='32768 60999'",
            RuntimeWarning,
            stacklevel=3,
        )
        candidates = quiet_ports(range(0), replicas)
    return pick_free(candidates, count)
