"""``treeguard.serving.ray``: many replicas of the engine with Ray Serve.

``app`` builds a Ray Serve application whose replicas each run the serving
engine (buckets, the padding batcher, the compile guard, limits, the
watchdog, private metrics) behind Ray's HTTP proxy, which speaks the same
Open Inference Protocol as ``treeguard serve``. ``swap`` moves every
replica to a verified version only when each has checked it. ``replicas``
and ``metrics_targets`` list the running replicas and where each serves its
Prometheus metrics; ``forget`` ends an application's swap coordinator once
the application is deleted. ``haproxy_environment`` is what makes a cluster
serve through HAProxy instead of Ray's proxy (set before the cluster starts).

Ray Serve (the ``ray`` extra: ``pip install 'treeguard[ray]'``) is imported
only when an application is built or swapped.
"""

from .._src.serving.ray.api import (
    app,
    forget,
    haproxy_environment,
    metrics_targets,
    replicas,
    swap,
)

__all__ = ["app", "forget", "haproxy_environment", "metrics_targets", "replicas", "swap"]
