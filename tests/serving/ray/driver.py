"""A Ray cluster on 127.0.0.1 run in a child process of the tests, driven by
JSON lines on stdin; each answer is one line on stdout starting with ``@@ ``.

Ray takes over its driver's SIGTERM and starts many processes, so the test
process never imports ray: it starts this script, sends it commands, and
reaps it by pid. Usage: ``python driver.py TEMP_DIR HTTP_PORT [INGRESS]``
(``proxy``, Ray's, the default; or ``haproxy``, whose port is also served on
the Unix socket ``TEMP_DIR/ingress.sock`` for a test process outside this
one's network namespace).

Commands (``op``): ``deploy`` (``target`` MODULE:ATTR, ``store``, ``name``,
``replicas``, ``inputs``, ``buckets``, ``allow_unchecked``), ``swap`` (``version``,
``name``), ``replicas``, ``metrics``, ``wait_replicas`` (``n``, ``not_pids``:
until ``n`` replicas run, none of these pids), ``address`` (the cluster's),
``clear`` (delete every application), ``delete``, ``fetch`` (``url``: the body
of a GET from here), ``importable`` (``module``: whether a worker finds it),
``health`` (``old``, ``gone``, ``n``: Ray Serve's status of the application
until ``gone`` of the replicas ``old`` are replaced and ``n`` run, healthy),
``check_health`` (``times``: the replicas' own health check, called as a
method through the application's handle), ``stop``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

import httpx
from bridge import forward, tcp_connector, unix_listener

from treeguard.serving import ServingError, ServingSpec
from treeguard.serving import ray as tg_ray

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep Ray on 127.0.0.1, before `import ray`
# Serve restarts a proxy that is not ready within 5 s (Ray's default), and gives
# up after three; on a loaded 2-core machine a proxy (and HAProxy's manager
# with its fallback proxy) can take longer than that to start.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
INGRESS = sys.argv[3] if len(sys.argv) > 3 else "proxy"
if INGRESS == "haproxy":  # Ray reads these as its processes start
    for key, value in tg_ray.haproxy_environment(os.path.join(sys.argv[1], "hap")).items():
        os.environ.setdefault(key, value)

#: This folder; the replicas import the models here and in the server tests' above it.
HERE = os.path.dirname(os.path.abspath(__file__))

import ray  # noqa: E402 - after the environment above
from ray import serve  # noqa: E402


@ray.remote(num_cpus=0)
def _importable(module: str) -> bool:
    """Whether a worker of the cluster (where replicas run) finds ``module``."""
    return importlib.util.find_spec(module) is not None


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def handle(cmd: dict[str, Any]) -> Any:
    op = cmd["op"]
    name = cmd.get("name", "default")
    if op == "deploy":
        model = _load(cmd["target"])
        spec = ServingSpec.from_model(
            model, inputs=cmd.get("inputs"), buckets=tuple(cmd.get("buckets", (1, 4, 8)))
        )
        for other in list(serve.status().applications):
            serve.delete(other)
            tg_ray.forget(other)
        application = tg_ray.app(
            model,
            cmd["store"],
            spec,
            num_replicas=cmd.get("replicas", 2),
            allow_unchecked=cmd.get("allow_unchecked", False),
            health_check_period_s=1.0,
        )
        serve.run(application, name=name, route_prefix="/")
        return tg_ray.replicas(name)
    if op == "swap":
        try:
            return tg_ray.swap(cmd["version"], name=name, timeout_s=cmd.get("timeout_s", 300.0))
        except ServingError as e:
            return {"error": str(e), "status": e.status}
    if op == "replicas":
        return tg_ray.replicas(name)
    if op == "metrics":
        return tg_ray.metrics_targets(name)
    if op == "wait_replicas":
        stop = time.monotonic() + cmd.get("deadline_s", 240.0)  # a safety stop, not a verdict
        bad = set(cmd.get("not_pids", []))
        while time.monotonic() < stop:
            live = tg_ray.replicas(name)
            if len(live) == cmd["n"] and not bad & set(live.values()):
                return live
            time.sleep(0.5)
        return {"error": f"replicas never settled: {tg_ray.replicas(name)}"}
    if op == "health":
        return _health(name, set(cmd["old"]), cmd["gone"], cmd["n"])
    if op == "check_health":
        handle = serve.get_app_handle(name)
        return [_outcome(handle.check_health.remote()) for _ in range(cmd["times"])]
    if op == "address":
        return ray.get_runtime_context().gcs_address
    if op == "clear":
        for other in list(serve.status().applications):
            serve.delete(other)
            tg_ray.forget(other)
        return True
    if op == "delete":
        serve.delete(name)
        return True
    if op == "fetch":
        return httpx.get(cmd["url"], timeout=30).text
    if op == "importable":
        return ray.get(_importable.remote(cmd["module"]))
    raise ValueError(f"unknown op {op!r}")


def _health(name: str, old: set[str], gone: int, n: int) -> dict[str, Any]:
    """Every status (and its trigger) Ray Serve gave the application's
    deployment until ``gone`` of ``old`` are replaced and ``n`` replicas run,
    healthy; then the replicas."""
    seen: list[list[str]] = []
    stop = time.monotonic() + 240.0  # a safety stop, not a verdict
    while time.monotonic() < stop:
        (deployment,) = serve.status().applications[name].deployments.values()
        state = [str(deployment.status.value), str(deployment.status_trigger.value)]
        if state not in seen:
            seen.append(state)
        live = tg_ray.replicas(name)
        if len(old - set(live)) >= gone and len(live) == n and state[0] == "HEALTHY":
            return {"seen": seen, "replicas": live}
        time.sleep(0.1)
    return {"error": f"never settled: {tg_ray.replicas(name)}", "seen": seen}


def _outcome(response: Any) -> str:
    """``"ok"``, or the last line of the error a handle's call raised (the replica's own)."""
    try:
        response.result(timeout_s=60)
    except Exception as e:  # the replica's own error, as text for the test
        return str(e).strip().splitlines()[-1]
    return "ok"


def _keep_haproxy_log(path: str) -> None:
    """HAProxy's access log (syslog over UDP to 127.0.0.1:514, in this
    namespace of its own), appended line by line to ``path``: a request it
    failed names there why (its termination state), for the test's message."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 514))

    def drain() -> None:
        with open(path, "ab", buffering=0) as out:
            while True:
                out.write(sink.recv(65536).rstrip(b"\n") + b"\n")

    threading.Thread(target=drain, daemon=True).start()


def main() -> None:
    temp_dir, port = sys.argv[1], int(sys.argv[2])
    if INGRESS == "haproxy":
        _keep_haproxy_log(os.path.join(temp_dir, "haproxy-access.log"))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp_dir,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, os.path.dirname(HERE)])}},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    if INGRESS == "haproxy":
        forward(unix_listener(os.path.join(temp_dir, "ingress.sock")), tcp_connector(port))
    print("@@ " + json.dumps({"ok": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "stop":
            break
        try:
            out = {"ok": True, "result": handle(cmd)}
        except Exception as e:  # every failure goes back to the test as text
            out = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(),
            }
        print("@@ " + json.dumps(out), flush=True)
    serve.shutdown()
    ray.shutdown()
    print("@@ " + json.dumps({"ok": True, "stopped": True}), flush=True)


if __name__ == "__main__":
    main()
