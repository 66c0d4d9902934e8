"""The watchdog: when a served version is rolled back on its own.

``WatchdogPolicy`` says when; ``Watchdog`` keeps the window of the latest
outcomes on the active version and judges each response against the
policy. The engine owns it: it feeds it every response, clears it when the
active version changes (``Weights``' ``on_switch``), and runs the rollback
it asks for off the event loop. A batch that compiled under ``forbid`` is
reported to it by the engine (``forbidden_compile``), from the error the
runner returned for that batch; nothing sets a flag on it from elsewhere.
"""

from __future__ import annotations

import collections
import dataclasses

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class WatchdogPolicy:
    """When the watchdog rolls back on its own.

    Attributes:
      window: how many of the latest requests on the active version it judges.
      min_requests: how many it needs before it judges at all.
      max_nonfinite_rate: the share of responses with NaN or Inf outputs above
        which it rolls back.
      max_error_rate: the share of 5xx responses above which it rolls back.
      on_forbidden_compile: whether a compile under ``forbid`` rolls back.

    It never rolls back onto a version it rolled back from, so it cannot flap.

    Raises:
      ConfigError: for a window or minimum that is not an int from 1 to 2**20,
        a minimum over the window (it would never judge), or a rate outside
        0 to 1.

    Example:
      >>> WatchdogPolicy(window=50, max_nonfinite_rate=0.01).min_requests
      10
    """

    window: int = 100
    min_requests: int = 10
    max_nonfinite_rate: float = 0.05
    max_error_rate: float = 0.2
    on_forbidden_compile: bool = True

    def __post_init__(self) -> None:
        for name in ("window", "min_requests"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
                raise ConfigError(f"watchdog.{name} is {v!r}", hint="an int from 1 to 2**20")
        if self.min_requests > self.window:  # it would never judge
            raise ConfigError(
                f"watchdog.min_requests is {self.min_requests}, over its window of {self.window}",
                hint="at most the window",
            )
        for name in ("max_nonfinite_rate", "max_error_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"watchdog.{name} is {v!r}", hint="a share from 0 to 1")


class Watchdog:
    """The window of the latest outcomes on the active version, judged
    against a ``WatchdogPolicy``.

    Args:
      policy: the policy; default ``WatchdogPolicy()``.

    Example:
      >>> dog = Watchdog(WatchdogPolicy(window=4, min_requests=2, max_error_rate=0.4))
      >>> dog.record("v1", "v1", nonfinite=False, error=True)
      >>> dog.record("v1", "v1", nonfinite=False, error=True)
      '5xx'
      >>> dog.record("v0", "v1", nonfinite=False, error=True)  # not the active version
    """

    def __init__(self, policy: WatchdogPolicy | None = None) -> None:
        self.policy = policy or WatchdogPolicy()
        self._outcomes: collections.deque[tuple[bool, bool]] = collections.deque(
            maxlen=self.policy.window
        )
        self._bad = [0, 0]  # non-finite and 5xx responses in the window
        self._last_forbidden = -1  # the last batch whose forbidden compile tripped it

    def clear(self) -> None:
        """Forgets the window (the active version changed)."""
        self._outcomes.clear()
        self._bad = [0, 0]

    def record(
        self, version: str, active: str | None, *, nonfinite: bool, error: bool
    ) -> str | None:
        """Judges one response of ``version`` while ``active`` is served.

        Returns:
          The trigger of the rollback the watchdog asks for (``nonfinite``,
          ``5xx``), or None; a response of another version than the active
          one is not judged.
        """
        if active is None or active != version:
            return None
        window = self._outcomes
        if not (nonfinite or error or self._bad[0] or self._bad[1]):
            # a good response to a window of good ones: nothing can trip, and
            # a full window would only trade one good outcome for another
            if len(window) < self.policy.window:
                window.append((False, False))
            return None
        if len(window) == window.maxlen:
            old_nonfinite, old_error = window[0]
            self._bad[0] -= old_nonfinite
            self._bad[1] -= old_error
        window.append((nonfinite, error))
        self._bad[0] += nonfinite
        self._bad[1] += error
        n = len(window)
        if n < self.policy.min_requests:
            return None
        if self._bad[0] / n > self.policy.max_nonfinite_rate:
            return "nonfinite"
        if self._bad[1] / n > self.policy.max_error_rate:
            return "5xx"
        return None

    def forbidden_compile(self, version: str, active: str | None, batch: int) -> str | None:
        """Judges one response of a batch that compiled under ``forbid``.

        Args:
          version: the version the batch ran.
          active: the version served now.
          batch: the runner's number of that batch (every request of one
            batch reports the same number).

        Returns:
          ``compile`` for the first response of that batch when the policy
          rolls back on a forbidden compile; otherwise the response counts
          as a 5xx (``record``).

        Example:
          >>> dog = Watchdog()
          >>> dog.forbidden_compile("v1", "v1", 7), dog.forbidden_compile("v1", "v1", 7)
          ('compile', None)
        """
        if self.policy.on_forbidden_compile and batch != self._last_forbidden:
            self._last_forbidden = batch
            return "compile"
        return self.record(version, active, nonfinite=False, error=True)
