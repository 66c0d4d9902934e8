"""The driver side of the Ray Serve deployment: build the application, swap
every replica to a verified version, list the replicas and their metrics.

Ray is imported inside these functions, never at the top: it is an
optional dependency (the ``ray`` extra), large, and it starts threads and
reads its environment as it is imported, so ``import treeguard.serving.ray``
costs nothing until an application is built or swapped.
"""

from __future__ import annotations

import os
import time
from typing import Any, cast

from ...errors import ServingError
from ...store import ArtifactStore
from ...verify.model import Model
from ..slots import WatchdogPolicy
from ..spec import ServingSpec
from .rollout import Decision, decide, refusal


def app(
    model: Model,
    store: Any,
    spec: ServingSpec | None = None,
    *,
    num_replicas: int = 2,
    allow_unchecked: bool = True,
    memory_budget: int | None = None,
    watchdog: WatchdogPolicy | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    control_token: bytes | None = None,
    metrics_host: str = "127.0.0.1",
    ray_actor_options: dict[str, Any] | None = None,
    health_check_period_s: float = 2.0,
) -> Any:
    """A Ray Serve application of ``num_replicas`` replicas of the engine.

    Each replica is a ``treeguard.serving.Server``: buckets and the padding
    batcher, the compile guard, input limits, the watchdog and its private
    metrics, behind Ray's HTTP proxy with the same Open Inference Protocol
    routes (so ``tritonclient.http`` and curl work unchanged). A replica
    warms every bucket and loads the fleet's version (the store's current
    verified one, its digest re-checked) before Ray routes to it, and its
    ``check_health`` fails after a forbidden compile or a quarantine, so Ray
    replaces it. Swap the fleet with ``swap``; the proxy refuses the
    single-replica ``/v2/treeguard/swap`` and ``rollback`` routes.

    Args:
      model: the ``treeguard.verify.Model`` (it travels to the replicas by
        pickle: a module-level model such as ``treeguard.examples.mlp.model``).
      store: the ``ArtifactStore`` (or its root or bucket URL) every replica
        opens; a signed store's key comes from ``$TREEGUARD_STORE_KEY_FILE``.
      spec: the ``ServingSpec``; default every batch input of the model.
      num_replicas: how many replicas Ray keeps running.
      allow_unchecked: serve versions verified with no model check.
      memory_budget: see ``Server``.
      watchdog: see ``Server``.
      cache_dir: the persistent compilation cache every replica shares.
      control_token: the bearer token of the control routes.
      metrics_host: the address each replica serves its ``/metrics`` on
        (``metrics_targets`` lists them).
      ray_actor_options: Ray's options for each replica (``num_cpus``,
        ``num_gpus``, ``runtime_env``); default one CPU.
      health_check_period_s: how often Ray calls each replica's ``check_health``.

    Returns:
      The bound application, for ``serve.run(app, name=...)``.

    Raises:
      ImportError: when Ray Serve is not installed (``pip install 'treeguard[ray]'``).

    Example:
      <!-- needs a Ray cluster; run by the slow tests -->
      >>> from ray import serve  # doctest: +SKIP
      >>> from treeguard.examples import mlp  # doctest: +SKIP
      >>> serve.run(app(mlp.model, "store"), name="mlp")  # doctest: +SKIP
    """
    # ray is imported only when an application is built (see the module docstring)
    from .replica import Replica

    root = str(getattr(store, "root", store))
    options = {
        "allow_unchecked": allow_unchecked,
        "memory_budget": memory_budget,
        "watchdog": watchdog,
        "cache_dir": None if cache_dir is None else os.fspath(cache_dir),
        "control_token": control_token,
        "metrics_host": metrics_host,
    }
    deployment = cast(Any, Replica).options(
        num_replicas=num_replicas,
        ray_actor_options=ray_actor_options or {"num_cpus": 1},
        health_check_period_s=health_check_period_s,
    )
    return deployment.bind(model, root, spec or ServingSpec.from_model(model), options)


def replicas(name: str = "default") -> dict[str, int | None]:
    """The running replicas of application ``name``: ``{replica id: pid}``.

    Raises:
      ServingError: 404 when no such application runs on the connected cluster.
    """
    # Serve's client (ray) is imported only when it is asked (see the module docstring)
    from ray.serve.context import _get_global_client

    from .replica import DEPLOYMENT

    client = _get_global_client()
    assert client is not None  # it raises when Serve is not running
    details = client.get_serve_details()
    application = details.get("applications", {}).get(name)
    if application is None:
        raise ServingError(
            f"no Ray Serve application named {name!r} runs here",
            hint="serve.run(treeguard.serving.ray.app(...), name=NAME) first, or pass its name",
            status=404,
        )
    deployment = application["deployments"].get(DEPLOYMENT, {})
    return {
        r["replica_id"]: r.get("pid")
        for r in deployment.get("replicas", [])
        if r.get("state") == "RUNNING"
    }


def metrics_targets(name: str = "default") -> dict[str, str]:
    """Where each running replica of ``name`` serves its Prometheus metrics:
    ``{replica id: URL}`` (for a Prometheus ``file_sd`` or ``static_configs``)."""
    # ray is imported only when it is asked (see the module docstring)
    import ray

    from .replica import NAMESPACE, coordinator_name

    live = replicas(name)
    coord = ray.get_actor(coordinator_name(name), namespace=NAMESPACE)
    urls = cast(dict[str, str], ray.get(coord.metrics.remote()))
    return {rid: url for rid, url in urls.items() if rid in live}


def swap(version: str, *, name: str = "default", timeout_s: float = 600.0) -> dict[str, Any]:
    """Swaps every replica of application ``name`` to ``version``, verified.

    First every live replica loads ``version`` (its digest re-checked) and
    runs the release checks on it without serving it; only when all pass
    does each switch, between two batches, and then the store's current
    pointer moves to ``version``. If any replica fails, none switches.
    Every response names the version that computed it (``model_version``).

    Args:
      version: the verified version to serve.
      name: the Ray Serve application's name.
      timeout_s: a safety stop for replicas that never answer.

    Returns:
      ``{"version", "replicas"}``: the version now served and the replicas
      that switched.

    Raises:
      ServingError: 409 naming each replica that failed its check and why
        (none switched); 504 naming the replicas that did not answer in
        time; 404 for an unknown application.
    """
    # ray is imported only when a swap runs (see the module docstring)
    import ray

    from .replica import NAMESPACE, coordinator_name

    live = replicas(name)
    coord = ray.get_actor(coordinator_name(name), namespace=NAMESPACE)
    deadline = time.monotonic() + timeout_s
    seq = cast(int, ray.get(coord.publish.remote("prepare", version)))
    prepared = _round(coord, seq, name, deadline, version=version, what="check")
    if not prepared.passed:
        seq = ray.get(coord.publish.remote("abort", version))
        _round(coord, seq, name, deadline, version=version, what="abort")
        raise ServingError(
            refusal(version, prepared.failed),
            hint="fix or reject the version; the fleet still serves what it served",
        )
    seq = ray.get(coord.publish.remote("commit", version))
    committed = _round(coord, seq, name, deadline, version=version, what="switch")
    if committed.failed:
        lines = "; ".join(f"replica {r}: {why}" for r, why in committed.failed.items())
        raise ServingError(
            f"swap to {version}: every replica passed its check, but {lines} could not switch",
            hint=f"Ray replaces an unhealthy replica; run the swap to {version} again",
            status=500,
        )
    _, _, _, root = ray.get(coord.snapshot.remote())
    ArtifactStore(root).promote(version)
    live = replicas(name)
    return {"version": version, "replicas": sorted(live)}


def _round(
    coord: Any, seq: int, name: str, deadline: float, *, version: str, what: str
) -> Decision:
    """Waits until every live replica answered round ``seq`` (re-reading
    which are alive, so a dead one is not waited for)."""
    import ray  # see the module docstring

    while True:
        live = sorted(replicas(name))
        reports = ray.get(coord.reports.remote(seq, live, 1.0))
        decision = decide(live, reports)
        if decision.done:
            return decision
        if time.monotonic() > deadline:
            raise ServingError(
                f"swap to {version}: replicas {', '.join(sorted(decision.waiting))} did not "
                f"answer the {what} in time; "
                + ("none switched" if what != "switch" else "some may have switched"),
                hint="look at those replicas' logs, then run the swap again",
                status=504,
            )
