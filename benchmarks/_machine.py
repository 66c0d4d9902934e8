"""What a benchmark needs of the machine it runs on.

The lent TPU machine opens no internet socket, not even on the loopback
(only unix sockets): the benchmarks that drive a server through real sockets
say so there and stop, and ``serving.py`` leaves out its socket section. The
check itself is the tests' (``tests/machine.py``), as are the servers the
benchmarks start (``tests/s3server.py``), whose folder goes on the path here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the tests' helpers import each other by their bare names, as pytest finds them
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))

from tests.machine import inet_sockets

__all__ = ["inet_sockets", "need_inet_sockets"]


def need_inet_sockets(what: str) -> None:
    """Exits, saying why, where no socket opens on the loopback."""
    if not inet_sockets():
        sys.exit(f"{what} needs sockets on 127.0.0.1, and this machine opens none")
