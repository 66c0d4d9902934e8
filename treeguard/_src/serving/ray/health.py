"""When a replica must be replaced: what its ``check_health`` reports to Ray.

A replica warms in its constructor, so a failed warm-up is a replica that
never started (Ray retries it), never a failed health check. A replica is
unhealthy once a request needed a compile the spec's policy forbids (a
dtype or shape nobody warmed: the replica's compile cache can no longer be
trusted to stay bounded), or once its watchdog quarantined a version (it
rolled back on its own, so it may now serve another version than the rest
of the fleet). Ray then replaces it, and the new replica loads the store's
current verified version, which the quarantine has made skip the bad one.
"""

from __future__ import annotations

from ..engine import Engine
from ..spec import CompilePolicy


def unhealthy(engine: Engine, quarantined_at_start: frozenset[str]) -> str | None:
    """Why ``engine``'s replica must be replaced, or None while it is healthy.

    Args:
      engine: the replica's engine, after ``start``.
      quarantined_at_start: the versions quarantined when it started (the
        store's record), which it skipped and are no fault of its own.

    Example:
      >>> import tempfile
      >>> import treeguard
      >>> from treeguard.examples import mlp
      >>> from treeguard.serving import Server
      >>> engine = Server(mlp.model, treeguard.ArtifactStore.init(tempfile.mkdtemp()))
      >>> print(unhealthy(engine, frozenset()))  # before ``start``
      not warm: no version is loaded yet
    """
    weights = engine.weights
    if not weights.ready:
        return "not warm: no version is loaded yet"
    serving = engine.runner.guard.counts["serving"]
    if engine.spec.compile_policy is CompilePolicy.FORBID and serving:
        return f"{serving} compile(s) while serving, which the compile policy forbids"
    fresh = sorted(weights.quarantined - quarantined_at_start)
    if fresh:
        return f"the watchdog quarantined {', '.join(fresh)} and rolled back"
    return None
