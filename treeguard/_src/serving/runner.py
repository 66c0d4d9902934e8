"""Running the served function: a slot, warm-up, one batch, the compile policy.

A ``Slot`` is one loaded version (its params on the device and their
spec). ``Runner`` owns the jitted function of one server, its compile
guard and the signatures it warmed: ``warm`` runs every bucket once with a
slot's params, ``run`` pads one batch to its bucket, calls the function and
slices the padding off. A compile after warm-up is explained from the
warmed signatures and, under the ``forbid`` policy, ends the batch with
``CompiledUnderForbid``: a value the engine reports to its watchdog.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..errors import ServingError
from ..spec import TreeSpec
from ..verify.model import BATCH, Model
from .buckets import bucket_for, pad_rows
from .compile_guard import CompileGuard, Signature, explain, signature
from .metrics import Metrics
from .spec import CompilePolicy, ServingSpec

log = logging.getLogger("treeguard.serving")


@dataclasses.dataclass(frozen=True, eq=False)
class Slot:
    """One loaded version: its params on the device and their spec."""

    version: str
    params: Any
    spec: TreeSpec
    nbytes: int
    digest: str = ""  # the file digest the params were loaded and verified under


class CompiledUnderForbid(ServingError):
    """503: a batch needed a compile after warm-up under the ``forbid``
    policy. ``batch`` numbers the batch, so that every request of it reports
    the same one to the watchdog."""

    def __init__(self, message: str, *, batch: int) -> None:
        super().__init__(
            message, hint="send inputs of the served dtypes; see /v2/treeguard/status", status=503
        )
        self.batch = batch


class Runner:
    """Runs batches of one model's ``apply`` on a slot's params.

    Args:
      model: the ``treeguard.verify.Model``; its ``apply`` is served.
      spec: the ``ServingSpec`` (buckets, compile policy).
      metrics: where batches and compiles are counted.
    """

    def __init__(self, model: Model, spec: ServingSpec, *, metrics: Metrics) -> None:
        self.spec = spec
        self.metrics = metrics
        self.guard = CompileGuard(on_compile=self._on_compile)
        self.fn = jax.jit(_served(model.apply, spec.inputs.treedef))
        self.warmed: list[Signature] = []
        self._out_paths: dict[Any, list[str]] = {}
        self._forbidden = itertools.count()

    def _on_compile(self, phase: str) -> None:
        self.metrics.compiles.labels(model=self.metrics.model, phase=phase).inc()

    def run(
        self,
        slot: Slot,
        leaves: Sequence[np.ndarray[Any, Any]],
        rows: int,
        *,
        phase: str = "serving",
        bucket: int | None = None,
    ) -> tuple[list[tuple[str, np.ndarray[Any, Any]]], str]:
        """Runs one batch of ``rows`` real rows, padded to its bucket.

        Returns:
          ``[(output path, rows of output)]`` with padding sliced off, and the
          version that computed it.

        Raises:
          CompiledUnderForbid: 503 for a compile under ``forbid`` after
            warm-up (the engine reports it to its watchdog).
          ServingError: 500 for an output without the batch axis first.
        """
        size = bucket or bucket_for(rows, self.spec.buckets) or rows
        # every input holds the same rows (the decoder saw to it)
        padded = leaves if rows == size else [pad_rows(x, size) for x in leaves]
        before = self.guard.counts[phase]
        start = time.perf_counter()
        guard = self.guard
        token = guard.enter(phase)
        try:
            out = self.fn(slot.params, *padded)
            if isinstance(out, jax.Array):  # one output, the root: no tree to walk
                host = [("", np.asarray(out))]
            else:
                flat, treedef = jax.tree_util.tree_flatten(out)
                host = list(zip(self._output_paths(treedef), map(np.asarray, flat)))
        finally:
            guard.leave(token)
        serving = phase == "serving"
        if serving:
            self.metrics.batch(rows, size, time.perf_counter() - start)
        if serving and self.guard.counts[phase] > before:
            sig = signature([*padded, *jax.tree.leaves(slot.params)])
            paths = [*self.spec.input_paths, *(f"params{lf.path}" for lf in slot.spec.leaves)]
            why = explain(sig, self.warmed, paths)
            policy = self.spec.compile_policy
            log.warning("compile after warm-up (policy %s): %s", policy.value, why)
            if policy is CompilePolicy.FORBID:
                raise CompiledUnderForbid(
                    f"this request needed a compile after warm-up, which the policy forbids: {why}",
                    batch=next(self._forbidden),
                )
        for path, x in host:
            if x.ndim == 0 or x.shape[0] != size:
                raise ServingError(
                    f"output {path or '<root>'} has shape {x.shape}, without the batch axis first",
                    hint=f"apply must return outputs with axis {BATCH!r} first",
                    status=500,
                )
        if rows == size:
            return host, slot.version
        return [(p, x[:rows]) for p, x in host], slot.version

    def _output_paths(self, treedef: Any) -> list[str]:
        paths = self._out_paths.get(treedef)
        if paths is None:
            skeleton = jax.tree.unflatten(treedef, [0] * treedef.num_leaves)
            paths = [keystr_of(p) for p, _ in jax.tree.leaves_with_path(skeleton)]
            self._out_paths[treedef] = paths
        return paths

    def warm(self, slot: Slot, *, phase: str) -> None:
        """Runs every bucket once with ``slot``'s params (compiling it if new)."""
        for b in self.spec.buckets:
            zeros = [
                np.zeros((b, *(int(d) for d in leaf.shape[1:])), leaf.dtype)
                for leaf in self.spec.inputs.leaves
            ]
            self.run(slot, zeros, b, phase=phase, bucket=b)
            sig = signature([*zeros, *jax.tree.leaves(slot.params)])
            if sig not in self.warmed:
                self.warmed.append(sig)


def _served(apply: Callable[[Any, Any], Any], inputs: Any) -> Callable[..., Any]:
    """A function of this server's own, so its compile cache and counts are
    its own; it takes the inputs' leaves as arguments (``inputs`` is their
    tree's structure), so no batch tree is built for each call."""

    def served(params: Any, *leaves: Any) -> Any:
        return apply(params, inputs.unflatten(leaves))

    return served


def keystr_of(path: Sequence[Any]) -> str:
    """A JAX key path as text, ``"['x']"``; the empty path is the root."""
    return jax.tree_util.keystr(tuple(path))
