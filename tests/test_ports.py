"""The test servers' ports (``ports.py``): never from the kernel's ephemeral
range, where an outgoing connection can take one before our server binds it."""

from __future__ import annotations

import socket

from machine import needs_inet_sockets
from ports import ephemeral, free_port, free_ports, port_range


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    needs_inet_sockets()
    picked = [*free_ports(8), free_port(), free_port()]
    assert len(set(picked)) == len(picked)  # never the same port twice in one process
    band = port_range()
    outside = band.stop <= ephemeral().start or band.start >= ephemeral().stop
    for port in picked:
        assert port in band and port > 19999  # above Ray's workers' ports
        assert port not in ephemeral() or not outside  # outside it wherever a band is left
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out
