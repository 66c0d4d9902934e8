"""What Ray Serve's ingress costs: the bundled model served by replicas of
the engine behind HAProxy (``--ray-ingress haproxy``) and behind Ray's HTTP
proxy, against the single-process ``treeguard serve`` in this same run.

One local cluster in Ray Serve's HAProxy mode serves both ingresses: HAProxy
on its HTTP port, forwarding to each replica's own HTTP port, and Ray's
Python proxy, which that mode keeps on the head node as HAProxy's fallback
and which reaches the replicas through Ray's RPC as in Ray's default mode.

1. Latency: sequential one-row requests over one keep-alive connection,
   p50 and p99, the three servers interleaved round by round (median of the
   rounds' p50s; p99 over every request). Goal: the ingress's p50 at most
   1.5x the single process's.
2. Throughput: one-row requests from concurrent clients, with 1 and then
   2 replicas behind each ingress, and the single process.

HAProxy binds its stats page and Prometheus exporter on every interface, so
the benchmark re-runs itself in a network namespace of its own (``unshare
--net``, as root), where nothing but loopback exists; everything else binds
127.0.0.1. The cluster is local, started and stopped here, and the
single-process server is a child process stopped by pid.

    python benchmarks/serving_ray.py [--requests 200] [--rounds 5] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import jax
import numpy as np
from _machine import need_inet_sockets

import treeguard
from treeguard.bench import conditions
from treeguard.examples import mlp
from treeguard.serving import ServingSpec

URL = "http://127.0.0.1:{port}/v2/models/mlp/infer"
BODY = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.5, -0.25]}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, deadline_s: float = 180.0) -> None:
    stop = time.monotonic() + deadline_s  # a safety stop
    while time.monotonic() < stop:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server on port {port} never became ready")


def sequential(port: int, n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(URL.format(port=port), json=BODY)
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return out


def throughput(port: int, clients: int, each: int) -> float:
    def run() -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(each):
                assert c.post(URL.format(port=port), json=BODY).status_code == 200

    sequential(port, 10)  # warm connections and replicas
    threads = [threading.Thread(target=run) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return clients * each / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


ISOLATED = "TREEGUARD_BENCH_ISOLATED"


def isolate() -> None:
    """Runs this script again in a network namespace of its own (see the docstring)."""
    if os.environ.get(ISOLATED) == "1":
        return
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        raise SystemExit(
            "HAProxy binds every interface: this benchmark runs in a network namespace "
            "of its own, which needs root, unshare and ip"
        )
    os.environ[ISOLATED] = "1"
    script = 'ip link set lo up && exec "$@"'
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", script, "-", *argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    need_inet_sockets("benchmarks/serving_ray.py (Ray Serve and its HTTP ingress)")
    isolate()

    c = conditions()
    load = c.get("load") or {}
    mem = c.get("memory") or {}
    print(
        f"{c['cpu_model']}, {c['usable_cores']} usable cores, load "
        f"{load.get('1m')}/{load.get('5m')}/{load.get('15m')}, memory {mem}; "
        f"jax {c['jax']} on {c['backend']}"
    )
    folder = Path(tempfile.mkdtemp(prefix="serving-ray-"))
    store = treeguard.ArtifactStore.init(folder / "store")
    v = store.put(mlp.init(jax.random.key(0)))
    store.verify(v)
    store.promote(v)
    spec = ServingSpec.from_model(mlp.model, inputs=["['x']"], buckets=(1, 4, 8, 16))

    single_port = free_port()
    single = subprocess.Popen(
        [sys.executable, "-m", "treeguard", "serve", "treeguard.examples.mlp:model",
         "--store", str(store.root), "--input", "['x']", "--port", str(single_port),
         "--allow-unchecked", "--cache-dir", str(folder / "cache")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    from treeguard.serving import ray as tg_ray

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # a local node on 127.0.0.1
    hap = tempfile.mkdtemp(prefix="tghap-", dir="/tmp")  # short: HAProxy's sockets go there
    os.environ.update(tg_ray.haproxy_environment(hap))  # before Ray starts
    import ray
    from ray import serve

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(folder / "ray"),
    )
    try:
        hap_port = free_port()
        proxy_port = int(os.environ["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"])
        serve.start(http_options={"host": "127.0.0.1", "port": hap_port})
        serve.run(
            tg_ray.app(mlp.model, store, spec, num_replicas=1), name="bench", route_prefix="/"
        )
        servers = {"single": single_port, "HAProxy": hap_port, "Ray proxy": proxy_port}
        for port in servers.values():
            wait_ready(port)
            sequential(port, 30)  # warm-up
        p50s: dict[str, list[float]] = {name: [] for name in servers}
        every: dict[str, list[float]] = {name: [] for name in servers}
        for _ in range(args.rounds):
            for name, port in servers.items():
                xs = sequential(port, args.requests)
                p50s[name].append(pct(xs, 50))
                every[name] += xs
        base = statistics.median(p50s["single"])
        print(f"latency, one-row requests, {args.rounds} rounds of {args.requests}, 1 replica:")
        for name in servers:
            p50 = statistics.median(p50s[name])
            print(
                f"  {name:15s} p50 {p50:6.2f} ms  p99 {pct(every[name], 99):6.2f} ms  "
                f"{p50 / base:.2f}x" + ("" if name == "single" else " (goal <= 1.5x)")
            )
        each = max(args.requests // 4, 10)
        rates = {"single process": throughput(single_port, args.clients, each)}
        for replicas in (1, 2):
            if replicas == 2:
                serve.run(
                    tg_ray.app(mlp.model, store, spec, num_replicas=2),
                    name="bench",
                    route_prefix="/",
                )
                wait_ready(hap_port)
            for name in ("HAProxy", "Ray proxy"):
                rates[f"{name}, {replicas} replica(s)"] = throughput(
                    servers[name], args.clients, each
                )
        print(f"throughput, {args.clients} clients x {each} one-row requests:")
        for name, rate in rates.items():
            print(f"  {name:22s} {rate:8.0f} req/s  ({rate / rates['single process']:.2f}x)")
    finally:
        serve.shutdown()
        ray.shutdown()
        os.killpg(single.pid, signal.SIGTERM)
        single.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(hap, ignore_errors=True)


if __name__ == "__main__":
    main()
