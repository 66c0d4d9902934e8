"""The exported-artifact server against the Python-model server, side by side in one run.

One store holds one version of a bundled model (default the flax.nnx CNN),
exported (``treeguard export``'s API), verified with the model's release
checks and promoted. Then:

1. Latency: both servers built in this process (``Server`` of the model,
   and ``Server`` of ``served_from_store``'s artifact model), each app driven
   through ``httpx.ASGITransport`` with sequential one-row JSON requests, in
   rounds that alternate between the two after one warm-up round (which one
   goes first alternates too); each
   figure is the median over the rounds of a round's p50 (and p99). Goal:
   the exported server's p50 at most 1.0x the Python-model server's.
2. Start: ``treeguard serve MODULE:ATTR --store S`` and ``treeguard serve
   --store S`` each started as a fresh process, timed from the start to the
   first ``/v2/health/ready`` answering 200 (imports, store gates, load,
   warm-up of every bucket), rounds interleaved after one warm-up round (which
   fills the persistent compilation cache both then share), median of the
   rounds. Goal: the exported server's start at most 0.5x. The children
   cache their bytecode (filled by the warm-up round) as a deployed host
   does, whatever ``PYTHONDONTWRITEBYTECODE`` says here; a third row, the
   floor, is a process that imports jax (with its CPU client), numpy and
   uvicorn and exits: the part of any start that no server can skip. Needs
   sockets on 127.0.0.1 (the lent TPU machine has none: section 2 is left
   out there). The CPU time each server had used by its first ready
   answer (from /proc, every thread) is printed too: on a shared machine it
   moves less than the wall time.

    python benchmarks/export_serving.py [--model treeguard.examples.cnn:model]
        [--requests 300] [--rounds 5] [--start-rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
from _machine import inet_sockets

import treeguard
from treeguard.export import export_version, served_from_store

# The release checks a swap runs, on purpose: the Python-model server's baseline runs them too.
from treeguard.serving import Server, ServingSpec, verify_version

ROOT = Path(__file__).resolve().parents[1]
_TYPES = {"float32": "FP32", "int32": "INT32", "float16": "FP16", "bfloat16": "BF16"}
SERVER = (
    "import sys\nfrom treeguard._cli.serve import serve\n"
    "sys.argv = ['treeguard', *sys.argv[1:]]\nserve()\n"
)


def _store(target: str, root: Path) -> tuple[Any, treeguard.ArtifactStore]:
    module, attr = target.split(":")
    model = getattr(importlib.import_module(module), attr)
    store = treeguard.ArtifactStore(root)
    v = store.put(model.init(model.key()))
    export_version(model, store, v)
    info = verify_version(store, v, model)
    assert info.status == "verified", info.reason
    store.promote(v)
    return model, store


def _body(spec: ServingSpec, rng: np.random.Generator) -> dict[str, Any]:
    inputs = []
    for path, leaf in zip(spec.input_paths, spec.inputs.leaves):
        shape = [1, *(int(d) for d in leaf.shape[1:])]
        x = rng.uniform(-1, 1, shape).astype(leaf.dtype)
        name = path.strip("[]'\"").replace("']['", ".")
        dtype = _TYPES[np.dtype(leaf.dtype).name]
        inputs.append({"name": name, "shape": shape, "datatype": dtype, "data": x.ravel().tolist()})
    return {"inputs": inputs}


async def _round(app: Any, name: str, bodies: list[dict[str, Any]]) -> list[float]:
    times = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=60) as c:
            for b in bodies:
                start = time.perf_counter()
                r = await c.post(f"/v2/models/{name}/infer", json=b)
                times.append(time.perf_counter() - start)
                assert r.status_code == 200, r.text
    return times


def latency(model: Any, store: treeguard.ArtifactStore, requests: int, rounds: int) -> None:
    served = served_from_store(store)
    python = Server(model, store, spec=served.spec)
    exported = Server(served.model, store, spec=served.spec, version_check=served.check)
    for s in (python, exported):
        s.start()
    rng = np.random.default_rng(0)
    bodies = [_body(served.spec, rng) for _ in range(requests)]
    apps = {"python": python.app(), "exported": exported.app()}
    p50: dict[str, list[float]] = {k: [] for k in apps}
    p99: dict[str, list[float]] = {k: [] for k in apps}
    order = list(apps.items())
    for r in range(rounds + 1):  # round 0 warms up; the order alternates round by round
        for kind, app in order if r % 2 else order[::-1]:
            times = asyncio.run(_round(app, served.spec.name, bodies))
            if r:
                p50[kind].append(float(np.percentile(times, 50)))
                p99[kind].append(float(np.percentile(times, 99)))
    med = {k: statistics.median(v) for k, v in p50.items()}
    print(f"latency, {requests} sequential one-row requests x {rounds} rounds (median of rounds):")
    for kind in apps:
        print(
            f"  {kind:9s} p50 {med[kind] * 1e3:7.3f} ms  p99 "
            f"{statistics.median(p99[kind]) * 1e3:7.3f} ms"
        )
    print(f"  exported / python p50: {med['exported'] / med['python']:.2f}x (goal <= 1.0x)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(pycache: str) -> dict[str, str]:
    """The children's environment: bytecode cached (in ``pycache``, filled by
    the warm-up round) as on a deployed host, whatever this shell says."""
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def _floor(env: dict[str, str], cwd: str) -> float:
    """A process that imports what every server needs (jax with its CPU
    client, numpy, uvicorn) and exits: the part of a start no server skips."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import jax, numpy, uvicorn; jax.devices()"],
        cwd=cwd,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _cpu_s(pid: int) -> float:
    """The CPU time (user and system, every thread) process ``pid`` has used
    so far, from /proc (Linux); NaN where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(args: list[str], cache: str, cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """A fresh server's wall time from its start to its first ready answer,
    and the CPU time it had used by then (less disturbed by the other
    processes of a shared machine)."""
    port = _port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, *args, "--port", str(port), "--cache-dir", cache],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        end = start + 300
        while time.perf_counter() < end and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5):
                    return time.perf_counter() - start, _cpu_s(proc.pid)
            except OSError:
                time.sleep(0.02)
        raise SystemExit(f"the server {args[:1]} never became ready")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def start_time(target: str, store: treeguard.ArtifactStore, rounds: int) -> None:
    if not inet_sockets():
        print("start: left out (this machine opens no socket on 127.0.0.1)")
        return
    kinds = {
        "python": [target, "--store", str(store.root)],
        "exported": ["--store", str(store.root)],
    }
    times: dict[str, list[float]] = {k: [] for k in (*kinds, "floor")}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    with (
        tempfile.TemporaryDirectory() as cache,
        tempfile.TemporaryDirectory() as cwd,
        tempfile.TemporaryDirectory() as pycache,
    ):
        env = _env(pycache)
        for r in range(rounds + 1):  # round 0 fills the compilation and bytecode caches
            for kind, args in list(kinds.items())[:: 1 if r % 2 else -1]:
                t, c = _start(args, cache, cwd, env)
                if r:
                    times[kind].append(t)
                    cpu[kind].append(c)
            t = _floor(env, cwd)
            if r:
                times["floor"].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"start to ready, fresh processes x {rounds} rounds (median):")
    for kind in kinds:
        print(f"  {kind:9s} {med[kind]:6.2f} s")
    print(f"  floor     {med['floor']:6.2f} s (import jax, numpy and uvicorn, then exit)")
    print(f"  exported / python start: {med['exported'] / med['python']:.2f}x (goal <= 0.5x)")
    print(
        f"  above the floor: exported {med['exported'] - med['floor']:.2f} s, "
        f"python {med['python'] - med['floor']:.2f} s"
    )
    spent = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"  CPU time to ready: exported {spent['exported']:.2f} s, python "
        f"{spent['python']:.2f} s: {spent['exported'] / spent['python']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="treeguard.examples.cnn:model")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--start-rounds", type=int, default=5)
    a = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()}; model {a.model}")
    with tempfile.TemporaryDirectory() as d:
        model, store = _store(a.model, Path(d) / "store")
        latency(model, store, a.requests, a.rounds)
        if a.start_rounds:
            start_time(a.model, store, a.start_rounds)


if __name__ == "__main__":
    main()
