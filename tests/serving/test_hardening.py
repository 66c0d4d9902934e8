"""A real server under hostile clients: slow headers, slow and abandoned
bodies, more connections than allowed; and a server that finds nothing to
serve exits non-zero, naming each version. Every wait is bounded."""

from __future__ import annotations

import json
import socket
import time

import httpx
import numpy as np
import pytest
from live import SERVER, served_mlp
from ports import free_port
from serving_support import metric, request
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
    """A server whose unfinished headers and bodies are never cut off while a
    test runs, and that reads more bodies at once than it holds connections."""
    limits = Limits(
        header_timeout_s=600.0,
        body_timeout_s=600.0,
        max_connections=LIMITS.max_connections,
        max_bodies=4 * LIMITS.max_connections,
    )
    with _served(mlp_store, tmp_path, limits) as live:
        yield live


@pytest.fixture
def patient(mlp_store, tmp_path):
    """A server that waits long for bodies and reads at most two at once."""
    limits = Limits(body_timeout_s=600.0, max_bodies=2)
    with _served(mlp_store, tmp_path, limits) as live:
        yield live


def _served(mlp_store, tmp_path, limits, *args):
    return served_mlp(mlp_store[0], tmp_path, limits, *args)


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
        try:
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # closed with our bytes unread: the kernel answers with a reset
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
        text = _metrics_once_disconnects(c, 1)
        assert metric(text, "treeguard_dropped_requests_total", reason="body_timeout") == 1
        assert metric(text, "treeguard_dropped_requests_total", reason="disconnect") == 1
        assert c.post("/v2/models/mlp/infer", json=request(1)).status_code == 200


def _metrics_once_disconnects(c: httpx.Client, n: int) -> str:
    """``/metrics`` once the server counted ``n`` disconnects (or PATIENCE_S passed)."""
    end = time.monotonic() + PATIENCE_S
    while True:
        text = c.get("/metrics").text
        seen = metric(text, "treeguard_dropped_requests_total", reason="disconnect")
        if seen >= n or time.monotonic() > end:
            return text
        time.sleep(0.1)


def _response(s: socket.socket) -> bytes:
    """One whole response from ``s``: its head, then content-length bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(
        next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")).split(
            b":"
        )[1]
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def _infer_head(length: int) -> bytes:
    return (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


def test_a_body_that_arrives_in_parts_is_read_whole(patient):
    body = json.dumps(request(2)).encode()
    s = _connect(patient.port)
    s.sendall(_infer_head(len(body)) + body[:7])
    assert _ask_live(patient.port).startswith(b"HTTP/1.1 200")  # the server is waiting for it
    s.sendall(body[7:])
    answer = _response(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"outputs"' in answer


def test_bodies_over_the_cap_on_those_read_at_once_get_503(patient):
    held = [_connect(patient.port) for _ in range(2)]
    try:
        for s in held:
            s.sendall(_infer_head(1000) + b'{"inputs": ')
        # answered after the server took up both: their bodies are being read now
        assert _ask_live(patient.port).startswith(b"HTTP/1.1 200")
        third = _connect(patient.port)
        third.sendall(_infer_head(1000) + b'{"in')
        answer = _response(third)
        third.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"2 request bodies are being read" in answer
        body = json.dumps(request(1)).encode()
        whole = _connect(patient.port)  # a whole body is never held, so it is not refused
        whole.sendall(_infer_head(len(body)) + body)
        assert _response(whole).startswith(b"HTTP/1.1 200")
        whole.close()
    finally:
        for s in held:
            s.close()
    with httpx.Client(base_url=patient.url, timeout=PATIENCE_S) as c:
        text = _metrics_once_disconnects(c, 2)
        assert metric(text, "treeguard_dropped_requests_total", reason="bodies") == 1
        assert metric(text, "treeguard_dropped_requests_total", reason="disconnect") == 2


def _ask_live(port: int) -> bytes:
    extra = _connect(port)
    try:
        extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        return extra.recv(4096)
    finally:
        extra.close()


def _hold_body(port: int) -> socket.socket:
    s = _connect(port)
    s.sendall(_infer_head(1000) + b'{"inputs": ')  # a body that never ends
    return s


def _closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.settimeout(PATIENCE_S)


def test_connections_over_the_cap_get_503_when_every_one_is_busy(capped):
    held = [_hold_body(capped.port) for _ in range(LIMITS.max_connections)]
    try:
        end = time.monotonic() + PATIENCE_S
        answer = _ask_live(capped.port)
        while not answer.startswith(b"HTTP/1.1 503") and time.monotonic() < end:
            # a held one whose body the server had not taken up yet was idle,
            # and made room for the probe: hold another in its place
            for i, s in enumerate(held):
                if _closed_by_server(s):
                    s.close()
                    held[i] = _hold_body(capped.port)
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


def test_over_the_cap_the_oldest_idle_connection_makes_room(capped):
    idle = []
    try:
        for _ in range(LIMITS.max_connections + 2):
            s = _connect(capped.port)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # headers never finished
            idle.append(s)
        assert _ask_live(capped.port).startswith(b"HTTP/1.1 200")
        assert _closed_within(idle[0], PATIENCE_S)  # the oldest went first
    finally:
        for s in idle:
            s.close()
    with httpx.Client(base_url=capped.url, timeout=PATIENCE_S) as c:
        text = c.get("/metrics").text
    assert metric(text, "treeguard_dropped_requests_total", reason="connections") >= 3


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


def test_a_body_still_arriving_at_shutdown_gets_503_and_no_traceback(mlp_store, tmp_path):
    # without this, uvicorn waits out its grace period, then cancels the
    # request: a 500 and "Exception in ASGI application" with a traceback
    with _served(mlp_store, tmp_path, Limits(body_timeout_s=600.0)) as live:
        s = _connect(live.port)
        s.sendall(_infer_head(1000) + b'{"inputs": ')
        assert _ask_live(live.port).startswith(b"HTTP/1.1 200")  # it has taken up the body
        live.proc.terminate()
        answer = _response(s)
        s.close()
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"shutting down with this request's body still arriving" in answer
    assert b"connection: close" in answer.lower()
    assert "Finished server process" in live.log, live.log[-3000:]  # shut down, not killed
    # (_served asserts that the log holds no traceback)
