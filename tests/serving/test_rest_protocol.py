"""The Open Inference Protocol over REST in process: every datatype as JSON
and as binary tensors, metadata, ids and output selection, binary bodies
that lie, bounded decoding, and the control token."""

from __future__ import annotations

import asyncio
import json
import math
import tracemalloc

import dtypemodel
import ml_dtypes
import numpy as np
import pytest
from echomodel import decoding, echo_server
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_support import client, mlp_spec, request

import treeguard
from treeguard import LeafSpec
from treeguard.examples import mlp
from treeguard.serving import InferRequest, RawInput, Server, ServingSpec

pytestmark = pytest.mark.anyio
URL = "/v2/models/mlp/infer"


@pytest.fixture
def dtype_server(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    v = store.put({"on": np.asarray(True)})
    assert store.verify(v).status == "verified"
    store.promote(v)
    spec = ServingSpec.from_model(dtypemodel.model, buckets=(1, 4), name="dtypes")
    return Server(dtypemodel.model, store, spec=spec)


def binary_body(doc, blobs):
    header = json.dumps(doc).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header))}


def split_binary(response):
    n = int(response.headers["inference-header-content-length"])
    return json.loads(response.content[:n]), response.content[n:]


async def test_every_datatype_round_trips_as_json_and_as_binary(dtype_server):
    rows = dtypemodel.rows(3)
    async with client(dtype_server) as c:
        meta = (await c.get("/v2/models/dtypes")).json()
        names = {m["name"]: m["datatype"] for m in meta["inputs"]}
        assert names == {
            "b": "BOOL", "i8": "INT8", "i16": "INT16", "i32": "INT32", "u8": "UINT8",
            "u16": "UINT16", "u32": "UINT32", "f16": "FP16", "f32": "FP32", "bf16": "BF16",
        }  # fmt: skip
        assert {m["name"]: m["datatype"] for m in meta["outputs"]} == names
        doc = {
            "inputs": [
                {"name": k, "shape": [3, 2], "datatype": names[k], "data": x.ravel().tolist()}
                for k, x in rows.items()
            ]
        }
        r = await c.post("/v2/models/dtypes/infer", json=doc)
        assert r.status_code == 200, r.text
        for out in r.json()["outputs"]:
            want = rows[out["name"]]
            assert out["datatype"] == names[out["name"]] and out["shape"] == [3, 2]
            np.testing.assert_array_equal(np.asarray(out["data"], want.dtype), want.ravel())
        # the same as binary tensors, both ways
        blobs = [x.tobytes() for x in rows.values()]
        doc = {
            "id": "b-1",
            "inputs": [
                {"name": k, "shape": [3, 2], "datatype": names[k],
                 "parameters": {"binary_data_size": len(blob)}}
                for (k, _), blob in zip(rows.items(), blobs, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }  # fmt: skip
        body, headers = binary_body(doc, blobs)
        r = await c.post("/v2/models/dtypes/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/octet-stream"
        head, tail = split_binary(r)
        assert head["id"] == "b-1"
        offset = 0
        for out in head["outputs"]:
            size = out["parameters"]["binary_data_size"]
            want = rows[out["name"]]
            got = np.frombuffer(tail[offset : offset + size], want.dtype).reshape(want.shape)
            np.testing.assert_array_equal(got, want)
            offset += size
        assert offset == len(tail)


async def test_outputs_are_selected_and_mixed_json_and_binary(dtype_server):
    rows = dtypemodel.rows(1)
    async with client(dtype_server) as c:
        names = {
            m["name"]: m["datatype"] for m in (await c.get("/v2/models/dtypes")).json()["inputs"]
        }
        doc = {
            "inputs": [
                {"name": k, "shape": [1, 2], "datatype": names[k], "data": x.ravel().tolist()}
                for k, x in rows.items()
            ],
            "outputs": [{"name": "u8", "parameters": {"binary_data": True}}, {"name": "i8"}],
        }
        r = await c.post("/v2/models/dtypes/infer", json=doc)
        head, tail = split_binary(r)
        assert [o["name"] for o in head["outputs"]] == ["u8", "i8"]
        assert tail == rows["u8"].tobytes()
        assert head["outputs"][1]["data"] == rows["i8"].ravel().tolist()
        doc["outputs"] = [{"name": "nope"}]
        r = await c.post("/v2/models/dtypes/infer", json=doc)
        assert r.status_code == 422
        assert r.json()["error"].startswith("the request asks for an unknown output")


def _binary_x(rows: int, blob: bytes, header_extra: int = 0):
    doc = {
        "inputs": [
            {"name": "x", "shape": [rows, 2], "datatype": "FP32",
             "parameters": {"binary_data_size": len(blob) + header_extra}}
        ]
    }  # fmt: skip
    return binary_body(doc, [blob])


async def test_binary_bodies_that_lie_are_refused_by_name(mlp_server):
    good = np.ones((2, 2), np.float32).tobytes()
    cases = [
        (*_binary_x(2, good[:-4]), 422, "input ['x']: 12 bytes of binary data, shape [2,2]"),
        (*_binary_x(2, good, header_extra=4), 422, "inputs[0]: binary_data_size 20 runs past"),
        (*_binary_x(2, good + b"\0\0\0\0", header_extra=-4), 422, "the body holds 4 bytes"),
    ]
    body, headers = _binary_x(2, good)
    cases.append((body, {"Inference-Header-Content-Length": "99999"}, 400, "Inference-Header"))
    cases.append((body, {"Inference-Header-Content-Length": "-1"}, 400, "Inference-Header"))
    # digits str.isdigit takes and int refuses: a 400, never a 500
    cases.append((body, {"Inference-Header-Content-Length": b"\xb2"}, 400, "Inference-Header"))
    cases.append((body, {"Inference-Header-Content-Length": "9" * 5000}, 400, "Inference-Header"))
    async with client(mlp_server) as c:
        for body, headers, status, message in cases:
            r = await c.post(URL, content=body, headers=headers)
            assert r.status_code == status, r.text
            assert message.lower() in r.json()["error"].lower(), r.text
        body, headers = _binary_x(2, good)
        assert (await c.post(URL, content=body, headers=headers)).status_code == 200


async def test_a_bool_byte_that_is_neither_0_nor_1_is_refused(dtype_server):
    rows = dtypemodel.rows(1)
    blobs = [x.tobytes() for x in rows.values()]
    blobs[0] = b"\x02\x01"
    # the protocol's names of dtypemodel's dtypes, in its order: a wire contract, spelled out
    datatypes = [
        "BOOL",
        "INT8",
        "INT16",
        "INT32",
        "UINT8",
        "UINT16",
        "UINT32",
        "FP16",
        "FP32",
        "BF16",
    ]
    doc = {
        "inputs": [
            {"name": k, "shape": [1, 2], "datatype": dt,
             "parameters": {"binary_data_size": len(blob)}}
            for k, dt, blob in zip(rows, datatypes, blobs, strict=True)
        ]
    }  # fmt: skip
    body, headers = binary_body(doc, blobs)
    async with client(dtype_server) as c:
        r = await c.post("/v2/models/dtypes/infer", content=body, headers=headers)
    assert r.status_code == 422 and r.json()["error"].startswith(
        "input ['b']: a BOOL byte is neither 0 nor 1"
    )


async def test_one_long_string_costs_no_more_than_a_small_multiple_of_the_body(mlp_store):
    server = Server(mlp.model, mlp_store[0], spec=mlp_spec(buckets=(1,)))  # default limits
    n = 40_000
    data = [0.0] * (n * 2 - 1) + ["x" * 190_000]
    body = json.dumps({"inputs": [{"name": "x", "shape": [n, 2], "datatype": "FP32",
                                   "data": data}]}).encode()  # fmt: skip
    async with client(server) as c:
        tracemalloc.start()
        try:
            r = await c.post(URL, content=body, headers={"Content-Type": "application/json"})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert r.status_code == 422 and "data holds text for datatype" in r.json()["error"]
    assert peak < 20 * len(body), (peak, len(body))


async def test_ids_and_the_versioned_routes(mlp_store, mlp_server):
    _, v = mlp_store
    async with client(mlp_server) as c:
        body = {**request(1), "id": "abc"}
        r = await c.post(f"/v2/models/mlp/versions/{v['v1']}/infer", json=body)
        assert r.status_code == 200 and r.json()["id"] == "abc"
        r = await c.post(f"/v2/models/mlp/versions/{v['v2']}/infer", json=body)
        assert r.status_code == 404 and r.json()["error"] == (
            f"that version is not the one served\nhint: the served version is {v['v1']}"
        )
        assert (await c.get(f"/v2/models/mlp/versions/{v['v1']}/ready")).status_code == 200
        assert (await c.get(f"/v2/models/mlp/versions/{v['v2']}/ready")).status_code == 503
        meta = (await c.get("/v2")).json()
        assert meta["name"] == "treeguard" and "binary_tensor_data" in meta["extensions"]


async def test_swap_and_rollback_need_the_bearer_token_when_one_is_set(mlp_store):
    store, v = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec())
    server.start()
    token = b"s3cret-token-0123456789"
    app = server.app(control_token=token)
    import httpx

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": token.decode()},
            ):
                r = await c.post("/v2/treeguard/swap", json={"version": v["v2"]}, headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                assert (await c.post("/v2/treeguard/rollback", headers=headers)).status_code == 401
            assert server.status()["active"] == v["v1"]
            auth = {"Authorization": f"Bearer {token.decode()}"}
            r = await c.post("/v2/treeguard/swap", json={"version": v["v2"]}, headers=auth)
            assert r.status_code == 200 and r.json()["active"] == v["v2"]
            assert (await c.post("/v2/treeguard/rollback", headers=auth)).status_code == 200
            assert (await c.post(URL, json=request(1))).status_code == 200  # infer stays open


def test_serve_refuses_to_bind_beyond_loopback_without_a_token(mlp_server):
    with pytest.raises(treeguard.ConfigError, match="is reachable from other machines"):
        mlp_server.serve(host="0.0.0.0", port=1)


# -- decoding, seen through a server that answers with what it decoded (echomodel) ----


async def test_64_bit_datatypes_decode_exactly_and_refuse_what_they_cannot_hold(tmp_path):
    # values at the edges of 64 bits
    inputs = {k: LeafSpec(("B", 1), k) for k in ("int64", "uint64", "float64")}
    server = echo_server(tmp_path / "s", inputs, (1,))

    def req(i64, u64, f64):
        return InferRequest([
            RawInput("int64", "INT64", [1, 1], [i64]),
            RawInput("uint64", "UINT64", [1, 1], [u64]),
            RawInput("float64", "FP64", [1, 1], [f64]),
        ])  # fmt: skip

    async with decoding(server) as decode:
        f, i, u = await decode(req(-(2**63), 2**64 - 1, 1e300))  # in key order
        assert (i.dtype, u.dtype, f.dtype) == (np.int64, np.uint64, np.float64)
        assert (int(i[0, 0]), int(u[0, 0]), float(f[0, 0])) == (-(2**63), 2**64 - 1, 1e300)
        for bad, message in (
            (req(2**63, 0, 0.0), "input ['int64']: a value is out of range for INT64"),
            (req(0, -1, 0.0), "input ['uint64']: a value is out of range for UINT64"),
            (req(0, 0, 1e309), "input ['float64']: a value is beyond the range of FP64"),
        ):
            with pytest.raises(
                treeguard.serving.InvalidRequestError, match=message.replace("[", r"\[")
            ):
                await decode(bad)


async def test_float_values_are_refused_beyond_the_range_and_as_nan_wherever_they_sit(tmp_path):
    # typed contents (gRPC) may hold a NaN, which JSON cannot
    server = echo_server(tmp_path / "s", {"x": LeafSpec(("B", 2), "float32")}, (1,))

    def req(a, b):
        return InferRequest([RawInput("x", "FP32", [1, 2], [a, b])])

    top = float(np.finfo(np.float32).max)
    async with decoding(server) as decode:
        (x,) = await decode(req(-top, 3.4028235e38))  # the largest float32, as written
        assert x.tolist() == [[-top, top]]
        for a, b, reason in (
            (1.0, float("nan"), "nonfinite"),
            (float("nan"), 1.0, "nonfinite"),
            (1.0, 3.5e38, "nonfinite"),
            (-(10**400), 1.0, "nonfinite"),
            (float("inf"), float("-inf"), "nonfinite"),
        ):
            with pytest.raises(treeguard.serving.InvalidRequestError) as e:
                await decode(req(a, b))
            assert (e.value.reason, str(e.value)) == (
                reason,
                "input ['x']: a value is beyond the range of FP32",
            )


#: In the spec's order (its inputs' names sorted), the order the server decodes them in.
FLOATS = {"BF16": ml_dtypes.bfloat16, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


@pytest.fixture(scope="module")
def float_echo(tmp_path_factory):
    """An echo server of one input of each float datatype, 1 to 12 values each."""
    inputs = {name: LeafSpec(("B",), np.dtype(dt).name) for name, dt in FLOATS.items()}
    return echo_server(tmp_path_factory.mktemp("floats") / "s", inputs, (12,))


async def test_json_numbers_decode_as_their_float64_value_cast_to_the_dtype(float_echo):
    # every number within the datatype's range, float or integer, decodes as
    # its float64 value cast to the dtype (the examples run in a thread, each
    # request on the running server's loop)
    loop = asyncio.get_running_loop()

    @settings(max_examples=60, deadline=None)
    @given(data=st.data())
    def check(data):
        n = data.draw(st.integers(1, 12))
        values = {}
        for name, dtype in FLOATS.items():
            top = float(ml_dtypes.finfo(dtype).max)
            number = st.one_of(st.floats(-top, top), st.integers(-int(top), int(top)))
            values[name] = data.draw(st.lists(number, min_size=n, max_size=n), label=name)
        request = InferRequest([RawInput(k, k, [n], v) for k, v in values.items()])
        arrays = asyncio.run_coroutine_threadsafe(decode(request), loop).result()
        for (name, dtype), x in zip(FLOATS.items(), arrays, strict=True):
            expected = np.array(values[name], np.float64).astype(dtype)
            assert x.dtype == np.dtype(dtype) and x.tobytes() == expected.tobytes(), name

    async with decoding(float_echo) as decode:
        await asyncio.to_thread(check)


async def test_inputs_of_a_two_input_spec_decode_in_any_order_and_each_refusal_names_the_input(
    tmp_path,
):
    inputs = {"a": LeafSpec(("B", 2), "float32"), "b": LeafSpec(("B",), "int32")}
    server = echo_server(tmp_path / "s", inputs, (1, 2))

    def a(shape=None, name="a"):
        shape = [2, 2] if shape is None else shape  # as JSON gives it, a list
        return RawInput(name, "FP32", shape, [0.5] * int(math.prod(shape)))

    def b(rows=2, name="b"):
        return RawInput(name, "INT32", [rows], list(range(rows)))

    async with decoding(server) as decode:
        for inputs in ([a(), b()], [b(), a()], [a(name="['a']"), b(name="['b']")]):
            x, y = await decode(InferRequest(inputs))  # in spec order, by name or key path
            assert (x.shape, y.tolist()) == ((2, 2), [0, 1])
        x, _ = await decode(InferRequest([a(shape=(2, 2)), b()]))  # a tuple shape (typed clients)
        assert x.shape == (2, 2)
        for inputs, message in (
            ([a()], "missing input(s) b\nhint: the inputs are a, b"),
            ([b()], "missing input(s) a\nhint: the inputs are a, b"),
            ([a(), a(name="['a']"), b()], "input ['a'] is given twice"),
            ([a(), b(rows=1)], "input ['b']: 1 rows, while the other inputs have 2"),
            ([a(shape=[2.0, 2]), b()], "input ['a']: shape must be a list of sizes"),
            ([a(shape=[True, 2]), b()], "input ['a']: shape must be a list of sizes"),
            ([a(shape=[2, 2, 1]), b()], "input ['a']: shape [2,2,1] in the request, f32[B,2]"),
        ):
            with pytest.raises(treeguard.serving.InvalidRequestError) as e:
                await decode(InferRequest(inputs))
            assert str(e.value).startswith(message), str(e.value)
