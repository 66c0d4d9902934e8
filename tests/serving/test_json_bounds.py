"""REST JSON bodies parsed in memory bounded by their size: hostile shapes
refused (typed, quoting nothing) before their objects are built, ordinary
float data decoded without a Python float per element, and the bounded
parse agreeing with the whole parse on every body."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from machine import needs_peak_rss_counted_once
from serving_support import client, mlp_spec
from subproc import run_python

import treeguard
from treeguard import LeafSpec, spec_of

# The parser and the decoder alone on purpose (no server): they have no public name.
from treeguard._src.serving.decode import Decoder  # _src: decode without a server
from treeguard._src.serving.rest import read_request  # _src: the whole= parse knob
from treeguard.examples import mlp
from treeguard.serving import Limits, Server, ServingSpec

DTYPES = ["bool", "int8", "int32", "int64", "uint8", "uint64"]
DTYPES += ["float16", "float32", "float64", "bfloat16"]
NAMES = {"bool": "BOOL", "bfloat16": "BF16"}
SPEC = ServingSpec(inputs=spec_of({d: LeafSpec(("B", 2), d) for d in DTYPES}), buckets=(1, 2, 4))
DECODER = Decoder(SPEC)
WHOLE = 1 << 62  # every body parsed whole: the parse as it was


def outcome(body: bytes, whole: int) -> tuple[object, ...]:
    """What a body comes to: the arrays' bytes, or the refusal."""
    try:
        arrays = DECODER.decode(read_request(body, None, whole=whole))
    except treeguard.serving.InvalidRequestError as e:
        return ("refused", e.status, e.reason, str(e))
    return tuple((a.dtype.str, a.shape, a.tobytes()) for a in arrays)


_SPACE = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
_INFO = {d: np.iinfo(d) for d in DTYPES if np.dtype(d).kind in "iu"}


def _element(d: str) -> st.SearchStrategy[str]:
    """An element input ``d`` holds, in one of the ways JSON may write it."""
    dtype = np.dtype(ml_dtypes.bfloat16 if d == "bfloat16" else d)
    if dtype.kind == "b":
        return st.sampled_from(["true", "false"])
    if dtype.kind in "iu":
        info = _INFO[d]
        return st.integers(int(info.min), int(info.max)).map(str)
    top = float(ml_dtypes.finfo(dtype).max)
    written = st.sampled_from(["-0", "-0.0", "0e0", "1E+2", "-1e-5", "0.1"])
    floats = st.floats(-top, top).map(json.dumps)
    return floats | st.integers(-int(top), int(top)).map(str) | written


def _odd(d: str) -> list[str]:
    """Elements input ``d`` does not hold: another kind, or past its range."""
    past = ["1e400", "-1e400", "65519", "3.5e38", str(2**70)]
    if d in _INFO:
        past = [str(int(_INFO[d].min) - 1), str(int(_INFO[d].max) + 1), str(2**64)]
    return ["1", "1.5", "true", "null", '"a"', "[1]", "NaN", "-0", *past]


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A request body for ``SPEC``: mostly valid, sometimes with one fault."""
    rows = draw(st.integers(0, 4))
    fault = draw(
        st.sampled_from(["", "", "", "", "element", "rows", "dup", "nan", "escaped", "cut", "byte"])
    )
    odd = draw(st.sampled_from(DTYPES))  # the input the fault is in
    parts = []
    for d in draw(st.permutations(DTYPES)):
        items = draw(st.lists(_element(d), min_size=2 * rows, max_size=2 * rows))
        if fault == "element" and d == odd and items:
            items[draw(st.integers(0, len(items) - 1))] = draw(st.sampled_from(_odd(d)))
        sep = draw(_SPACE) + "," + draw(_SPACE)
        data = "[" + draw(_SPACE) + sep.join(items) + draw(_SPACE) + "]"
        name = NAMES.get(d, "FP" + d[5:] if d.startswith("float") else d.upper())
        key = '"d\\u0061ta"' if fault == "escaped" and d == odd else '"data"'
        extra = ', "data": [1, 2]' if fault == "dup" and d == odd else ""
        shape = rows + 1 if fault == "rows" and d == odd else rows
        parts.append(
            f'{{"name": "{d}", "datatype": "{name}", "shape": [{shape}, 2],'
            f"{draw(_SPACE)}{key}{draw(_SPACE)}:{draw(_SPACE)}{data}{extra}}}"
        )
    tails = ["", ', "id": "7"', ', "x": "\\"data\\": [1, 2]"', ', "x": {"data": [1]}']
    tail = ', "x": NaN' if fault == "nan" else draw(st.sampled_from(tails))
    text = '{"inputs": [' + ", ".join(parts) + "]" + tail + "}"
    body = text.encode()
    if fault == "cut":
        body = body[: draw(st.integers(0, len(body) - 1))]
    if fault == "byte":
        at = draw(st.integers(0, len(body) - 1))  # a bad byte, or a stray character
        body = body[:at] + draw(st.sampled_from([b"\xff", b"5", b"]", b'"', b"-"])) + body[at:]
    return body


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(body=bodies())
def test_the_bounded_parse_agrees_with_the_whole_parse_on_every_body(body):
    assert outcome(body, 0) == outcome(body, WHOLE)


def test_data_lists_past_int64_and_negative_zero_decode_as_python_numbers_make_them():
    body = (
        b'{"inputs": [{"name": "int64", "datatype": "INT64", "shape": [1, 2], '
        b'"data": [-9223372036854775808, 9223372036854775807]}, '
        b'{"name": "float32", "datatype": "FP32", "shape": [1, 2], "data": [-0, -0.0]}]}'
    )
    doc = json.loads(body)
    spec = ServingSpec(
        inputs=spec_of(
            {"int64": LeafSpec(("B", 2), "int64"), "float32": LeafSpec(("B", 2), "float32")}
        ),
        buckets=(1,),
    )
    decoder = Decoder(spec)
    f, i = decoder.decode(read_request(body, None, whole=0))
    assert i.tolist() == [doc["inputs"][0]["data"]]
    assert np.signbit(f).tolist() == [[False, True]]


def test_a_data_list_of_objects_is_counted_as_the_rest_of_the_body():
    body = _body(b"{}," * 100_000 + b"{}", 1)
    with pytest.raises(treeguard.serving.InvalidRequestError) as e:
        read_request(body, None)
    assert (e.value.status, e.value.reason) == (413, "size")


def _body(data: bytes, rows: int, *, junk: bytes = b"") -> bytes:
    return (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [%d, 256], "data": [%s]}]%s}'
        % (rows, data, junk)
    )


@pytest.mark.parametrize(
    "junk",
    [
        b', "junk": [' + b"{}," * 100_000 + b"{}]",
        b', "junk": [' + b'"a",' * 100_000 + b'"a"]',
        b', "junk": [' + b"0," * 200_000 + b"0]",
        b', "junk": [' + b"[0]," * 100_000 + b"[0]]",
        b', "junk": ' + b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["objects", "strings", "zeros", "lists", "nesting"],
)
def test_a_body_of_many_small_values_is_refused_before_they_are_built(junk):
    body = _body(b"0.5," * 255 + b"0.5", 1, junk=junk)
    with pytest.raises(treeguard.serving.InvalidRequestError) as e:
        read_request(body, None)
    message = str(e.value)
    assert (e.value.status, e.value.reason) == (413, "size")
    assert message.startswith("the body's JSON would cost about ")
    assert f"for a body of {len(body)} bytes" in message and '"a"' not in message


# One child per body: ``ru_maxrss`` is a high-water mark, and importing JAX
# leaves it far above what the process holds, so the child forks after its
# imports (a forked process's mark starts at what it holds), and the fork
# reads the body from a file (one allocation of its size) before the mark.
_CHILD = """
import os, resource, sys
import treeguard
from treeguard import LeafSpec, spec_of
from treeguard._src.serving.decode import Decoder  # _src: decode without a server
from treeguard._src.serving.rest import read_request  # _src: the whole= parse knob
from treeguard.serving import ServingSpec
spec = ServingSpec(inputs=spec_of({"x": LeafSpec(("B", 256), "float32")}), buckets=(1,))
decoder = Decoder(spec)
decoder.decode(read_request(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256], '
                            b'"data": [' + b"0," * 255 + b"0]}]}", None, whole=0))
pid = os.fork()
if pid:
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
with open(sys.argv[1], "rb") as f:
    body = f.read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decoder.decode(read_request(body, None, whole=int(sys.argv[2])))
    verdict = "decoded"
except treeguard.serving.InvalidRequestError as e:
    verdict = str(e.status)
print(verdict, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, flush=True)
os._exit(0)
"""


def _cost(tmp_path, item: bytes, count: int, junk: bytes = b"", whole: int = 64 << 10):
    """What decoding a body costs in the child: its verdict, size and bytes of peak memory."""
    rows = count // 256
    body = _body(item * (rows * 256 - 1) + item.rstrip(b","), rows)
    if junk:
        body = body[:-1] + b', "j": [' + junk * 200_000 + b"0]}"
    path = tmp_path / "body.json"
    path.write_bytes(body)
    done = run_python(_CHILD, str(path), str(whole))
    assert done.returncode == 0, done.stderr
    verdict, cost = done.stdout.split()
    return verdict, len(body), int(cost)


@pytest.mark.parametrize(
    ("item", "count", "junk", "verdict"),
    [
        (b"0.5,", 1 << 20, b"", "decoded"),  # ordinary float data
        # a long list of 0
        pytest.param(b"0,", 1 << 21, b"", "decoded", id="zeros", marks=pytest.mark.slow),
        (b"0.5,", 1 << 10, b"{},", "413"),  # many small objects
        # many tiny strings
        pytest.param(b"0.5,", 1 << 10, b'"a",', "413", id="strings", marks=pytest.mark.slow),
        (b"0.5,", 1 << 10, b"0,", "413"),  # a long list of 0 outside the data
        # many short data lists
        pytest.param(
            b"0.5,", 1 << 10, b'"data": [0],', "413", id="data-lists", marks=pytest.mark.slow
        ),
    ],
    ids=["floats", "zeros", "objects", "strings", "zeros-outside", "data-lists"],
)
def test_a_body_costs_at_most_4x_its_size_in_memory(tmp_path, item, count, junk, verdict):
    needs_peak_rss_counted_once()
    got, size, cost = _cost(tmp_path, item, count, junk)
    assert got == verdict
    print(f"{verdict}: a body of {size} bytes cost {cost} bytes")
    assert cost <= 4 * size, (cost, size)


def test_float_data_parsed_whole_costs_more_than_4x_its_size(tmp_path):
    # what the bound is for: the same body parsed as plain JSON
    got, size, cost = _cost(tmp_path, b"0.5,", 1 << 20, whole=1 << 62)
    print(f"parsed whole: a body of {size} bytes cost {cost} bytes")
    assert got == "decoded" and cost > 4 * size


@pytest.mark.anyio
async def test_a_server_answers_a_long_json_body_as_a_short_one_and_refuses_a_costly_one(
    mlp_store,
):
    # bodies past the size parsed whole, through the app: the same answer as
    # the compact body, and a 413 for many small objects
    spec = mlp_spec(limits=Limits(max_request_bytes=1 << 20))
    server = Server(mlp.model, mlp_store[0], spec=spec)
    values = [0.5, -1.25, 3.0, 0.0] * 8
    compact = json.dumps(
        {"inputs": [{"name": "x", "shape": [16, 2], "datatype": "FP32", "data": values}]}
    ).encode()
    padded = compact.replace(b", ", b"," + b" " * 4096)
    assert len(padded) > 64 << 10
    costly = compact[:-1] + b', "junk": [' + b"{}," * 100_000 + b"{}]}"
    async with client(server) as c:
        url = "/v2/models/mlp/infer"
        short, long = await c.post(url, content=compact), await c.post(url, content=padded)
        assert (short.status_code, long.status_code) == (200, 200)
        assert long.json()["outputs"] == short.json()["outputs"]
        r = await c.post(url, content=costly)
        assert r.status_code == 413, r.text
        assert r.json()["error"] == (  # pinned word for word, as a client reads it
            "the body's JSON would cost about 16000992 bytes to parse, over the limit of "
            "4194304 for a body of 300265 bytes\nhint: send each input's data as one flat "
            "list, and no other long lists or many small objects or strings"
        )


def test_a_data_list_of_many_chunks_decodes_as_the_whole_parse_decodes_it():
    # lists of several jsonbody.CHUNK bytes of text, cut at commas into pieces
    rng = np.random.default_rng(0)
    rows = 60_000
    floats = rng.normal(size=2 * rows).tolist()
    floats[7] = 0  # written -0 below: an integer, so 0.0
    ints = rng.integers(0, 2**63 - 1, size=2 * rows).tolist()
    ints[-1] = 2**64 - 1  # past int64, in the last piece
    spec = ServingSpec(
        inputs=spec_of({"f": LeafSpec(("B", 2), "float64"), "u": LeafSpec(("B", 2), "uint64")})
    )
    body = json.dumps({
        "inputs": [
            {"name": "f", "datatype": "FP64", "shape": [rows, 2], "data": floats},
            {"name": "u", "datatype": "UINT64", "shape": [rows, 2], "data": ints},
        ]
    }).encode().replace(b", 0, ", b", -0, ", 1)  # fmt: skip
    assert b", -0, " in body
    decoder = Decoder(spec)
    f, u = decoder.decode(read_request(body, None, whole=0))
    assert f.tobytes() == np.array(floats, np.float64).reshape(rows, 2).tobytes()
    assert u.tobytes() == np.array(ints, np.uint64).reshape(rows, 2).tobytes()
    assert [a.tobytes() for a in decoder.decode(read_request(body, None, whole=WHOLE))] == [
        f.tobytes(),
        u.tobytes(),
    ]
