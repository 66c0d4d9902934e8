"""The test servers' ports (``ports.py``): never from the kernel's ephemeral
range, where an outgoing connection can take one before our server binds it."""

from __future__ import annotations

import socket
from pathlib import Path

from machine import needs_inet_sockets
from ports import free_port, free_ports, port_range


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    needs_inet_sockets()
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [*free_ports(8), free_port(), free_port()]
    assert len(set(picked)) == len(picked)  # never the same port twice in one process
    for port in picked:
        assert port in port_range() and port < low and port > 19999
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out
