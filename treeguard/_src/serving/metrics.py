"""The server's Prometheus metrics, in a registry of its own.

Labels are bounded: the model name, the version (a store name), the bucket
(one of the spec's), an HTTP status code, a reason, phase, result or trigger
from a fixed list. No metric ever holds a value from a request.

What the hot path records (each request's status and latency, each batch's
rows and device time, each wait in the queue) is appended to a queue as it
happens and folded into the series when the registry is collected (a scrape
of ``/metrics``, or a replica's own exporter), or once ``FOLD_AT``
observations wait: a scrape always sees every one recorded before it.
"""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # imported when a server is built (the serve extra)
    from prometheus_client import Counter, Gauge

#: How many observations of one kind may wait before the next one folds them.
FOLD_AT = 4096
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: The fixed label values.
INVALID_REASONS = ("shape", "dtype", "size", "schema", "nonfinite", "bounds", "nonfinite_output")
ROLLBACK_TRIGGERS = ("manual", "nonfinite", "5xx", "compile", "warmup")
#: Why the transport dropped a connection or a request before the engine saw it.
DROP_REASONS = (
    "disconnect",
    "header_timeout",
    "body_timeout",
    "connections",
    "bodies",
    "shutdown",
)
SWAP_RESULTS = ("ok", "refused", "failed")
COMPILE_PHASES = ("warmup", "serving", "swap", "shadow")


class _Declared(NamedTuple):
    """One metric: the attribute that holds it, its kind (``counter``,
    ``gauge``, ``histogram``), name, help and labels, and a histogram's
    bounds (None: the spec's buckets)."""

    attr: str
    kind: str
    name: str
    documentation: str
    labels: tuple[str, ...]
    bounds: tuple[float, ...] | None = None


#: Every metric of a server, in the order it is registered.
_DECLARED = (
    _Declared(
        "requests",
        "counter",
        "treeguard_requests_total",
        "Inference requests by HTTP status.",
        ("model", "status"),
    ),
    _Declared(
        "request_duration",
        "histogram",
        "treeguard_request_duration_seconds",
        "Request latency, arrival to response.",
        ("model",),
        _LATENCY,
    ),
    _Declared(
        "queue_duration",
        "histogram",
        "treeguard_queue_duration_seconds",
        "Time a request waited for its batch.",
        ("model",),
        _LATENCY,
    ),
    _Declared(
        "compute_duration",
        "histogram",
        "treeguard_compute_duration_seconds",
        "Device time of one batch.",
        ("model", "bucket"),
        _LATENCY,
    ),
    _Declared(
        "batch_size",
        "histogram",
        "treeguard_batch_size",
        "Rows of real requests in a batch.",
        ("model",),
    ),
    _Declared(
        "padding_ratio",
        "histogram",
        "treeguard_padding_ratio",
        "Share of a batch's rows that are padding.",
        ("model",),
        (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
    ),
    _Declared(
        "compiles",
        "counter",
        "treeguard_compiles_total",
        "XLA compiles by phase.",
        ("model", "phase"),
    ),
    _Declared(
        "invalid_inputs",
        "counter",
        "treeguard_invalid_inputs_total",
        "Refused inputs by reason.",
        ("model", "reason"),
    ),
    _Declared(
        "nonfinite_outputs",
        "counter",
        "treeguard_nonfinite_outputs_total",
        "Responses whose outputs held NaN or Inf, by who is to blame (version or input).",
        ("model", "version", "blame"),
    ),
    _Declared(
        "queue_depth",
        "gauge",
        "treeguard_queue_depth",
        "Requests waiting for a batch.",
        ("model",),
    ),
    _Declared(
        "swaps", "counter", "treeguard_swaps_total", "Hot swaps by result.", ("model", "result")
    ),
    _Declared(
        "rollbacks",
        "counter",
        "treeguard_rollbacks_total",
        "Rollbacks by trigger.",
        ("model", "trigger"),
    ),
    _Declared(
        "model_info",
        "gauge",
        "treeguard_model_info",
        "1 for the version being served.",
        ("model", "version"),
    ),
    _Declared(
        "dropped",
        "counter",
        "treeguard_dropped_requests_total",
        "Connections or requests dropped before the engine saw them, by reason.",
        ("model", "reason"),
    ),
)
#: The label values every server shows from its start (at 0): metric, label, values.
_PRESET = (
    ("invalid_inputs", "reason", INVALID_REASONS),
    ("dropped", "reason", DROP_REASONS),
    ("compiles", "phase", COMPILE_PHASES),
)


class _Histogram:
    """A histogram fed the waiting observations of a fold: a few list
    updates under a lock, turned into Prometheus's form only when collected
    (``prometheus_client``'s own ``observe`` costs several times as much).

    Example:
      >>> h = _Histogram("treeguard_x", "X.", ("model", "bucket"), (0.5, 1.0))
      >>> h.child(("mlp", "4")).observe_many([0.7])
      >>> [s.value for s in next(iter(h.collect())).samples][:3]
      [0, 1, 1]
    """

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], bounds: Sequence[float]
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labels = tuple(labels)
        self.bounds = tuple(float(b) for b in bounds)
        self._children: dict[tuple[str, ...], _HistogramChild] = {}
        self._lock = threading.Lock()

    def child(self, values: tuple[str, ...]) -> _HistogramChild:
        """The series of one set of label values (made on first use)."""
        found = self._children.get(values)
        if found is None:
            with self._lock:
                found = self._children.setdefault(values, _HistogramChild(self.bounds))
        return found

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, child in list(self._children.items()):
            counts, total = child.snapshot()
            cumulative, running = [], 0
            for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
                running += n
                cumulative.append((_bound_text(bound), running))
            family.add_metric(list(values), cumulative, total)
        yield family


class _HistogramChild:
    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Sequence[float]) -> None:
        """Counts each value in its bucket, under one lock."""
        bounds, counts = self._bounds, self._counts
        found = [bisect.bisect_left(bounds, v) for v in values]
        with self._lock:
            for i in found:
                counts[i] += 1
            self._sum += sum(values)

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self._counts), self._sum


def _bound_text(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    out: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return out


class Metrics:
    """Every metric of one server, registered in its own ``CollectorRegistry``.

    Example:
      >>> m = Metrics("mlp", buckets=(1, 2, 4))
      >>> m.requests.labels(model="mlp", status="200").inc()
      >>> b"treeguard_requests_total" in m.render()
      True
    """

    # the metrics ``_DECLARED`` makes, one attribute each
    requests: Counter
    request_duration: _Histogram
    queue_duration: _Histogram
    compute_duration: _Histogram
    batch_size: _Histogram
    padding_ratio: _Histogram
    compiles: Counter
    invalid_inputs: Counter
    nonfinite_outputs: Counter
    queue_depth: Gauge
    swaps: Counter
    rollbacks: Counter
    model_info: Gauge
    dropped: Counter

    def __init__(self, model: str, *, buckets: tuple[int, ...]) -> None:
        # prometheus_client is imported only when a server is built (the serve extra)
        from prometheus_client import CollectorRegistry

        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        # first in the registry: whoever collects it (``render``, or a
        # replica's own exporter) folds the waiting observations before any
        # series is read
        self.registry.register(_Folding(self))  # type: ignore[arg-type]
        for declared in _DECLARED:
            setattr(self, declared.attr, self._made(declared, buckets))
        for attr, label, values in _PRESET:  # every fixed label value shows, at 0
            for value in values:
                getattr(self, attr).labels(model=model, **{label: value})
        self._served: str | None = None
        # children bound once: the hot path pays no label lookup
        self._request_duration = self.request_duration.child((model,))
        self._queue_duration = self.queue_duration.child((model,))
        self._batch_size = self.batch_size.child((model,))
        self._padding_ratio = self.padding_ratio.child((model,))
        self._queue_depth = self.queue_depth.labels(model=model)
        self._by_status: dict[int, Any] = {}
        self._by_bucket: dict[int, Any] = {}
        # observations waiting to be folded (deques: appended and taken off
        # from several threads without a lock)
        self._requests: collections.deque[tuple[int, float]] = collections.deque()
        self._batches: collections.deque[tuple[int, int, float]] = collections.deque()
        self._waits: collections.deque[float] = collections.deque()
        self._fold_lock = threading.Lock()

    def _made(self, declared: _Declared, buckets: tuple[int, ...]) -> Any:
        """One declared metric, registered in this server's registry."""
        d = declared
        if d.kind == "histogram":
            bounds = d.bounds if d.bounds is not None else tuple(float(b) for b in buckets)
            histogram = _Histogram(d.name, d.documentation, d.labels, bounds)
            self.registry.register(histogram)  # type: ignore[arg-type]
            return histogram
        from prometheus_client import Counter, Gauge  # as in ``__init__``

        kind = Counter if d.kind == "counter" else Gauge
        return kind(d.name, d.documentation, list(d.labels), registry=self.registry)

    def request(self, status: int, seconds: float) -> None:
        """Counts one answered request."""
        waiting = self._requests
        waiting.append((status, seconds))
        if len(waiting) >= FOLD_AT:
            self.fold()

    def batch(self, rows: int, bucket: int, seconds: float) -> None:
        """Records one batch: its real rows, its bucket and its device time."""
        waiting = self._batches
        waiting.append((rows, bucket, seconds))
        if len(waiting) >= FOLD_AT:
            self.fold()

    def queued(self, seconds: float) -> None:
        """Records how long one request waited for its batch."""
        waiting = self._waits
        waiting.append(seconds)
        if len(waiting) >= FOLD_AT:
            self.fold()

    def queued_many(self, seconds: Sequence[float]) -> None:
        """Records how long each request of one batch waited for it."""
        waiting = self._waits
        waiting.extend(seconds)
        if len(waiting) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Folds every waiting observation into its series (``render`` does
        it first). Safe beside threads that record: each is taken off its
        queue once."""
        with self._fold_lock:
            requests = _drain(self._requests)
            batches = _drain(self._batches)
            waits = _drain(self._waits)
            if requests:
                by_status = collections.Counter(status for status, _ in requests)
                for status, n in by_status.items():
                    child = self._by_status.get(status)
                    if child is None:
                        child = self._by_status[status] = self.requests.labels(
                            model=self.model, status=str(status)
                        )
                    child.inc(n)
                self._request_duration.observe_many([s for _, s in requests])
            if batches:
                by_bucket: dict[int, list[float]] = {}
                for _, bucket, seconds in batches:
                    by_bucket.setdefault(bucket, []).append(seconds)
                for bucket, seconds in by_bucket.items():
                    child = self._by_bucket.get(bucket)
                    if child is None:
                        child = self._by_bucket[bucket] = self.compute_duration.child(
                            (self.model, str(bucket))
                        )
                    child.observe_many(seconds)
                self._batch_size.observe_many([float(rows) for rows, _, _ in batches])
                self._padding_ratio.observe_many(
                    [(bucket - rows) / bucket for rows, bucket, _ in batches]
                )
            if waits:
                self._queue_duration.observe_many(waits)

    def depth(self, n: int) -> None:
        """Sets the queue depth."""
        self._queue_depth.set(n)

    def set_version(self, version: str) -> None:
        """Marks ``version`` as the one served."""
        if self._served is not None and self._served != version:
            self.model_info.remove(self.model, self._served)
        self.model_info.labels(model=self.model, version=version).set(1)
        self._served = version

    def render(self) -> bytes:
        """The text exposition format."""
        from prometheus_client import generate_latest

        out: Any = generate_latest(self.registry)
        return bytes(out)


class _Folding:
    """A collector with no series of its own: collecting it folds what waits."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        self.metrics.fold()
        return iter(())


def _drain(waiting: collections.deque[Any]) -> list[Any]:
    """Takes every item off ``waiting``, oldest first (``popleft`` is atomic,
    so an item appended meanwhile is taken now or by the next drain)."""
    out = []
    pop = waiting.popleft
    for _ in range(len(waiting)):
        out.append(pop())
    return out
