"""A real ``treeguard serve`` on 127.0.0.1 driven by clients nobody here
wrote: curl with a binary-tensor request, and the load generators ``wrk``
(JSON tensors) and ``hey`` (binary tensors) from Debian, each bounded in
requests and time. Every response must be a 200, and the server must still
answer its health routes afterwards."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest
from click.testing import CliRunner
from live import Live, live_server
from serving_support import mlp_reference, mlp_spec

import treeguard
from treeguard._cli.main import main

URL = "/v2/models/mlp/infer"
ROWS = 4


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Live, Any, Path]]:
    """The bundled MLP served by ``treeguard serve`` (its release checks run)."""
    from treeguard.examples import mlp

    root = tmp_path_factory.mktemp("loadgen")
    store = treeguard.ArtifactStore(root / "store")
    v = store.put(mlp.init(jax.random.key(0)))
    verify = ["store", "verify", str(store.root), v, "--model", "treeguard.examples.mlp:model"]
    result = CliRunner().invoke(main, verify)
    assert result.exit_code == 0, result.output
    store.promote(v)
    mlp_spec(buckets=(1, 4, 16)).save(root / "spec.json")
    args = ["treeguard.examples.mlp:model", "--store", str(store.root)]
    with live_server(*args, "--spec", str(root / "spec.json")) as live:
        yield live, store.load_version(v), root
    assert "Traceback" not in live.log, live.log[-3000:]


def _rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(7).uniform(-1, 1, (ROWS, 2)).astype(np.float32)


def binary_request(x: np.ndarray[Any, Any]) -> tuple[bytes, int]:
    """A request with ``x`` as binary tensor data and its output asked as binary:
    the body and the length of its JSON header."""
    header = json.dumps(
        {
            "id": "bin",
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + x.astype("<f4").tobytes(), len(header)


def _still_healthy(live: Live) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        x = _rows()
        body = {"inputs": [{"name": "x", "shape": [ROWS, 2], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        assert c.post(URL, json=body).status_code == 200


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian: apt-get install {tool})")
    return path


@pytest.mark.slow
def test_curl_sends_and_reads_binary_tensors(served, tmp_path):
    live, params, _ = served
    curl = _need("curl")
    x = _rows()
    body, n = binary_request(x)
    (tmp_path / "body.bin").write_bytes(body)
    out = subprocess.run(
        [
            curl, "-s", "-m", "30", "-o", str(tmp_path / "out.bin"), "-D", str(tmp_path / "h.txt"),
            "-w", "%{http_code}", "-H", "Content-Type: application/octet-stream",
            "-H", f"Inference-Header-Content-Length: {n}",
            "--data-binary", f"@{tmp_path / 'body.bin'}", live.url + URL,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.stdout == "200", out.stdout + out.stderr
    headers = (tmp_path / "h.txt").read_text().lower()
    found = re.search(r"^inference-header-content-length: *(\d+)", headers, re.M)
    assert found, headers
    reply = (tmp_path / "out.bin").read_bytes()
    size = int(found.group(1))
    doc = json.loads(reply[:size])
    assert doc["id"] == "bin" and doc["model_name"] == "mlp"
    (output,) = doc["outputs"]
    assert output["name"] == "output" and output["shape"] == [ROWS, 1]
    assert output["parameters"]["binary_data_size"] == len(reply) - size == ROWS * 4
    got = np.frombuffer(reply[size:], "<f4").reshape(ROWS, 1)
    np.testing.assert_allclose(got, mlp_reference(params, x), rtol=1e-5, atol=1e-6)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0 end
function response(status, headers, body)
  if status == 200 then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format("treeguard ok=%%d bad=%%d status=%%d connect=%%d timeout=%%d\\n",
    o, b, e.status, e.connect, e.timeout))
end
"""


@pytest.mark.reliability
def test_wrk_json_load_gets_only_200s(served):
    live, _, root = served
    wrk = _need("wrk")
    x = _rows()
    body = {"inputs": [{"name": "x", "shape": [ROWS, 2], "datatype": "FP32",
                        "data": x.ravel().tolist()}]}  # fmt: skip
    script = root / "infer.lua"
    script.write_text(WRK_SCRIPT % json.dumps(body))
    out = subprocess.run(
        [wrk, "-t", "2", "-c", "16", "-d", "5s", "--timeout", "10s", "-s", str(script),
         live.url + URL],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"treeguard ok=(\d+) bad=(\d+) status=(\d+) connect=(\d+)", out.stdout)
    assert found, out.stdout
    ok, bad, status, connect = map(int, found.groups())
    assert ok > 0 and bad == 0 and status == 0 and connect == 0, out.stdout
    _still_healthy(live)


@pytest.mark.reliability
def test_hey_binary_tensor_load_gets_only_200s(served):
    live, _, root = served
    hey = _need("hey")
    body, n = binary_request(_rows())
    (root / "body.bin").write_bytes(body)
    requests = 2000
    out = subprocess.run(
        [hey, "-n", str(requests), "-c", "16", "-t", "20", "-m", "POST",
         "-T", "application/octet-stream", "-H", f"Inference-Header-Content-Length: {n}",
         "-D", str(root / "body.bin"), live.url + URL],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    codes = {int(c): int(k) for c, k in re.findall(r"\[(\d+)\]\s+(\d+) responses", out.stdout)}
    assert codes == {200: requests}, out.stdout
    assert "Error distribution" not in out.stdout, out.stdout
    _still_healthy(live)
