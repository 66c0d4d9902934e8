"""The server's Prometheus metrics, in a registry of its own.

Labels are bounded: the model name, the version (a store name), the bucket
(one of the spec's), an HTTP status code, a reason, phase, result or trigger
from a fixed list. No metric ever holds a value from a request.
"""

from __future__ import annotations

from typing import Any

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: The fixed label values.
INVALID_REASONS = ("shape", "dtype", "size", "schema", "nonfinite", "bounds", "nonfinite_output")
ROLLBACK_TRIGGERS = ("manual", "nonfinite", "5xx", "compile", "warmup")
#: Why the transport dropped a connection or a request before the engine saw it.
DROP_REASONS = ("disconnect", "header_timeout", "body_timeout", "connections", "bodies")
SWAP_RESULTS = ("ok", "refused", "failed")


class Metrics:
    """Every metric of one server, registered in its own ``CollectorRegistry``.

    Example:
      >>> m = Metrics("mlp", buckets=(1, 2, 4))
      >>> m.requests.labels(model="mlp", status="200").inc()
      >>> b"treeguard_requests_total" in m.render()
      True
    """

    def __init__(self, model: str, *, buckets: tuple[int, ...]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "treeguard_requests_total",
            "Inference requests by HTTP status.",
            ["model", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "treeguard_request_duration_seconds",
            "Request latency, arrival to response.",
            ["model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_duration = Histogram(
            "treeguard_queue_duration_seconds",
            "Time a request waited for its batch.",
            ["model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.compute_duration = Histogram(
            "treeguard_compute_duration_seconds",
            "Device time of one batch.",
            ["model", "bucket"],
            buckets=_LATENCY,
            registry=r,
        )
        edges = tuple(float(b) for b in buckets)
        self.batch_size = Histogram(
            "treeguard_batch_size",
            "Rows of real requests in a batch.",
            ["model"],
            buckets=edges,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "treeguard_padding_ratio",
            "Share of a batch's rows that are padding.",
            ["model"],
            buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=r,
        )
        self.compiles = Counter(
            "treeguard_compiles_total", "XLA compiles by phase.", ["model", "phase"], registry=r
        )
        self.invalid_inputs = Counter(
            "treeguard_invalid_inputs_total",
            "Refused inputs by reason.",
            ["model", "reason"],
            registry=r,
        )
        self.nonfinite_outputs = Counter(
            "treeguard_nonfinite_outputs_total",
            "Responses whose outputs held NaN or Inf, by who is to blame (version or input).",
            ["model", "version", "blame"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "treeguard_queue_depth", "Requests waiting for a batch.", ["model"], registry=r
        )
        self.swaps = Counter(
            "treeguard_swaps_total", "Hot swaps by result.", ["model", "result"], registry=r
        )
        self.rollbacks = Counter(
            "treeguard_rollbacks_total", "Rollbacks by trigger.", ["model", "trigger"], registry=r
        )
        self.model_info = Gauge(
            "treeguard_model_info",
            "1 for the version being served.",
            ["model", "version"],
            registry=r,
        )
        for reason in INVALID_REASONS:
            self.invalid_inputs.labels(model=model, reason=reason)
        self.dropped = Counter(
            "treeguard_dropped_requests_total",
            "Connections or requests dropped before the engine saw them, by reason.",
            ["model", "reason"],
            registry=r,
        )
        for reason in DROP_REASONS:
            self.dropped.labels(model=model, reason=reason)
        for phase in ("warmup", "serving", "swap", "shadow"):
            self.compiles.labels(model=model, phase=phase)
        self._served: str | None = None
        # children bound once: the hot path pays no label lookup
        self._request_duration = self.request_duration.labels(model=model)
        self._queue_duration = self.queue_duration.labels(model=model)
        self._batch_size = self.batch_size.labels(model=model)
        self._padding_ratio = self.padding_ratio.labels(model=model)
        self._queue_depth = self.queue_depth.labels(model=model)
        self._by_status: dict[int, Any] = {}
        self._by_bucket: dict[int, Any] = {}

    def request(self, status: int, seconds: float) -> None:
        """Counts one answered request."""
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self.requests.labels(
                model=self.model, status=str(status)
            )
        child.inc()
        self._request_duration.observe(seconds)

    def batch(self, rows: int, bucket: int, seconds: float) -> None:
        """Records one batch: its real rows, its bucket and its device time."""
        child = self._by_bucket.get(bucket)
        if child is None:
            child = self._by_bucket[bucket] = self.compute_duration.labels(
                model=self.model, bucket=str(bucket)
            )
        child.observe(seconds)
        self._batch_size.observe(rows)
        self._padding_ratio.observe((bucket - rows) / bucket)

    def queued(self, seconds: float) -> None:
        """Records how long one request waited for its batch."""
        self._queue_duration.observe(seconds)

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
