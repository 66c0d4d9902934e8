"""Every transport bounded per client and per request, through real sockets
against a real ``treeguard serve`` (REST and gRPC on 127.0.0.1): repeated
output names, responses over the limit, silent gRPC calls, idle connections
by the thousand, long request ids and metadata, messages that do not parse,
typed and raw contents together; each refusal counted once. Every wait is
bounded; no verdict depends on how fast the server is."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import widemodel
from h2raw import Stalling
from live import live_server, served_mlp
from serving_support import metric, put_verified, request
from subproc import child_env

import treeguard
from treeguard.serving import Limits, ServingSpec

grpc = pytest.importorskip("grpc")
pytestmark = pytest.mark.slow
# the protocol's messages as another client compiles them, to forge requests past each limit
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
SERVICE = "/inference.GRPCInferenceService"
#: A bound on each wait that only a hung server reaches, never a measure of speed.
PATIENCE_S = 60
#: docs/guides/serve.md: the bound on a REST request line and headers, and on gRPC metadata.
MAX_METADATA_BYTES = 16 * 1024
LIMITS = Limits(
    header_timeout_s=1.0,
    body_timeout_s=1.0,
    max_connections=8,
    max_bodies=8,
    max_request_bytes=2 << 20,
    max_response_bytes=200,
)


def _served(mlp_store, folder, limits, *, before=""):
    return served_mlp(mlp_store[0], folder, limits, grpc=True, before=before)


@pytest.fixture(scope="module")
def bounded(mlp_store, tmp_path_factory):
    with _served(mlp_store, tmp_path_factory.mktemp("bounded"), LIMITS) as live:
        yield live


@pytest.fixture
def channel(bounded):
    with grpc.insecure_channel(f"127.0.0.1:{bounded.grpc_port}") as ch:
        yield ch


def _infer_call(channel, serializer=None):
    return channel.unary_unary(
        f"{SERVICE}/ModelInfer",
        request_serializer=serializer or (lambda m: m.SerializeToString()),
        response_deserializer=pb.ModelInferResponse.FromString,
    )


def _message(rows=1, **fields):
    msg = pb.ModelInferRequest(model_name="mlp", **fields)
    msg.inputs.add(name="x", datatype="FP32", shape=[rows, 2])
    msg.raw_input_contents.append(np.full((rows, 2), 0.5, np.float32).tobytes())
    return msg


def _refused(call, message, **kw):
    with pytest.raises(grpc.RpcError) as e:
        call(message, timeout=PATIENCE_S, **kw)
    return e.value.code(), e.value.details()


def _metrics(live):
    with httpx.Client(base_url=live.url, timeout=PATIENCE_S) as c:
        return c.get("/metrics").text


# -- output names and the size of a response -----------------------------------------


def test_an_output_named_90000_times_over_grpc_is_sent_once(channel):
    msg = _message()
    for _ in range(90_000):
        msg.outputs.add(name="output")
    assert msg.ByteSize() > 800_000  # the request of the report: about 880 KiB
    code, details = _refused(_infer_call(channel), msg)  # refused before it is parsed
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith("the message holds more than 16384 fields")
    msg = _message()
    for _ in range(1025):  # fewer fields, still more entries than the bound
        msg.outputs.add(name="output")
    code, details = _refused(_infer_call(channel), msg)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("the request asks for 1025 outputs, over the limit of 1024")
    msg = _message()
    for _ in range(1024):  # at the bound: each name taken once
        msg.outputs.add(name="output")
    response = _infer_call(channel)(msg, timeout=PATIENCE_S)
    assert [o.name for o in response.outputs] == ["output"]
    assert len(response.raw_output_contents) == 1
    assert response.ByteSize() < 200  # one output of one row, not 1,024 copies of it


def test_an_output_named_1024_times_over_rest_is_sent_once(bounded):
    body = request(1)
    body["outputs"] = [{"name": "output"}] * 1024
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        r = c.post("/v2/models/mlp/infer", json=body)
        assert r.status_code == 200, r.text
        assert [o["name"] for o in r.json()["outputs"]] == ["output"]
        assert len(r.content) < 200
        body["outputs"] = [{"name": "output"}] * 1025
        r = c.post("/v2/models/mlp/infer", json=body)
        assert r.status_code == 422
        assert "1025 outputs, over the limit of 1024" in r.json()["error"]


def test_an_unknown_output_is_refused_before_the_model_runs(bounded):
    body = request(1)
    body["outputs"] = [{"name": "output"}, {"name": "nope"}]
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        before = metric(c.get("/metrics").text, "treeguard_batch_size_count")
        r = c.post("/v2/models/mlp/infer", json=body)
        assert r.status_code == 422 and "unknown output" in r.json()["error"]
        assert metric(c.get("/metrics").text, "treeguard_batch_size_count") == before


def test_a_response_over_the_limit_is_refused_before_it_is_built(bounded, channel):
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        r = c.post("/v2/models/mlp/infer", json=request(16))  # 16 values as JSON: over 200
        assert r.status_code == 413, r.text
        assert "over the limit of 200 (limits.max_response_bytes)" in r.json()["error"]
        body = request(16)
        body["parameters"] = {"binary_data_output": True}  # 64 raw bytes: within it
        assert c.post("/v2/models/mlp/infer", json=body).status_code == 200
    assert _infer_call(channel)(_message(16), timeout=PATIENCE_S).outputs[0].shape == [16, 1]
    code, details = _refused(_infer_call(channel), _message(64))  # 256 raw bytes: over 200
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.max_response_bytes" in details


# -- silent calls, idle connections --------------------------------------------------


def _silent_calls(channel, n, release):
    """``n`` ModelInfer calls that send their headers and then nothing until ``release``."""

    def silent():
        release.wait(PATIENCE_S)
        yield from ()

    opener = channel.stream_unary(
        f"{SERVICE}/ModelInfer",
        request_serializer=lambda m: m,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    return [opener.future(silent()) for _ in range(n)]


def _dropped(live):
    text = _metrics(live)
    return {
        reason: metric(text, "treeguard_dropped_requests_total", reason=reason)
        for reason in ("body_timeout", "bodies")
    }


def test_silent_grpc_calls_are_ended_at_the_deadline_and_free_their_slots(bounded):
    before = _dropped(bounded)
    release = threading.Event()
    # a channel of their own: the normal call goes on another connection
    with grpc.insecure_channel(f"127.0.0.1:{bounded.grpc_port}") as ch:
        calls = _silent_calls(ch, LIMITS.max_connections, release)
        try:
            for call in calls:  # each ended by the server, not by the client
                with pytest.raises(grpc.RpcError):
                    call.result(timeout=PATIENCE_S)
                assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED, call.details()
                assert "did not arrive within 1 s" in call.details()
        finally:
            release.set()
    after = _dropped(bounded)
    assert after["body_timeout"] - before["body_timeout"] == LIMITS.max_connections


def test_a_call_is_served_while_silent_calls_fill_every_place(mlp_store, tmp_path):
    # calls that are never cut off by the deadline while the test runs: only
    # a newer call ending the oldest silent one can make room
    limits = Limits(body_timeout_s=600.0, max_connections=4)
    release = threading.Event()
    with (
        _served(mlp_store, tmp_path, limits) as live,
        grpc.insecure_channel(f"127.0.0.1:{live.grpc_port}") as attacker,
        grpc.insecure_channel(f"127.0.0.1:{live.grpc_port}") as client,
    ):
        base = _dropped(live)["bodies"]
        calls = _silent_calls(attacker, limits.max_connections, release)
        try:
            # more silent calls until one has made room: then every place is held
            for _ in range(20):
                calls += _silent_calls(attacker, 1, release)
                if _wait_for(lambda: _dropped(live)["bodies"] > base):
                    break
            full = _dropped(live)["bodies"]
            assert full > base
            response = _infer_call(client)(_message(), timeout=PATIENCE_S)
            assert response.outputs[0].name == "output"
            assert _dropped(live)["bodies"] == full + 1  # it took the oldest one's place
        finally:
            release.set()
        codes = []
        for call in calls:
            with pytest.raises(grpc.RpcError):
                call.result(timeout=PATIENCE_S)
            codes.append(call.code())
    made_room = codes.count(grpc.StatusCode.UNAVAILABLE)
    assert made_room == full + 1 - base
    # the rest were held until the client ended them without a message
    assert codes.count(grpc.StatusCode.INVALID_ARGUMENT) == len(calls) - made_room


def _wait_for(condition, tries=50):
    """Whether ``condition()`` holds within ``tries`` looks, 0.02 s apart."""
    for _ in range(tries):
        if condition():
            return True
        threading.Event().wait(0.02)
    return False


def _raise_own_file_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"this process may open {hard} files, the test needs {n}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


LOW_FILE_LIMIT = "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"


def test_1100_idle_connections_leave_health_answering(mlp_store, tmp_path):
    _raise_own_file_limit(1400)
    # a server whose open-file limit is 1,024 and cannot be raised, whose
    # deadline on headers never fires while the test runs: only the cap on
    # connections and the closing of idle ones keep it answering
    limits = Limits(header_timeout_s=600.0)
    with _served(mlp_store, tmp_path, limits, before=LOW_FILE_LIMIT) as live:
        idle = []
        try:
            for _ in range(1100):
                idle.append(socket.create_connection(("127.0.0.1", live.port), PATIENCE_S))
            with httpx.Client(base_url=live.url, timeout=PATIENCE_S) as c:
                assert c.get("/v2/health/live").status_code == 200
                assert c.post("/v2/models/mlp/infer", json=request(1)).status_code == 200
                text = c.get("/metrics").text
        finally:
            for s in idle:
                s.close()
    closed = metric(text, "treeguard_dropped_requests_total", reason="connections")
    assert closed >= 1100 - limits.max_connections
    assert "open-file limit 1024 (the hard limit; it cannot be raised)" in live.log
    assert "at most 256 connections per transport" in live.log


def test_clients_that_never_read_their_responses_hold_nothing_past_the_deadline(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "wide")
    store.promote(put_verified(store, widemodel.params()))
    limits = Limits(header_timeout_s=1.0, max_connections=2)
    spec = tmp_path / "spec.json"
    ServingSpec.from_model(widemodel.model, buckets=(16,), name="wide", limits=limits).save(spec)
    here = str(Path(__file__).parent)
    env = {"PYTHONPATH": os.pathsep.join([here, child_env()["PYTHONPATH"]])}
    args = ("widemodel:model", "--store", str(store.root), "--spec", str(spec))
    body = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [16, 2], "datatype": "FP32", "data": [1.0] * 32}],
            "parameters": {"binary_data_output": True},  # 16 MiB of raw bytes
        }
    ).encode()
    head = (
        b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with live_server(*args, "--allow-unchecked", env=env) as live:
        readers = []
        try:
            for _ in range(limits.max_connections):  # every place: each never reads
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", live.port))
                s.sendall(head + body)
                readers.append(s)
            with httpx.Client(base_url=live.url, timeout=PATIENCE_S) as c:
                # each is dropped once its connection has sat past the header
                # deadline (or made room for c's), its unsent response with it:
                # its descriptor is closed, not kept until a client that never
                # reads has read
                def dropped():
                    text = c.get("/metrics").text
                    return sum(
                        metric(text, "treeguard_dropped_requests_total", reason=reason)
                        for reason in ("header_timeout", "connections")
                    )

                assert _wait_for(lambda: dropped() >= 2, tries=PATIENCE_S * 10)
                # the server holds no socket to them: a close would have kept
                # each (and its unsent bytes) until the bytes had gone, for ever
                ports = {r.getsockname()[1] for r in readers}
                assert _wait_for(lambda: not _held(live.port, ports), tries=PATIENCE_S * 10)
                assert c.get("/v2/health/live").status_code == 200
        finally:
            for s in readers:
                s.close()
    assert "Traceback" not in live.log, live.log[-3000:]


def _held(port: int, peers: set[int]) -> int:
    """How many sockets a process holds from ``port`` to one of ``peers``
    (loopback, from ``/proc/net/tcp``; a socket no process holds any more,
    its last bytes left to the kernel, has inode 0)."""
    held = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) in peers:
                held += inode != "0"
    return held


def test_idle_grpc_connections_are_closed_at_the_header_deadline(bounded):
    idle = [
        socket.create_connection(("127.0.0.1", bounded.grpc_port), PATIENCE_S) for _ in range(50)
    ]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{bounded.grpc_port}") as ch:
            response = _infer_call(ch)(_message(), timeout=PATIENCE_S, wait_for_ready=True)
            assert response.outputs[0].name == "output"
        # never sent the HTTP/2 preface: each closed by the server, at once over
        # the cap on connections, else at the deadline (after a GOAWAY)
        for s in idle:
            s.settimeout(PATIENCE_S)
            said = b""
            while chunk := s.recv(4096):
                said += chunk
                assert len(said) < 4096
    finally:
        for s in idle:
            s.close()


def test_a_grpc_client_that_gives_no_window_holds_nothing_past_the_deadline(bounded):
    # it answers every ping (keepalive finds it alive), and its calls' responses
    # can never be sent: the server ends the connection once it holds no call
    # it can still serve for the header deadline, dropping them
    body = _message().SerializeToString()
    stalling = [
        Stalling(bounded.grpc_port, f"{SERVICE}/ModelInfer", body, LIMITS.max_bodies)
        for _ in range(2)
    ]
    try:
        for conn in stalling:
            assert conn.closed.wait(PATIENCE_S)
        with grpc.insecure_channel(f"127.0.0.1:{bounded.grpc_port}") as ch:
            response = _infer_call(ch)(_message(), timeout=PATIENCE_S)
        assert response.outputs[0].name == "output"
    finally:
        for conn in stalling:
            conn.close()


def test_headers_over_the_bound_are_refused(bounded):
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        r = c.get("/v2/health/live", headers={"x-big": "a" * MAX_METADATA_BYTES})
        assert r.status_code == 400
        assert c.get("/v2/health/live").status_code == 200


def test_grpc_metadata_over_the_bound_is_refused(channel):
    code, _ = _refused(_infer_call(channel), _message(), metadata=(("x-big", "a" * 900_000),))
    assert code != grpc.StatusCode.OK
    assert _infer_call(channel)(_message(), timeout=PATIENCE_S).outputs


# -- ids, parse errors, typed and raw contents; counted once ---------------------------


def test_a_900kb_request_id_is_refused_and_never_echoed(bounded, channel):
    code, details = _refused(_infer_call(channel), _message(id="r" * 900_000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "request id must be a string of at most 256 characters" in details
    assert "rrrr" not in details
    ok = _infer_call(channel)(_message(id="r" * 256), timeout=PATIENCE_S)
    assert ok.id == "r" * 256
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        body = request(1) | {"id": "r" * 257}
        r = c.post("/v2/models/mlp/infer", json=body)
        assert r.status_code == 422 and "at most 256 characters" in r.json()["error"]


def test_a_message_that_does_not_parse_is_invalid_argument_in_one_line(channel):
    raw = _infer_call(channel, serializer=lambda b: b)
    for junk in (b"\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f"):
        code, details = _refused(raw, junk)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details == (  # pinned word for word, as a client reads it
            "the message is not a ModelInferRequest (it does not parse)\n"
            "hint: send the Open Inference Protocol's message, as a generated client does"
        )


def test_typed_and_raw_contents_together_are_refused(channel):
    msg = _message()
    msg.inputs[0].contents.fp32_contents.extend([9.0, 9.0])
    code, details = _refused(_infer_call(channel), msg)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == (  # pinned word for word, as a client reads it
        "inputs[0] has both typed contents and raw_input_contents\n"
        "hint: send each input's elements one way: raw_input_contents for every input, "
        "or contents in each"
    )


def test_each_refused_request_is_counted_once_on_either_transport(bounded, channel):
    def counts():
        text = _metrics(bounded)
        return (
            metric(text, "treeguard_requests_total", status="400"),
            metric(text, "treeguard_requests_total", status="422"),
            metric(text, "treeguard_invalid_inputs_total", reason="schema"),
        )

    before = counts()
    _refused(_infer_call(channel, serializer=lambda b: b), b"\xff\xff\xff")  # 400
    _refused(_infer_call(channel), _message(id="r" * 300))  # 422 schema
    with httpx.Client(base_url=bounded.url, timeout=PATIENCE_S) as c:
        r = c.post("/v2/models/mlp/infer", content=b"{", headers={"content-type": "x"})
        assert r.status_code == 400
        r = c.post("/v2/models/mlp/infer", content=json.dumps(request(1) | {"id": 5}))
        assert r.status_code == 422
    after = counts()
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2, 4]
