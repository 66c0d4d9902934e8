"""Runs ``treeguard serve --ray --ray-ingress haproxy`` and one request to
it, inside the network namespace of its caller (HAProxy binds every
interface, so the test runs this under ``unshare --net``). Prints one JSON
line: the server's first line, the response, its exit code, and whether
its HAProxy folder is gone. Usage: ``python isolated_cli.py STORE PORT``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import httpx

store, port = sys.argv[1], sys.argv[2]
before = set(glob.glob("/tmp/tghap-*"))
proc = subprocess.Popen(
    [sys.executable, "-m", "treeguard", "serve", "treeguard.examples.mlp:model", "--store", store,
     "--input", "['x']", "--ray", "--replicas", "2", "--ray-ingress", "haproxy", "--port", port],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
)  # fmt: skip
out: dict[str, object] = {}
try:
    assert proc.stdout is not None
    out["first"] = proc.stdout.readline().decode()
    folders = set(glob.glob("/tmp/tghap-*")) - before
    out["config"] = any(glob.glob(f"{f}/*/haproxy.cfg") for f in folders)
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.1]}]}
    r = httpx.post(f"http://127.0.0.1:{port}/v2/models/mlp/infer", json=body, timeout=60)
    out["status"], out["response"] = r.status_code, r.json()
finally:
    os.kill(proc.pid, signal.SIGTERM)
    out["exit"] = proc.wait(timeout=120)
    stop = time.monotonic() + 30  # a safety stop: Ray's processes end after the CLI
    while time.monotonic() < stop and set(glob.glob("/tmp/tghap-*")) - before:
        time.sleep(0.5)
    out["left"] = sorted(set(glob.glob("/tmp/tghap-*")) - before)
print(json.dumps(out), flush=True)
