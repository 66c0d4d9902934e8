"""The serving engine: one data plane under every transport.

``Engine`` holds the spec, the weights (load, swap, rollback), the runner
(the jitted function and its compile policy), the batcher, the watchdog
and the metrics, and answers in the protocol's terms: server and model
metadata, readiness, ``infer`` (decode -> validate -> batch -> run ->
judge -> select the outputs) and the control plane (``swap``,
``rollback``). REST (``routes.py``) and gRPC (``grpc_transport.py``) only translate
their messages to and from these calls; errors leave the engine as
``InvalidRequestError`` or ``ServingError`` with their status, and each
transport maps them in one place.

Every decision lives here: which outputs count against a version, when the
watchdog rolls back, what is counted. Nothing that can block (the store's
lock and log, file reads, hashing, a swap's load and checks) runs on the
event loop; each goes to a worker thread.

A NaN or Inf output counts against the version only when the version is to
blame: the input lay within the bounds the serving spec declares, or the
previous version (kept loaded and warm) gives finite outputs on the same
rows (a shadow run, made only when a non-finite output appears). Otherwise
the input is to blame: the request is refused with 422 and the version is
not judged, so no client can force a rollback with an input that overflows
a good model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import jax
import numpy as np

from ..errors import InvalidRequestError, ServingError, TreeguardError
from ..nonfinite import host_all_finite
from ..verify.model import BATCH, Model
from .batcher import Batcher, Unavailable
from .buckets import Admission, admit
from .compile_guard import enable_persistent_cache
from .decode import Decoder
from .metrics import Metrics
from .protocol import (
    InferRequest,
    InferResult,
    TensorMeta,
    datatype_of,
    plain_name,
    refuse,
    requested_outputs,
    response_bytes,
    select_outputs,
)
from .runner import CompiledUnderForbid, Runner, Slot, keystr_of
from .spec import ServingSpec
from .watchdog import Watchdog, WatchdogPolicy
from .weights import Weights

log = logging.getLogger("treeguard.serving")

#: The protocol extensions every transport of this server supports.
EXTENSIONS = ("binary_tensor_data", "treeguard_control")


class Engine:
    """One model served from a store, apart from any transport: the data
    plane and the control plane every transport calls. ``Server``
    (``app.py``) is this with its REST app, the class a user builds; its
    docstring holds the arguments.
    """

    def __init__(
        self,
        model: Model,
        store: Any,
        *,
        spec: ServingSpec | None = None,
        version: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        memory_budget: int | None = None,
        watchdog: WatchdogPolicy | None = None,
        watch_s: float | None = None,
        allow_unchecked: bool = True,
        version_check: Callable[[str], None] | None = None,
    ) -> None:
        if not hasattr(store, "load_verified"):
            from ..store import ArtifactStore

            store = ArtifactStore(store)
        self.model = model
        self.store = store
        self.spec = spec or ServingSpec.from_model(model)
        self.metrics = Metrics(self.spec.name, buckets=self.spec.buckets)
        #: Judges every response of the active version; its window starts
        #: afresh whenever the active version changes.
        self.watchdog = Watchdog(watchdog)
        self.runner = Runner(model, self.spec, metrics=self.metrics)
        self.weights = Weights(
            model,
            self.spec,
            store,
            runner=self.runner,
            metrics=self.metrics,
            memory_budget=memory_budget,
            allow_unchecked=allow_unchecked,
            on_switch=self.watchdog.clear,
            version_check=version_check,
        )
        self.decoder = Decoder(self.spec)
        self.version = version
        self.cache_dir = cache_dir
        self.watch_s = watch_s
        self.batcher: Batcher | None = None
        #: The monotonic clock request deadlines are measured on (a test may
        #: set its own before the engine runs).
        self.clock: Callable[[], float] = time.monotonic
        self.start_error: ServingError | None = None
        #: Called with the error when warm-up finds no version to serve.
        self.on_fatal: Callable[[ServingError], None] | None = None
        self._seen_current: str | None = None
        self._outputs: list[TensorMeta] | None = None
        #: More transports to run beside the one that runs the engine (gRPC
        #: beside REST): contexts entered while ``running`` is open.
        self.transports: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] = []
        self._output_names: dict[str, str] = {}
        self._admissions: dict[int, Admission] = {}

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Loads, checks and warms the first version (blocking; see ``Weights.start``)."""
        if self.cache_dir is not None:
            enable_persistent_cache(self.cache_dir)
        self._seen_current = self.store.current()
        slot = self.weights.start(self.version)
        self._describe_outputs(slot)

    def _describe_outputs(self, slot: Slot) -> None:
        batch = self.spec.inputs.abstract({BATCH: 1})
        shapes = jax.eval_shape(self.model.apply, slot.params, batch)
        metas = []
        for path, leaf in jax.tree.leaves_with_path(shapes):
            key = keystr_of(path)
            name = plain_name(path)
            metas.append(TensorMeta(name, key, datatype_of(leaf.dtype), (-1, *leaf.shape[1:])))
            self._output_names[key] = name
        self._outputs = metas

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Runs the batcher, warms up in a thread (so liveness answers at
        once) and watches the store, for as long as the context is open."""
        self.batcher = Batcher(self.runner, self.weights, clock=self.clock)
        self.batcher.start()
        tasks: list[asyncio.Task[Any]] = []

        async def warm() -> None:
            try:
                await asyncio.to_thread(self.start)
            except ServingError as e:
                self.start_error = e
                log.error("warm-up failed: %s", str(e).splitlines()[0])
                if self.on_fatal is not None:
                    self.on_fatal(e)
            except TreeguardError as e:
                self.start_error = ServingError(str(e).splitlines()[0], status=503)
                log.error("warm-up failed: %s", self.start_error)
                if self.on_fatal is not None:
                    self.on_fatal(self.start_error)

        if not self.weights.ready:
            tasks.append(asyncio.create_task(warm()))
        elif self._outputs is None and self.weights.active is not None:
            self._describe_outputs(self.weights.active)
        if self.watch_s is not None:
            tasks.append(asyncio.create_task(self._watch()))
        try:
            async with contextlib.AsyncExitStack() as stack:
                for transport in self.transports:
                    await stack.enter_async_context(transport())
                yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self.batcher.stop()

    async def _watch(self) -> None:
        assert self.watch_s is not None
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                cur = await asyncio.to_thread(self.store.current)
            except Exception as e:  # noqa: BLE001 - a damaged pointer must not stop serving
                log.warning("watch: cannot read the store's current version: %s", e)
                continue
            if cur is None or cur == self._seen_current or not self.weights.ready:
                continue
            self._seen_current = cur
            try:
                await asyncio.to_thread(self.weights.swap, cur)
                log.info("watch: now serving %s", cur)
            except ServingError as e:
                log.warning("watch: swap to %s refused: %s", cur, str(e).splitlines()[0])

    # -- health and metadata -----------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether a version is loaded, checked and warm, and the batcher runs."""
        return self.weights.ready and self.batcher is not None and self.batcher.running

    def readiness(self) -> dict[str, Any]:
        """``{"ready": bool, ...}``: the error while not ready, the fallback after one."""
        out: dict[str, Any] = {"ready": self.ready}
        if not self.weights.ready:
            out["error"] = (
                str(self.start_error).splitlines()[0] if self.start_error else "warming up"
            )
        elif self.batcher is not None and not self.batcher.running:
            out["error"] = "the batcher is not running (see the server's log)"
        if self.weights.fallback is not None:
            fb = self.weights.fallback
            out["fallback"] = {"from": fb["from"], "to": fb["to"], "reasons": fb["reasons"]}
        return out

    def server_metadata(self) -> dict[str, Any]:
        """The protocol's server metadata: name, version, extensions."""
        from ... import __version__

        return {"name": "treeguard", "version": __version__, "extensions": list(EXTENSIONS)}

    def require_model(self, name: str, version: str | None = None) -> Slot:
        """The active slot, when ``name`` (at ``version``, when given) is served now.

        A transport that knows the model before it reads the request (REST,
        from its path) asks first, so a body is never read for a model that
        cannot answer it.

        Raises:
          ServingError: 404 for another model or version, 503 while not ready.
        """
        if name != self.spec.name:
            raise ServingError(
                "no model of that name", hint=f"this server serves {self.spec.name!r}", status=404
            )
        active = self.weights.active
        # a batcher that stopped or failed refuses the request itself (503)
        if not self.weights.ready or active is None or self.batcher is None:
            raise ServingError(
                "the model is not ready (warming up)",
                hint="poll /v2/health/ready",
                status=503,
            )
        if version is not None and version != active.version:
            raise ServingError(
                "that version is not the one served",
                hint=f"the served version is {active.version}",
                status=404,
            )
        return active

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Whether ``name`` (at ``version``, when given) is served now."""
        try:
            self.require_model(name, version)
        except ServingError:
            return False
        return True

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """The protocol's model metadata: inputs and outputs with their key paths.

        Raises:
          ServingError: 404 for another model or version, 503 while not ready.
        """
        active = self.require_model(name, version)
        assert self._outputs is not None
        return {
            "name": self.spec.name,
            "versions": [active.version],
            "platform": "jax",
            "inputs": [m.to_dict() for m in self.decoder.metadata()],
            "outputs": [m.to_dict() for m in self._outputs],
            "parameters": {"buckets": list(self.spec.buckets), "provenance": self.weights.trail},
        }

    def output_metadata(self) -> list[TensorMeta]:
        """The outputs' metadata (after warm-up)."""
        return list(self._outputs or [])

    def input_metadata(self) -> list[TensorMeta]:
        """The inputs' metadata."""
        return self.decoder.metadata()

    # -- inference ----------------------------------------------------------------

    async def infer(
        self,
        request: InferRequest,
        name: str,
        version: str | None = None,
        *,
        started: float | None = None,
    ) -> InferResult:
        """Runs one parsed request: validate, batch, run, judge, select its outputs.

        A transport parses its message first; a request it refuses while
        parsing it counts with ``refused``, so every request is counted
        once, whatever its transport.

        Args:
          request: the request, parsed by its transport.
          name: the model name the client addressed.
          version: the version the client addressed, or None.
          started: ``time.perf_counter()`` when the request arrived (its
            latency counts from then); default now.

        Returns:
          The ``InferResult``: the outputs asked for, in order.

        Raises:
          InvalidRequestError: 4xx for a request refused before device work,
            or whose non-finite outputs are its input's fault (422).
          ServingError: 404 unknown model, 429 queue full, 503 not ready,
            504 past its deadline, 500 the version failed.
        """
        if started is None:
            started = time.perf_counter()
        try:
            result = await self._infer(request, name, version)
        except BaseException as e:
            self.refused(e, started)
            raise
        self.metrics.request(200, time.perf_counter() - started)
        return result

    def refused(self, e: BaseException, started: float) -> None:
        """Counts one request that ended in ``e``: its status and latency, and
        an invalid input's reason. ``infer`` counts its own; a transport
        calls this for a request it refused before it could call ``infer``
        (a body or a message that does not parse, a deadline), so every
        refusal is counted once, whatever the transport.

        Args:
          e: why the request ended: a typed error, a transport's own refusal
            (with a ``status``), or a cancel (counted as 499).
          started: ``time.perf_counter()`` when the request began.
        """
        if isinstance(e, InvalidRequestError):
            self.metrics.invalid_inputs.labels(model=self.spec.name, reason=e.reason).inc()
        if isinstance(e, (InvalidRequestError, ServingError)):
            status = e.status
        elif isinstance(e, asyncio.CancelledError):  # the client or the server gave up on it
            status = 499
        else:  # a transport's own refusal (a deadline, a disconnect), or a failure
            status = getattr(e, "status", 499 if isinstance(e, Exception) else 500)
        self.metrics.request(status, time.perf_counter() - started)

    async def _infer(self, request: InferRequest, name: str, version: str | None) -> InferResult:
        self.require_model(name, version)
        assert self.batcher is not None
        leaves, adm = self._admit(request)
        served = self.weights.active.version if self.weights.active else "?"
        try:
            batcher = self.batcher
            ran = batcher.run_now(leaves, adm.rows, adm.chunks)
            outputs, served = ran or await batcher.submit(leaves, adm.rows, adm.chunks)
        except TimeoutError:
            raise ServingError(
                f"no result within {self.spec.limits.timeout_s:g} s",
                hint="retry later, or send fewer rows",
                status=504,
            ) from None
        except CompiledUnderForbid as e:
            active = self.weights.active_version
            trigger = self.watchdog.forbidden_compile(served, active, e.batch)
            if trigger is not None:
                await self._roll_back(trigger)
            raise
        except ServingError as e:
            if e.status >= 500 and not isinstance(e, Unavailable):  # the version's failure
                await self._judge(served, nonfinite=False, error=True)
            raise
        except Exception as e:  # noqa: BLE001 - a model failure is a 500, never a crash
            log.error("batch failed: %s", type(e).__name__)
            await self._judge(served, nonfinite=False, error=True)
            raise ServingError(
                f"the model failed on this batch ({type(e).__name__})", status=500
            ) from None
        names = self._output_names
        bad = [names.get(p, p or "output") for p, x in outputs if not host_all_finite(x)]
        if bad:
            await self._nonfinite(served, leaves, bad)
        else:  # ``_judge`` of a good response, with no coroutine unless it trips
            trigger = self.watchdog.record(
                served, self.weights.active_version, nonfinite=False, error=False
            )
            if trigger is not None:
                await self._roll_back(trigger)
        return InferResult(
            self.spec.name, served, select_outputs(request, outputs, names), request.id
        )

    def _admit(self, request: InferRequest) -> tuple[list[np.ndarray[Any, Any]], Admission]:
        """The request's arrays and its admission (rows, bucket chunks), every
        refusal before any device work: outputs asked for, inputs, the
        response's size, the rows."""
        spec = self.spec
        if request.outputs is not None:
            # each output once, every name known, before any work: a name
            # repeated 90,000 times costs one output, not 90,000 copies of it
            request.outputs = requested_outputs(request.outputs, list(self._output_names.values()))
        leaves = self.decoder.decode(request)
        rows = int(leaves[0].shape[0])
        size = response_bytes(request, self._outputs or [], rows)
        if size > spec.limits.max_response_bytes:
            raise refuse(
                f"the response would take up to {size} bytes, over the limit of "
                f"{spec.limits.max_response_bytes} (limits.max_response_bytes)",
                "size",
                413,
                hint="send fewer rows, ask for fewer outputs, or ask for them as binary data",
            )
        adm = self._admissions.get(rows)
        if adm is None:
            adm = admit(rows, spec.buckets, max_rows=spec.limits.max_rows, overflow=spec.overflow)
            if adm.ok and rows <= spec.largest:
                self._admissions[rows] = adm  # bounded: one per row count a bucket holds
        if not adm.ok:
            raise refuse(adm.detail, "size", 413 if adm.reason != "empty" else 422)
        return leaves, adm

    async def _nonfinite(
        self, version: str, leaves: list[np.ndarray[Any, Any]], bad: list[str]
    ) -> None:
        """Decides who is to blame for a NaN or Inf output, and raises."""
        where = ", ".join(bad)
        if self.spec.bounds is not None:
            blamed, why = True, "on an input within the served bounds"
        else:
            prev = self.weights.previous
            finite = prev is not None and await asyncio.to_thread(self._finite_on, prev, leaves)
            blamed = bool(finite)
            why = f"where the previous version {prev.version} gives finite outputs" if prev else ""
        self.metrics.nonfinite_outputs.labels(
            model=self.spec.name, version=version, blame="version" if blamed else "input"
        ).inc()
        if blamed:
            await self._judge(version, nonfinite=True, error=False)
            raise ServingError(
                f"version {version} gave NaN or Inf in output {where} {why}",
                hint="the watchdog rolls back a version that keeps doing so",
                status=500,
            )
        await self._judge(version, nonfinite=False, error=False)
        raise refuse(
            f"the outputs {where} are NaN or Inf for this input, and no other version "
            "shows that the version is at fault",
            "nonfinite_output",
            hint="send inputs within the model's domain",
        )

    def _finite_on(self, slot: Slot, leaves: list[np.ndarray[Any, Any]]) -> bool:
        """The shadow check: whether ``slot`` gives finite outputs on these rows."""
        rows = int(leaves[0].shape[0])
        largest = self.spec.largest
        for start in range(0, rows, largest):
            n = min(largest, rows - start)
            outs, _ = self.runner.run(
                slot, [x[start : start + n] for x in leaves], n, phase="shadow"
            )
            for _, x in outs:
                if not host_all_finite(x):
                    return False
        return True

    async def _judge(self, version: str, *, nonfinite: bool, error: bool) -> None:
        trigger = self.watchdog.record(
            version, self.weights.active_version, nonfinite=nonfinite, error=error
        )
        if trigger is not None:
            await self._roll_back(trigger)

    async def _roll_back(self, trigger: str) -> None:
        """The watchdog's rollback, off the event loop (it writes to the store)."""
        await asyncio.to_thread(self.weights.auto_rollback, trigger)

    # -- control ----------------------------------------------------------------------

    async def swap(self, version: str) -> dict[str, Any]:
        """Hot-swaps to ``version`` in a worker thread (see ``Weights.swap``)."""
        if not self.weights.ready:
            raise ServingError("the server is not ready", hint="poll /v2/health/ready", status=503)
        return await asyncio.to_thread(self.weights.swap, version)

    async def rollback(self) -> dict[str, Any]:
        """Serves the previous version again, in a worker thread (see ``Weights.rollback``)."""
        return await asyncio.to_thread(self.weights.rollback, "manual")

    def status(self) -> dict[str, Any]:
        """The server's state: versions, buckets, compile counts, readiness."""
        out = self.weights.status()
        out["model"] = self.spec.name
        out["queue_depth"] = self.batcher.depth if self.batcher else 0
        if self.start_error:
            out["error"] = str(self.start_error).splitlines()[0]
        return out
