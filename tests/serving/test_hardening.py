"""A real server under hostile clients: slow headers, slow and abandoned
bodies, more connections than allowed; and a server that finds nothing to
serve exits non-zero, naming each version. Every wait is bounded."""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import numpy as np
import pytest
from live import SERVER, free_port, live_server
from serving_support import metric, mlp_spec, request
from subproc import start_python, stop

import treeguard
from treeguard.serving import Limits

pytestmark = pytest.mark.slow
LIMITS = Limits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=6, max_bodies=2)
#: How long a test waits for what the server must do after a one-second limit: a
#: bound that only a hung server reaches, never a measure of how fast it is.
PATIENCE_S = 60


@pytest.fixture
def hardened(mlp_store, tmp_path):
    with _served(mlp_store, tmp_path, LIMITS) as live:
        yield live


@pytest.fixture
def capped(mlp_store, tmp_path):
    """A server whose unfinished headers are never cut off while a test runs."""
    limits = Limits(header_timeout_s=600.0, max_connections=LIMITS.max_connections)
    with _served(mlp_store, tmp_path, limits) as live:
        yield live


@contextlib.contextmanager
def _served(mlp_store, tmp_path, limits, *args):
    store, _ = mlp_store
    spec = tmp_path / "spec.json"
    mlp_spec(limits=limits).save(spec)
    with live_server(
        "treeguard.examples.mlp:model",
        "--store",
        str(store.root),
        "--spec",
        str(spec),
        "--allow-unchecked",
        *args,
    ) as live:
        yield live
    assert "Traceback" not in live.log, live.log[-3000:]


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    s.settimeout(PATIENCE_S)
    return s


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``s`` within ``seconds`` (one byte sent per 0.2 s)."""
    end = time.monotonic() + seconds
    s.settimeout(0.2)
    while time.monotonic() < end:
        try:
            s.sendall(b"X")
        except OSError:
            return True
        with contextlib.suppress(TimeoutError):
            if s.recv(4096) == b"":
                return True
    return False


def test_slow_headers_are_cut_off_and_others_still_served(hardened):
    slow = _connect(hardened.port)
    slow.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    with httpx.Client(base_url=hardened.url, timeout=PATIENCE_S) as c:
        assert c.post("/v2/models/mlp/infer", json=request(1)).status_code == 200
        assert _closed_within(slow, PATIENCE_S)
        slow.close()
        text = c.get("/metrics").text
    assert metric(text, "treeguard_dropped_requests_total", reason="header_timeout") >= 1


def test_a_second_slow_request_on_a_kept_alive_connection_is_cut_off_too(hardened):
    s = _connect(hardened.port)
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
    assert _closed_within(s, PATIENCE_S)
    s.close()


def test_a_slow_body_gets_408_and_an_abandoned_one_a_metric_and_one_line(hardened):
    s = _connect(hardened.port)
    s.sendall(
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"inputs": '
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 408")
    s.close()
    s = _connect(hardened.port)
    s.sendall(b'POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"in')
    time.sleep(0.3)
    s.close()
    with httpx.Client(base_url=hardened.url, timeout=PATIENCE_S) as c:
        end = time.monotonic() + PATIENCE_S
        while time.monotonic() < end:
            text = c.get("/metrics").text
            if metric(text, "treeguard_dropped_requests_total", reason="disconnect") >= 1:
                break
            time.sleep(0.1)
        assert metric(text, "treeguard_dropped_requests_total", reason="body_timeout") == 1
        assert metric(text, "treeguard_dropped_requests_total", reason="disconnect") == 1
        assert c.post("/v2/models/mlp/infer", json=request(1)).status_code == 200


def _ask_live(port: int) -> bytes:
    extra = _connect(port)
    try:
        extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        return extra.recv(4096)
    finally:
        extra.close()


def test_connections_over_the_cap_get_503(capped):
    held = []
    try:
        for _ in range(LIMITS.max_connections + 2):
            s = _connect(capped.port)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # headers never finished
            held.append(s)
        # The held ones count once the server has accepted them; it never drops them.
        end = time.monotonic() + PATIENCE_S
        answer = _ask_live(capped.port)
        while not answer.startswith(b"HTTP/1.1 503") and time.monotonic() < end:
            time.sleep(0.05)
            answer = _ask_live(capped.port)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    finally:
        for s in held:
            s.close()
    with httpx.Client(base_url=capped.url, timeout=PATIENCE_S) as c:
        end = time.monotonic() + PATIENCE_S
        while time.monotonic() < end:  # the held ones closed: room again
            if c.get("/v2/health/live").status_code == 200:
                break
            time.sleep(0.1)
        assert c.get("/v2/health/live").status_code == 200


def test_a_server_with_nothing_to_serve_exits_non_zero_naming_each_version(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    wide = {
        "dense1": {"w": np.ones((2, 5), np.float32), "b": np.ones(5, np.float32)},
        "dense2": {"w": np.ones((5, 1), np.float32), "b": np.ones(1, np.float32)},
    }
    a = store.put(wide)
    assert store.verify(a, like=wide).status == "verified"
    store.promote(a)
    narrow = {
        "dense1": {"w": np.ones((2, 4), np.float32), "b": np.ones(4, np.float32)},
        "dense2": {"w": np.ones((4, 1), np.float32), "b": np.ones(1, np.float32)},
    }
    b = store.put(narrow)
    assert store.verify(b, like=narrow).status == "verified"
    proc = start_python(
        SERVER, "treeguard.examples.mlp:model", "--store", str(store.root),
        "--input", "['x']", "--port", str(free_port()), "--allow-unchecked",
    )  # fmt: skip
    try:
        proc.wait(timeout=120)
    finally:
        _, err = stop(proc)
    assert proc.returncode == 1, err[-3000:]  # ServingError: no version passes its checks
    assert f"no version can be served: {a}: version {a} fails the contract check" in err
    assert f"; {b}: " in err
    assert "['dense1']['w']: shape (2, 3) in `like`, (2, 5) in the checkpoint" in err


@pytest.mark.parametrize(("flag", "logged"), [((), False), (("--access-log",), True)])
def test_the_access_log_is_off_unless_asked_for(mlp_store, tmp_path, flag, logged):
    with (
        _served(mlp_store, tmp_path, Limits(), *flag) as live,
        httpx.Client(base_url=live.url, timeout=PATIENCE_S) as c,
    ):
        assert c.post("/v2/models/mlp/infer", json=request(1)).status_code == 200
    line = '"POST /v2/models/mlp/infer HTTP/1.1" 200'
    assert (line in live.out + live.log) is logged, live.out[-2000:]
