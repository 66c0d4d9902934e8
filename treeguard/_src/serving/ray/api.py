"""The driver side of the Ray Serve deployment: build the application, swap
every replica to a verified version, list the replicas and their metrics.

Ray is imported inside these functions, never at the top: it is an
optional dependency (the ``ray`` extra), large, and it starts threads and
reads its environment as it is imported, so ``import treeguard.serving.ray``
costs nothing until an application is built or swapped.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any, cast

from ...errors import ConfigError, ServingError
from ...store import ArtifactStore
from ...verify.model import Model
from ..spec import ServingSpec
from ..watchdog import WatchdogPolicy
from .ports import server_ports
from .rollout import Decision, decide, refusal

#: The application's name when none is given.
DEFAULT_NAME = "treeguard"
#: The ingresses a local cluster can put in front of the replicas: Ray's
#: HTTP proxy (Ray's default) or HAProxy (Ray Serve's HAProxy mode).
INGRESSES = ("proxy", "haproxy")


def _ray() -> Any:
    """The ``ray`` module, imported with a local node kept on 127.0.0.1."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # ray is imported only when a cluster is used (see the module docstring)
    import ray

    return ray


def haproxy_environment(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The environment that makes a Ray cluster serve through HAProxy.

    In Ray Serve's HAProxy mode each replica serves HTTP on a port of its
    own and an HAProxy process on every node balances the cluster's HTTP
    port over them, so a request makes one HTTP hop to the replica instead
    of going through Ray's Python proxy and Ray's RPC. These variables must
    be in the environment of the process that starts the cluster (before
    ``ray.init`` or ``ray start``, and before ``import ray``): Ray reads them
    as its processes start. HAProxy's files go under ``folder``. Its stats
    page, its Prometheus exporter and Ray's fallback proxy get ports of
    their own instead of Ray's fixed 8404, 9101 and 8500 (HAProxy binds the
    first two on every interface), each free when picked (a bind succeeds),
    from 20000 up, apart from Ray's own ports, and outside the kernel's
    ephemeral range, so that no outgoing connection takes one before HAProxy
    binds it (inside it, with a ``RuntimeWarning``, where it leaves none;
    see ``ports.py``). A
    request that a replica dropped unanswered (killed, or its connection
    refused) is sent again to another replica
    (``retry-on conn-failure empty-response``); an inference is a pure
    function of its inputs and the version, so sending it twice is safe.
    A replica that stops is drained for 2 s rather than Ray's 30 s: the
    HAProxy in front of it stops routing to it within a second.

    Args:
      folder: where HAProxy's configuration, sockets and state go, at most
        27 characters long: Ray adds its node id (56 characters) and HAProxy
        takes socket paths of at most 97.

    Returns:
      The variables, ``{name: value}``; set the ones not set already.

    Raises:
      ConfigError: when ``folder`` is too long for HAProxy's socket paths,
        fewer than three ports are free, or a Ray port variable holds none.

    Example:
      >>> env = haproxy_environment("/tmp/tg-haproxy")
      >>> env["RAY_SERVE_ENABLE_HA_PROXY"], env["RAY_SERVE_HAPROXY_RETRY_ON"]
      ('1', 'conn-failure empty-response')
    """
    root = os.fspath(folder)
    longest = len(os.path.join(root, "0" * 56, "metrics.sock"))
    if longest > _HAPROXY_MAX_SOCKET_PATH:
        raise ConfigError(
            f"HAProxy's folder {root!r} is {len(root)} characters long: its socket paths "
            f"would be {longest}, and HAProxy takes at most {_HAPROXY_MAX_SOCKET_PATH}",
            hint="pick a shorter folder, such as one made by "
            "tempfile.mkdtemp(prefix='tghap-', dir='/tmp')",
        )
    stats, metrics, fallback = server_ports(3)
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(root, "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(root, "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": root,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(root, "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": os.path.join(root, "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics),
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback),
        "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    }


#: The longest Unix socket path HAProxy 2.8 accepts.
_HAPROXY_MAX_SOCKET_PATH = 97


def _check_haproxy_mode() -> None:
    """Raises unless the installed Ray Serve has its HAProxy mode."""
    # Ray keeps its feature flags in a private module; no public call tells
    from ray.serve._private import constants

    if not hasattr(constants, "RAY_SERVE_ENABLE_HA_PROXY"):
        raise ConfigError(
            "the installed Ray Serve has no HAProxy ingress "
            "(RAY_SERVE_ENABLE_HA_PROXY is not one of its settings)",
            hint="pip install -U 'treeguard[ray]' (a Ray Serve with its HAProxy mode), "
            "or serve through Ray's proxy: --ray-ingress proxy",
        )


def check_ingress(address: str | None, ingress: str) -> None:
    """Raises unless ``ingress`` can front the cluster at ``address``.

    Raises:
      ConfigError: for an unknown ``ingress``, or ``"haproxy"`` with an
        ``address`` (a running cluster's ingress is set when it starts).

    Example:
      >>> check_ingress(None, "haproxy")
      >>> check_ingress("127.0.0.1:6379", "haproxy")
      Traceback (most recent call last):
      ...
      treeguard.ConfigError: --ray-ingress haproxy starts a local cluster; ...
    """
    if ingress not in INGRESSES:
        raise ConfigError(
            f"unknown Ray ingress {ingress!r}: expected one of {', '.join(INGRESSES)}",
            hint="--ray-ingress proxy (Ray's HTTP proxy) or --ray-ingress haproxy",
        )
    if ingress == "haproxy" and address is not None:
        raise ConfigError(
            f"--ray-ingress haproxy starts a local cluster; the cluster at {address} "
            "keeps the ingress it was started with",
            hint="start that cluster with RAY_SERVE_ENABLE_HA_PROXY=1 in the environment of "
            "`ray start` (see the Ray guide), or drop --ray-address",
        )


def connect(address: str | None, *, ingress: str = "proxy") -> Any:
    """Connects this process to the Ray cluster at ``address``, or starts a
    local one on 127.0.0.1 (``None``) with ``ingress`` in front of its
    replicas (``"proxy"``: Ray's HTTP proxy; ``"haproxy"``: Ray Serve's
    HAProxy mode, with ``haproxy_environment`` in a temporary folder that
    ``disconnect`` removes); returns the ``ray`` module.

    Ray replaces a local node's loopback address with the machine's outside
    one unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before it is
    imported, so it is set here first.

    Raises:
      ConfigError: see ``check_ingress``; when the installed Ray Serve
        has no HAProxy mode; or when the cluster at ``address`` cannot be
        joined (none there, no token or a wrong one): naming where Ray
        looks for the token, never the token.
    """
    check_ingress(address, ingress)
    ray = _ray()
    if ingress == "haproxy":
        _check_haproxy_mode()
    if ingress == "haproxy" and "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC" not in os.environ:
        # the cluster's processes read these as they start, after ray.init below;
        # a short path: Unix sockets go under it (see haproxy_environment)
        folder = tempfile.mkdtemp(prefix="tghap-", dir="/tmp")
        for key, value in haproxy_environment(folder).items():
            os.environ.setdefault(key, value)
        _owned_folders.append(folder)
    if not ray.is_initialized():
        if address is None:
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")
            return ray
        try:
            ray.init(address=address)
        except _refusals(ray) as e:
            reason = str(e.args[0]).splitlines()[0] if e.args else type(e).__name__
            raise ConfigError(
                f"cannot connect to the Ray cluster at {address}: {reason}",
                hint="is a cluster running there? One with token authentication (Ray's "
                "default) needs RAY_AUTH_MODE=token here and the cluster's token: in "
                "$RAY_AUTH_TOKEN, in the file $RAY_AUTH_TOKEN_PATH names, or in "
                "~/.ray/auth_token (copy it from a node of the cluster)",
            ) from e
    return ray


def _refusals(ray: Any) -> tuple[type[Exception], ...]:
    """What ``ray.init(address=...)`` raises when it cannot join: a
    ``ConnectionError`` (no cluster, or a wrong token: Ray retries, then gives
    up) or Ray's ``AuthenticationError``, where it has one (no token to send)."""
    refused = getattr(ray.exceptions, "AuthenticationError", None)
    return (ConnectionError,) if refused is None else (ConnectionError, refused)


#: Ray's settings of token authentication that a process connecting to a
#: cluster by its address must have as the cluster's own processes do.
AUTH_SETTINGS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def swap_command(address: str, *, name: str = DEFAULT_NAME, version: str = "VERSION") -> str:
    """The shell command that swaps every replica of application ``name`` on
    the cluster at ``address``, as it is pasted in another shell: with this
    process's settings of Ray's token authentication in front. Ray turns
    token authentication on by default for a cluster it starts, but a
    process that connects by an explicit address takes it only from
    ``RAY_AUTH_MODE``; the token itself is read from the same file as here
    (``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN_PATH``), never printed.

    Args:
      address: the cluster's address (its GCS, ``host:port``).
      name: the Ray Serve application's name.
      version: the version to swap to, or a placeholder.

    Returns:
      The command, each word quoted for a POSIX shell.

    Example:
      >>> os.environ["RAY_AUTH_MODE"] = "token"
      >>> print(swap_command("h:6379", name="my app"))
      RAY_AUTH_MODE=token treeguard serve swap --ray VERSION --ray-address h:6379 --ray-app 'my app'
      >>> del os.environ["RAY_AUTH_MODE"]
      >>> swap_command("127.0.0.1:6379")
      'treeguard serve swap --ray VERSION --ray-address 127.0.0.1:6379'
    """
    settings = [
        f"{key}={shlex.quote(os.environ[key])}" for key in AUTH_SETTINGS if os.environ.get(key)
    ]
    words = ["treeguard", "serve", "swap", "--ray", version, "--ray-address", address]
    if name != DEFAULT_NAME:
        words += ["--ray-app", name]
    return " ".join([*settings, *(shlex.quote(w) for w in words)])


#: The HAProxy folders ``connect`` made, for ``disconnect`` to remove.
_owned_folders: list[str] = []


def disconnect() -> None:
    """Ends this process's connection to Ray (stopping a local cluster it
    started) and removes the HAProxy folders ``connect`` made."""
    _ray().shutdown()
    while _owned_folders:
        shutil.rmtree(_owned_folders.pop(), ignore_errors=True)


def run_application(
    application: Any,
    *,
    name: str = DEFAULT_NAME,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    ingress: str = "proxy",
    on_ready: Callable[[dict[str, int | None], str, str], None] | None = None,
) -> None:
    """Runs ``application`` (from ``app``) on the cluster at ``address`` (a
    local one on 127.0.0.1 when None) behind its ingress on ``host:port``
    (a local cluster's is ``ingress``: see ``connect``), until interrupted
    (Ctrl-C or SIGTERM); then deletes it, and stops the local cluster it
    started. ``on_ready`` is called with the running
    replicas (``replicas(name)``), the cluster's address and the proxy's URL
    once every one is warm (on a cluster whose Serve already runs, the
    proxy keeps its own host and port).

    Raises:
      ServingError: 503 when the replicas cannot start (Ray's reason).
      ConfigError: see ``connect``.
    """
    import signal

    ray = connect(address, ingress=ingress)
    from ray import serve  # see the module docstring

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(application, name=name, route_prefix="/")
        except RuntimeError as e:  # Serve's "deploying ... failed" with the replicas' reason
            raise ServingError(
                f"the Ray Serve application {name!r} did not start: {str(e).splitlines()[0]}",
                hint="the replicas' logs under Ray's session folder say why",
                status=503,
            ) from e
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if on_ready is not None:
            from ray.serve.context import _get_global_client  # the proxy's address

            client = _get_global_client()
            http = client.http_config if client is not None else None
            proxy = f"http://{http.host}:{http.port}" if http else f"http://{host}:{port}"
            on_ready(replicas(name), ray.get_runtime_context().gcs_address, proxy)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(Exception):  # best effort: the cluster may be gone
            if address is None:
                serve.shutdown()  # type: ignore[no-untyped-call]
            else:
                serve.delete(name)
                forget(name)
        if address is None:
            disconnect()


def app(
    model: Model | None,
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
    max_ongoing_requests: int = 64,
    access_log: bool = False,
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
        pickle: a module-level model such as ``treeguard.examples.mlp.model``);
        None serves the exported artifact (``treeguard export``) instead:
        each replica reads it from the store through the same gates as
        ``treeguard serve --store`` (verdict, digests, jax window,
        platform), imports no model code, and checks every version it
        loads or is asked to swap to in the same way.
      store: the ``ArtifactStore`` (or its root or bucket URL) every replica
        opens; a signed store's key comes from ``$TREEGUARD_STORE_KEY_FILE``.
      spec: the ``ServingSpec``; default every batch input of the model
        (with no model, the artifact's own spec).
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
      max_ongoing_requests: how many requests Ray lets one replica hold at
        once (Ray's default of 5 would starve the batcher of rows to batch).
      access_log: whether each replica logs every request (Ray's default;
        off here, as it costs a write per request).

    Returns:
      The bound application, for ``serve.run(app, name=...)``.

    Raises:
      ImportError: when Ray Serve is not installed (``pip install 'treeguard[ray]'``).

    Example:
      On a running cluster (the Ray tests run this):

      >>> from ray import serve  # doctest: +SKIP
      >>> from treeguard.examples import mlp  # doctest: +SKIP
      >>> serve.run(app(mlp.model, "store"), name="mlp")  # doctest: +SKIP
    """
    _ray()
    from .replica import Replica  # imports ray (see the module docstring)

    root = store_location(store)
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
        max_ongoing_requests=max_ongoing_requests,
        logging_config={"enable_access_log": access_log},
    )
    if spec is None and model is not None:
        spec = ServingSpec.from_model(model)
    return deployment.bind(model, root, spec, options)


def store_location(store: Any) -> str:
    """Where every replica opens ``store``: a bucket URL, or an absolute path
    (a replica's working directory is not the driver's).

    Example:
      >>> import os
      >>> store_location("s3://models/mlp"), store_location("store") == os.path.abspath("store")
      ('s3://models/mlp', True)
    """
    if isinstance(store, (str, os.PathLike)):
        where = os.fspath(store)
        return where if "://" in where else os.path.abspath(where)
    return store_location(store.root)


def forget(name: str = DEFAULT_NAME) -> None:
    """Ends the swap coordinator of application ``name`` (a detached actor
    that outlives the application) once the application is deleted.

    Args:
      name: the Ray Serve application's name.

    Example:
      >>> serve.delete("mlp"); forget("mlp")  # doctest: +SKIP
    """
    ray = _ray()
    from .replica import NAMESPACE, coordinator_name

    with contextlib.suppress(ValueError):  # there is none
        ray.kill(ray.get_actor(coordinator_name(name), namespace=NAMESPACE))


def replicas(name: str = DEFAULT_NAME) -> dict[str, int | None]:
    """The running replicas of application ``name``: ``{replica id: pid}``.

    Args:
      name: the Ray Serve application's name.

    Returns:
      The id and process id of each replica Ray reports running.

    Raises:
      ServingError: 404 when no such application runs on the connected cluster.

    Example:
      >>> replicas("mlp")  # doctest: +SKIP
      {'2jngy7ph': 30756, 'gg18dioi': 30757}
    """
    _ray()
    # Serve's client, for the replicas' ids and pids (no public call gives them)
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


def metrics_targets(name: str = DEFAULT_NAME) -> dict[str, str]:
    """Where each running replica of ``name`` serves its Prometheus metrics.

    Args:
      name: the Ray Serve application's name.

    Returns:
      ``{replica id: URL}``, for a Prometheus ``file_sd`` or ``static_configs``.

    Raises:
      ServingError: 404 when no such application runs on the connected cluster.

    Example:
      >>> metrics_targets("mlp")  # doctest: +SKIP
      {'2jngy7ph': 'http://127.0.0.1:41877/metrics', 'gg18dioi': 'http://127.0.0.1:40211/metrics'}
    """
    ray = _ray()
    from .replica import NAMESPACE, coordinator_name

    live = replicas(name)
    coord = ray.get_actor(coordinator_name(name), namespace=NAMESPACE)
    urls = cast(dict[str, str], ray.get(coord.metrics.remote()))
    return {rid: url for rid, url in urls.items() if rid in live}


def swap(version: str, *, name: str = DEFAULT_NAME, timeout_s: float = 600.0) -> dict[str, Any]:
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
        time; 503 when no replica runs; 404 for an unknown application.

    Example:
      >>> swap("v000002", name="mlp")  # doctest: +SKIP
      {'version': 'v000002', 'replicas': ['2jngy7ph', 'gg18dioi']}
    """
    ray = _ray()
    from .replica import NAMESPACE, coordinator_name

    if not replicas(name):
        raise ServingError(
            f"no replica of {name!r} is running to check {version}",
            hint="wait until Ray has started them (serve.status()), then swap",
            status=503,
        )
    coord = ray.get_actor(coordinator_name(name), namespace=NAMESPACE)
    deadline = time.monotonic() + timeout_s
    seq = cast(int, ray.get(coord.publish.remote("prepare", version)))
    prepared = _round(coord, seq, name, deadline, version=version, what="check")
    if not prepared.passed:
        seq = ray.get(coord.publish.remote("abort", version))
        _round(coord, seq, name, deadline, version=version, what="abort")
        raise ServingError(
            refusal(version, prepared.failed, prepared.serving),
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
    ray.get(coord.settle.remote(version))
    live = replicas(name)
    return {"version": version, "replicas": sorted(live)}


def _round(
    coord: Any, seq: int, name: str, deadline: float, *, version: str, what: str
) -> Decision:
    """Waits until every live replica answered round ``seq`` (re-reading
    which are alive, so a dead one is not waited for)."""
    ray = _ray()
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
