"""What the bucket tests lie about: ``Liar``, the lying proxy's ``tamper``
that lies one way about the requests it picks (tests/s3server.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tests.s3server import Lie, Request


class Liar:
    """Lies ``kind`` about the next ``times`` requests that ``pick`` selects."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.times = 0
        self.pick: Callable[[Request], bool] = lambda r: False
        self._lock = threading.Lock()

    def __call__(self, req: Request) -> Lie | None:
        with self._lock:
            if self.kind is None or self.times <= 0 or not self.pick(req):
                return None
            self.times -= 1
            return Lie(kind=self.kind)

    def arm(
        self,
        kind: str,
        method: str,
        leaf: str,
        *,
        times: int = 1,
        data: bool = False,
        first: bool = False,
    ) -> None:
        """Lies about ``method`` requests of objects named ``.../leaf``
        (with ``data``: only ranged GETs past the first bytes; with
        ``first``: only ranged GETs of the first bytes)."""

        def pick(req: Request) -> bool:
            ranged = req.header("range") or ""
            return (
                req.method == method
                and req.key.endswith(leaf)
                and (not data or (ranged != "" and not ranged.startswith("bytes=0-")))
                and (not first or ranged.startswith("bytes=0-"))
            )

        with self._lock:
            self.kind, self.times, self.pick = kind, times, pick
