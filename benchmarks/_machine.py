"""What a benchmark needs of the machine it runs on.

The lent TPU machine opens no internet socket, not even on the loopback
(only unix sockets): the benchmarks that drive a server through real sockets
say so there and stop, and ``serving.py`` leaves out its socket section.
"""

from __future__ import annotations

import socket
import sys


def inet_sockets() -> bool:
    """Whether a socket opens on the loopback."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
    except OSError:
        return False
    return True


def need_inet_sockets(what: str) -> None:
    """Exits, saying why, where no socket opens on the loopback."""
    if not inet_sockets():
        sys.exit(f"{what} needs sockets on 127.0.0.1, and this machine opens none")
