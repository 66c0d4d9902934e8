"""``Server``: the engine with its transports, and ``serve`` to run it.

``Server`` is the ``Engine`` (the data plane) that can build its REST app
(``app()``, starlette, for uvicorn or ``httpx.ASGITransport``). ``serve``
runs it under uvicorn with the transport hardened: a deadline for a
request's headers and a bound on their bytes, a cap on open connections
kept below the open-file limit (raised at start where the hard limit
allows) with the oldest idle connection closed to make room, and (in the app) a body
deadline and a cap on bodies read at once, and bodies still arriving at
shutdown answered at once; with ``grpc_port``, the gRPC transport runs
beside it on the same engine.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, ServingError
from .bodies import BodyReads
from .engine import Engine
from .token import is_loopback
from .transport import MAX_METADATA_BYTES, connection_cap, raise_file_limit

log = logging.getLogger("treeguard.serving")


class Server(Engine):
    """One model served from a store: the engine (decode, validate, batch,
    run, judge, select the outputs; swap and rollback) with its transports.

    Args:
      model: the ``treeguard.verify.Model``; its ``apply`` is served.
      store: the ``ArtifactStore`` (or its root).
      spec: the ``ServingSpec``; default: every batch input of the model.
      version: the version to start with; default the store's current one.
      cache_dir: where the persistent compilation cache lives; None leaves
        JAX's setting alone.
      memory_budget: the bytes all loaded params may take (active, previous
        and a version being loaded); None for the device's free memory when
        it reports one.
      watchdog: the ``WatchdogPolicy`` of automatic rollback.
      watch_s: poll the store's current pointer this often and swap to a
        new current version; None not to watch.
      allow_unchecked: serve versions verified with no model check
        (``treeguard serve`` passes False unless ``--allow-unchecked``).
      version_check: called with each version before it is loaded or
        returned to; what it raises refuses the version (``treeguard serve
        --store`` without ``MODULE:ATTR`` passes its artifact's gates).

    Example:
      >>> import tempfile, jax
      >>> import treeguard
      >>> from treeguard.examples import mlp
      >>> from treeguard.serving import ServingSpec
      >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
      >>> v = store.put(mlp.init(jax.random.key(0)))
      >>> store.verify(v).status
      'verified'
      >>> store.promote(v)
      >>> spec = ServingSpec.from_model(mlp.model, inputs=["['x']"], buckets=(1,))
      >>> server = Server(mlp.model, store, spec=spec)
      >>> server.start()
      >>> server.status()["compiles"]["warmup"], server.status()["active"] == v
      (1, True)
    """

    def app(self, *, control_token: bytes | None = None) -> Any:
        """The starlette ASGI app: the Open Inference Protocol's REST routes,
        and treeguard's swap, rollback, status and ``/metrics``.

        Args:
          control_token: the bearer token ``swap`` and ``rollback`` require.
        """
        # starlette is imported only when an app is built (the serve extra)
        from .routes import build_app

        return build_app(self, control_token=control_token)

    def serve(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        control_token: bytes | None = None,
        grpc_port: int | None = None,
        access_log: bool = False,
    ) -> None:
        """Runs this server under uvicorn, one process, one worker (JAX owns
        the device), until it is stopped.

        Scale out with replicas of this process, one per device set.

        Args:
          host: the address REST (and gRPC) bind.
          port: the REST port.
          control_token: the bearer token swap and rollback require; needed
            for any host but loopback.
          grpc_port: also serve ``inference.GRPCInferenceService`` on this port.
          access_log: log one line per request (uvicorn's access log); off by
            default, as ``/metrics`` counts every request by status.

        Raises:
          ConfigError: for a non-loopback ``host`` without a control token.
          ServingError: when warm-up finds no version to serve (each named,
            with why).

        Example:
          Serving blocks until the process is stopped (the serving guide starts
          one); an address other machines can reach is refused without a token:

          >>> import tempfile
          >>> import treeguard
          >>> from treeguard.examples import mlp
          >>> server = Server(mlp.model, treeguard.ArtifactStore.init(tempfile.mkdtemp()))
          >>> server.serve(host="0.0.0.0")
          Traceback (most recent call last):
          treeguard.ConfigError: --host 0.0.0.0 is reachable from other machines, ...
        """
        import uvicorn

        from .routes import build_app  # starlette, as uvicorn: only when a server runs

        if control_token is None and not is_loopback(host):
            raise ConfigError(
                f"--host {host} is reachable from other machines, and swap and rollback would "
                "have no authentication",
                hint="pass --control-token-file FILE, or bind 127.0.0.1",
            )
        limits = self.spec.limits
        files = raise_file_limit()
        connections = connection_cap(limits.max_connections, files.soft)

        def dropped(reason: str) -> None:
            self.metrics.dropped.labels(model=self.spec.name, reason=reason).inc()

        # bodies still arriving when the server shuts down are answered 503 at
        # once: uvicorn would wait out its grace period, then cancel their
        # requests with a traceback each
        bodies = BodyReads()
        config = uvicorn.Config(
            build_app(self, control_token=control_token, bodies=bodies),
            host=host,
            port=port,
            workers=1,
            log_level="info",
            access_log=access_log,
            http=_hardened_protocol(limits.header_timeout_s, connections, dropped, bodies.close),
            limit_concurrency=connections + 1,
            backlog=connections,
            h11_max_incomplete_event_size=MAX_METADATA_BYTES,
            timeout_keep_alive=5,
            timeout_graceful_shutdown=5,
            log_config=_log_config(uvicorn.config.LOGGING_CONFIG),
        )
        log.info(
            "%s; at most %d connections per transport%s",
            files.describe(),
            connections,
            ""
            if connections == limits.max_connections
            else f" (limits.max_connections is {limits.max_connections}: "
            "the file limit leaves less)",
        )
        if grpc_port is not None:
            # grpcio and protobuf are imported only when gRPC is served (the grpc extra)
            from .grpc_transport import grpc_transport

            self.transports.append(
                grpc_transport(self, host=host, port=grpc_port, connections=connections)
            )
        runner = uvicorn.Server(config)

        def fatal(_: ServingError) -> None:
            runner.should_exit = True

        self.on_fatal = fatal
        runner.run()
        if self.start_error is not None:
            raise self.start_error


def _hardened_protocol(
    header_timeout_s: float,
    connections: int,
    on_drop: Callable[[str], None],
    on_shutdown: Callable[[], None],
) -> type:
    """uvicorn's HTTP protocol with a deadline on each request's headers, a
    bound on their bytes, and room for a new connection made by closing the
    oldest idle one (see ``_Hardened``): httptools' (its parser is in C)
    when it is installed, else h11's.

    Args:
      header_timeout_s: the deadline on a request's headers.
      connections: the most connections open at once.
      on_drop: called with the reason of each connection it closes.
      on_shutdown: called (once per open connection) when the server begins
        to shut down, before uvicorn's own handling.
    """
    base: type
    hooks: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base, hooks = HttpToolsProtocol, _HttpToolsHooks
    except ImportError:  # httptools is not installed: the pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base, hooks = H11Protocol, _H11Hooks
    settings = {
        "header_timeout_s": header_timeout_s,
        "max_connections": connections,
        "on_drop": staticmethod(on_drop),
        "on_shutdown": staticmethod(on_shutdown),
        # the connections with no request in flight, oldest first (a dict
        # keeps the order its keys were added in)
        "idle": {},
    }
    return type("Protocol", (hooks, base), settings)


_Base: Any = object  # uvicorn's protocol, placed after these in each server's class


class _Hardened(_Base):  # type: ignore[misc]
    """What hardens uvicorn's HTTP protocol (``_hardened_protocol`` sets the
    class attributes).

    uvicorn's keep-alive timeout stops once a byte arrives, so a client that
    trickles its headers would hold its connection for ever; this closes a
    connection whose request headers are not whole within the deadline.
    Past ``max_connections`` open connections, a new one closes the
    connection that has waited longest without a request in flight (no
    headers whole yet, or kept alive after its response): idle connections
    by the thousand never lock a new client out. When every other
    connection has a request in flight, the new one is answered 503
    (uvicorn's ``limit_concurrency``, set one above ``max_connections``).
    """

    header_timeout_s: float
    max_connections: int
    on_drop: Callable[[str], None]
    on_shutdown: Callable[[], None]
    idle: dict[Any, None]
    _deadline: asyncio.TimerHandle | None = None
    _cycles = 0
    _head = 0  # bytes of request line and headers so far (httptools)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire, self._cycles)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, cycles: int) -> None:
        if cycles == self._cycles and not self.transport.is_closing():
            self.on_drop("header_timeout")
            log.info("connection closed: its request headers took over %g s", self.header_timeout_s)
            self._drop()

    def _drop(self) -> None:
        """Closes the connection; at once, its unsent bytes dropped, when a
        response is still waiting for its client to read it (a close
        would wait for that for ever, holding the descriptor and the bytes)."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def _headers_whole(self) -> None:
        self._cycles += 1
        self._head = 0
        self._disarm()
        self.idle.pop(self, None)

    def _make_room(self) -> None:
        victim = next((c for c in self.idle if c is not self), None)
        if victim is None:  # every other one has a request in flight: uvicorn's 503
            return
        del self.idle[victim]
        victim._disarm()
        self.connections.discard(victim)  # counted out now, not when its loss is handled
        self.on_drop("connections")
        victim._drop()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()
        self.idle[self] = None
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.idle.pop(self, None)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self.on_shutdown()
        super().shutdown()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets its own deadline
            if self.cycle is None or self.cycle.response_complete:  # none pipelined
                self.idle[self] = None


class _H11Hooks(_Hardened):
    """h11's parser hands over events; a new cycle means whole headers."""

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:
            self._headers_whole()


class _HttpToolsHooks(_Hardened):
    """httptools calls back for the URL and each header, and once they are whole."""

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._head += n
        if self._head > MAX_METADATA_BYTES:  # uvicorn answers 400 and closes
            raise ValueError(f"request headers over {MAX_METADATA_BYTES} bytes")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._headers_whole()


def _log_config(base: dict[str, Any]) -> dict[str, Any]:
    """uvicorn's logging configuration with treeguard's own lines (``treeguard.*``
    at INFO) written beside uvicorn's, through the same handler.

    Example:
      >>> import uvicorn.config
      >>> _log_config(uvicorn.config.LOGGING_CONFIG)["loggers"]["treeguard"]["level"]
      'INFO'
    """
    config = copy.deepcopy(base)
    config["loggers"]["treeguard"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config
