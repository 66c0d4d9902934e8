"""The Ray side: the replica deployment and the swap coordinator.

This module imports ray at the top; only ``api.app`` and ``api.swap`` import
it, when a Ray application is built or swapped, so nothing on treeguard's
default import path loads Ray.

Each replica is one ``Server`` (the engine with its REST app) behind Ray
Serve's HTTP proxy through Serve's ASGI ingress, so the proxy speaks the same
Open Inference Protocol as ``treeguard serve``. A replica given no model
serves the store's exported artifact (``export.served_from_store``), with
its gates run on every version it loads or checks for a swap. The replica
warms every bucket and loads the version the fleet serves (the one last
committed by a swap, else the store's current verified version, its digest
re-checked) in its constructor, so Ray routes nothing to it before it is
warm.

The coordinator is a small named actor per application that keeps the
rollout state (``rollout.Rollout``); every replica listens to it for swap
rounds and answers each, and registers where its metrics are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from ray import serve

from ...errors import ServingError
from ...export.served import Served, served_from_store
from ...store import ArtifactStore
from ..app import Server
from ..runner import Slot
from .health import unhealthy
from .rollout import Command, ReplicaReport, Rollout

log = logging.getLogger("treeguard.serving")

#: The Ray namespace of the coordinators.
NAMESPACE = "treeguard"
#: The deployment's name inside its application.
DEPLOYMENT = "treeguard"
#: The control routes a single replica must not run on its own behind the proxy.
FLEET_ROUTES = ("/v2/treeguard/swap", "/v2/treeguard/rollback")


def coordinator_name(app_name: str) -> str:
    """The name of ``app_name``'s coordinator actor."""
    return f"treeguard-rollout:{app_name}"


@ray.remote(num_cpus=0)
class Coordinator:
    """Keeps one application's rollout state and wakes whoever waits on it."""

    def __init__(self, store_root: str) -> None:
        self.state = Rollout()
        self.store_root = store_root
        self._changed: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def snapshot(self) -> tuple[int, str | None, Command | None, str]:
        """``(seq, committed version, the prepare in force or None, store root)``."""
        s = self.state
        return s.seq, s.committed, s.pending(), self.store_root

    async def publish(self, action: str, version: str) -> int:
        """Starts a round; returns its sequence number."""
        async with self._cond():
            cmd = self.state.publish(action, version)
            self._cond().notify_all()
        return cmd.seq

    async def next(self, after: int) -> Command:
        """Waits for a round newer than ``after`` and returns it."""
        async with self._cond():
            await self._cond().wait_for(lambda: self.state.seq > after)
            assert self.state.command is not None
            return self.state.command

    async def report(self, report: ReplicaReport) -> None:
        """Records a replica's answer."""
        async with self._cond():
            self.state.report(report)
            self._cond().notify_all()

    async def reports(self, seq: int, live: list[str], wake_s: float) -> dict[str, ReplicaReport]:
        """The answers to round ``seq`` once each of ``live`` has answered,
        or whatever has come after ``wake_s`` (so the caller can read which
        replicas are alive again)."""
        cond = self._cond()

        def answered() -> bool:
            return self.state.seq != seq or all(r in self.state.reports for r in live)

        async with cond:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cond.wait_for(answered), wake_s)
            return dict(self.state.reports) if self.state.seq == seq else {}

    async def settle(self, version: str) -> None:
        """Records that the store's pointer names ``version`` now."""
        self.state.settle(version)

    async def register_metrics(self, replica: str, url: str) -> None:
        """Records where a replica serves its metrics."""
        self.state.metrics[replica] = url

    async def metrics(self) -> dict[str, str]:
        """``{replica: metrics URL}`` of every replica that registered."""
        return dict(self.state.metrics)


def coordinator(app_name: str, store_root: str) -> Any:
    """The coordinator of ``app_name``, made on first use (detached, so a
    driver that ends leaves it for the next ``swap``)."""
    return Coordinator.options(  # type: ignore[attr-defined]
        name=coordinator_name(app_name),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
    ).remote(store_root)


def _fleet_only(app: Any) -> Any:
    """``app`` with the single-replica control routes refused: behind the
    proxy a swap or rollback would reach one replica and split the fleet."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") in FLEET_ROUTES:
            # starlette, like the REST app, is imported only when a server runs (the serve extra)
            from starlette.responses import JSONResponse

            body = {
                "error": "a swap or rollback through Ray's proxy would reach one replica only\n"
                "hint: treeguard serve swap --ray VERSION (or treeguard.serving.ray.swap) "
                "checks the version on every replica before any switches"
            }
            await JSONResponse(body, status_code=409)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class Replica:
    """One replica: a warm ``Server`` behind Ray's proxy (see the module docstring).

    Args:
      model: the ``treeguard.verify.Model``; None serves the exported
        artifact (``treeguard export``) of the version the fleet serves,
        read from the store here: no model code is imported.
      store_root: the store's root or URL.
      spec: the ``ServingSpec``; with no model, None for the artifact's own.
      options: ``Server`` keyword arguments (``memory_budget``, ``watchdog``,
        ``cache_dir``, ``allow_unchecked``), ``control_token`` and
        ``metrics_host``.
    """

    # Serve's ingress runs an async constructor (awaited before any request)
    async def __init__(  # type: ignore[misc]
        self, model: Any, store_root: str, spec: Any, options: dict[str, Any]
    ) -> None:
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.coordinator = coordinator(context.app_name, store_root)
        seq, committed, pending, root = await self.coordinator.snapshot.remote()
        if root != store_root:
            raise ServingError(
                f"the application {context.app_name!r} on this cluster swaps versions of the "
                f"store {root}, not {store_root}",
                hint=f"serve this store under another application name, or end the old one's "
                f"coordinator: ray.kill(ray.get_actor({coordinator_name(context.app_name)!r}, "
                f"namespace={NAMESPACE!r}))",
            )
        engine_options = {k: v for k, v in options.items() if k in _ENGINE_OPTIONS}
        store: Any = store_root
        if model is None:  # the exported artifact of the version the fleet serves
            served = await asyncio.to_thread(_exported, store_root, committed, spec)
            model, spec, store = served.model, served.spec, served.store
            engine_options["version_check"] = served.check
        self.engine = Server(model, store, spec=spec, version=committed, **engine_options)
        self.control_token: bytes | None = options.get("control_token")
        # warm every bucket and check the version before Ray routes a request here
        await asyncio.to_thread(self.engine.start)
        self.quarantined_at_start = frozenset(self.engine.weights.quarantined)
        self.prepared: Slot | None = None
        self._metrics_server = self._serve_metrics(options.get("metrics_host", "127.0.0.1"))
        after = pending.seq - 1 if pending is not None else seq
        self.listener = asyncio.get_running_loop().create_task(self._listen(after))

    def __serve_build_asgi_app__(self) -> Any:
        return _fleet_only(self.engine.app(control_token=self.control_token))

    def _serve_metrics(self, host: str) -> Any:
        # prometheus_client, like the engine's metrics, is imported only when a server runs
        from prometheus_client import start_http_server

        httpd, _ = start_http_server(0, addr=host, registry=self.engine.metrics.registry)
        url = f"http://{host}:{httpd.server_port}/metrics"
        self.coordinator.register_metrics.remote(self.replica, url)
        return httpd

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Ray's ``user_config``: ``{"version": V}`` swaps this replica to
        ``V`` after the same checks as any swap (a fleet-wide verified swap
        is ``treeguard.serving.ray.swap``)."""
        version = (config or {}).get("version")
        active = self.engine.weights.active
        if version is None or (active is not None and active.version == version):
            return
        await self.engine.swap(str(version))

    async def check_health(self) -> None:
        """Raises (so Ray replaces this replica) for the reasons of ``health.unhealthy``."""
        why = unhealthy(self.engine, self.quarantined_at_start)
        if why is None and self.listener.done():
            why = "it no longer listens for swaps"
        if why is not None:
            # a built-in type: Ray's controller only logs its text, and
            # unpickles a builtin whatever its environment holds (a
            # ServingError needs treeguard there); nothing was refused with a status
            raise RuntimeError(f"replica {self.replica} is unhealthy: {why}")

    async def _listen(self, after: int) -> None:
        while True:
            cmd = await self.coordinator.next.remote(after)
            after = cmd.seq
            report = await self._apply(cmd)
            await self.coordinator.report.remote(report)

    async def _apply(self, cmd: Command) -> ReplicaReport:
        weights = self.engine.weights
        try:
            if cmd.action == "prepare":
                self.prepared = None
                if weights.active is None or weights.active.version != cmd.version:
                    self.prepared, _ = await asyncio.to_thread(weights.prepare, cmd.version)
            elif cmd.action == "commit":
                prepared, self.prepared = self.prepared, None
                await asyncio.to_thread(weights.swap, cmd.version, prepared=prepared)
            else:
                self.prepared = None
        except Exception as e:  # noqa: BLE001 - any failure is this replica's answer
            log.warning("swap round %s %s failed: %s", cmd.action, cmd.version, e)
            return ReplicaReport.failed(self.replica, cmd.seq, e, _active(self.engine))
        return ReplicaReport(self.replica, cmd.seq, True, active=_active(self.engine))

    def __del__(self) -> None:
        server = getattr(self, "_metrics_server", None)
        if server is not None:
            server.shutdown()


_ENGINE_OPTIONS = ("memory_budget", "watchdog", "cache_dir", "allow_unchecked")


def _exported(store_root: str, version: str | None, spec: Any) -> Served:
    """``version``'s (default the current one's) exported artifact through
    the store's gates, opened with this process's keys (its environment)."""
    return served_from_store(ArtifactStore(store_root), version, spec=spec)


def _active(engine: Server) -> str | None:
    slot = engine.weights.active
    return slot.version if slot is not None else None
