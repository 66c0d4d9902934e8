"""REST JSON bodies parsed in memory bounded by their size: hostile shapes
refused (typed, quoting nothing) before their objects are built, ordinary
float data decoded without a Python float per element, and the bounded
parse agreeing with the whole parse on every body. All through a server's
REST app: a body past the size the server parses whole (64 KiB) takes the
bounded parse, so a body and the same body after 128 KiB of spaces are
parsed each way, and an echo model (``echomodel``) answers with what was
decoded."""

from __future__ import annotations

import asyncio
import json
import re
import select
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from echomodel import URL as ECHO
from echomodel import echo_server, posting
from hypothesis import given, settings
from hypothesis import strategies as st
from machine import needs_peak_rss_counted_once, peak_rss_line
from serving_support import client, metric, mlp_spec
from subproc import start_python, stop

from treeguard import LeafSpec
from treeguard.examples import mlp
from treeguard.serving import Limits, Server

# one worker runs the file: its module fixtures (a child measuring costs, an
# echo server) are made once rather than once in each worker
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("json_bounds")]
DTYPES = ["bool", "int8", "int32", "int64", "uint8", "uint64"]
DTYPES += ["float16", "float32", "float64", "bfloat16"]
NAMES = {"bool": "BOOL", "bfloat16": "BF16"}
#: Spaces before a body that make it one the server parses bounded (past 64 KiB).
PAD = b" " * (128 << 10)


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """An echo server of one (B, 2) input of each datatype."""
    inputs = {d: LeafSpec(("B", 2), d) for d in DTYPES}
    return echo_server(tmp_path_factory.mktemp("dtypes") / "s", inputs, (1, 2, 4))


def _seen(response, shift: int) -> tuple[object, ...]:
    """What a client sees of an answer: the bytes of a 200, else the status and
    the error, its byte offsets counted from the body after ``shift`` bytes."""
    if response.status_code == 200:
        return (200, response.content)
    error = response.json()["error"]
    error = re.sub(r"at byte (\d+)", lambda m: f"at byte {int(m[1]) - shift}", error)
    return (response.status_code, error)


async def answers(c, body: bytes) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The answers to ``body`` parsed whole and to it parsed bounded (after ``PAD``)."""
    assert len(body) <= 64 << 10  # parsed whole
    whole = await c.post(ECHO, content=body)
    bounded = await c.post(ECHO, content=PAD + body)
    return _seen(whole, 0), _seen(bounded, len(PAD))


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


async def test_a_body_of_the_padded_size_takes_the_bounded_parse(every_dtype):
    # what makes the property below compare two parses: 30,000 braces are a
    # syntax error parsed whole, and are refused for their cost after PAD (the
    # bounded parse counts them before it parses)
    costly = b'{"inputs": [], "x": ' + b"{" * 30_000
    async with posting(every_dtype) as c:
        whole, bounded = await answers(c, costly)
    assert whole[0] == 400 and whole[1].startswith("the body is not valid JSON"), whole
    assert bounded[0] == 413 and bounded[1].startswith("the body's JSON would cost"), bounded


@pytest.mark.slow
async def test_the_bounded_parse_agrees_with_the_whole_parse_on_every_body(every_dtype):
    loop = asyncio.get_running_loop()

    @settings(max_examples=300, deadline=None)
    @given(body=bodies())
    def check(body):
        whole, bounded = asyncio.run_coroutine_threadsafe(answers(c, body), loop).result()
        assert bounded == whole

    async with posting(every_dtype) as c:
        await asyncio.to_thread(check)  # the examples in a thread, each post on this loop


async def test_data_lists_past_int64_and_negative_zero_decode_as_python_numbers_make_them(
    tmp_path,
):
    body = (
        b'{"inputs": [{"name": "int64", "datatype": "INT64", "shape": [1, 2], '
        b'"data": [-9223372036854775808, 9223372036854775807]}, '
        b'{"name": "float32", "datatype": "FP32", "shape": [1, 2], "data": [-0, -0.0]}], '
        b'"parameters": {"binary_data_output": true}}'
    )
    doc = json.loads(body)
    inputs = {"int64": LeafSpec(("B", 2), "int64"), "float32": LeafSpec(("B", 2), "float32")}
    server = echo_server(tmp_path / "s", inputs, (1,))
    async with posting(server) as c:
        r = await c.post(ECHO, content=PAD + body)  # parsed bounded
    assert r.status_code == 200, r.text
    f, i = _binary_outputs(r, {"float32": np.float32, "int64": np.int64})
    assert i.tolist() == doc["inputs"][0]["data"]
    assert np.signbit(f).tolist() == [False, True]


def _binary_outputs(response, dtypes: dict[str, type]) -> list[np.ndarray]:
    """The outputs of a response with binary data, by name in ``dtypes``' order."""
    n = int(response.headers["inference-header-content-length"])
    head, tail, at, out = json.loads(response.content[:n]), response.content[n:], 0, {}
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(tail[at : at + size], dtypes[o["name"]])
        at += size
    return [out[name] for name in dtypes]


async def test_a_data_list_of_objects_is_counted_as_the_rest_of_the_body(every_dtype):
    body = _body(b"{}," * 100_000 + b"{}", 1)
    async with posting(every_dtype) as c:
        r = await c.post(ECHO, content=body)
    assert r.status_code == 413
    assert r.json()["error"].startswith("the body's JSON would cost about ")


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
async def test_a_body_of_many_small_values_is_refused_before_they_are_built(every_dtype, junk):
    body = _body(b"0.5," * 255 + b"0.5", 1, junk=junk)
    async with posting(every_dtype) as c:
        r = await c.post(ECHO, content=body)
        text = (await c.get("/metrics")).text
    message = r.json()["error"]
    assert r.status_code == 413
    assert metric(text, "treeguard_invalid_inputs_total", model="echo", reason="size") >= 1
    assert message.startswith("the body's JSON would cost about ")
    assert f"for a body of {len(body)} bytes" in message and '"a"' not in message


# One fork per body: ``ru_maxrss`` is a high-water mark, and importing JAX
# leaves it far above what the process holds, so a child, once it has its
# imports, a server's warm-up and one request behind it, forks for each body it
# is sent (a forked process's mark starts at what it holds), and the fork reads
# the body from a file (one allocation of its size) before the mark. The
# server's limit on a response's size refuses every request once its inputs
# are decoded, so no batch runs in a fork; "json" parses the body as plain
# JSON instead (what the bound is for). "touch" probes how the same forks
# count memory: it writes each page of a fresh anonymous mapping of the size
# given once (``tests/machine.py`` fits the line through two sizes).
_CHILD = """
import asyncio, json, mmap, os, resource, sys
from pathlib import Path
root, here = sys.argv[1:3]
sys.path.insert(0, here)
from echomodel import URL, echo_server
from treeguard import LeafSpec
server = echo_server(Path(root), {"x": LeafSpec(("B", 256), "float32")}, (1,),
                     max_request_bytes=1 << 26, max_response_bytes=1)
app = server.app()
loop = asyncio.new_event_loop()
loop.run_until_complete(app.router.lifespan_context(app).__aenter__())


def post(body):  # one ASGI call, the body in one message, as the app's server gives it
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": URL, "raw_path": URL.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80), "headers": [(b"content-length", b"%d" % len(body))]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    loop.run_until_complete(app(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])["error"]


small = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256], "data": ['
assert post(small + b"0," * 255 + b"0]}]}" + b" " * (64 << 10))[0] == 413
print("ready", flush=True)
for line in sys.stdin:
    mode, arg = line.split()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        continue
    if mode != "touch":
        with open(arg, "rb") as f:
            body = f.read()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if mode == "touch":
        pages = mmap.mmap(-1, int(arg))
        for at in range(0, int(arg), mmap.PAGESIZE):
            pages[at] = 1
        verdict = "touched"
    elif mode == "json":
        json.loads(body)
        verdict = "decoded"
    else:
        status, error = post(body)
        verdict = "decoded" if error.startswith("the response would take up to") else str(status)
    cost = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(verdict, cost, flush=True)
    os._exit(0)
os._exit(0)  # the batcher's thread keeps no exit waiting
"""


def _line(proc) -> str:
    """The child's next line, within a bound only a hung child reaches."""
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready, "the child said nothing for 120 s"
    return proc.stdout.readline()


#: How many bytes of junk a body refused for its cost carries: about as many
#: as the float body's 4 MiB, so that the overhead a bound allows for is small
#: against the 4x it bounds.
JUNK_BYTES = 4 << 20
#: The smallest body that takes the bounded parse and is decoded (the child's
#: warm-up): what it costs is the fixed overhead of a request.
SMALLEST = _body(b"0," * 255 + b"0", 1) + b" " * (64 << 10)


def _sized_body(item: bytes, count: int, junk: bytes = b"", junk_bytes: int = JUNK_BYTES) -> bytes:
    """A body of ``count`` elements ``item`` in rows of 256, and with
    ``junk``, a list of ``junk_bytes`` of it after the inputs."""
    rows = count // 256
    body = _body(item * (rows * 256 - 1) + item.rstrip(b","), rows)
    if junk:
        body = body[:-1] + b', "j": [' + junk * (junk_bytes // len(junk)) + b"0]}"
    return body


class Costs:
    """What bodies cost in the child (``of``: its verdict and bytes of peak
    memory), and what a bound on those costs takes from the same child,
    measured once: ``line``, how its forks' ``ru_maxrss`` grows per byte
    touched (``machine.peak_rss_line``), and ``overhead``, what ``SMALLEST``
    costs there.

    The overhead is a request's, not the probe's offset: a fork maps again
    the code that it runs (``machine.PeakRssLine``), and a request runs more
    of it than the probe does. In 40 runs on the 2-core CPU box the probe read
    a slope of 0.996 to 1.004 and an offset of -0.16 to 0.03 MB, and
    ``SMALLEST`` cost 2.23 to 2.36 MB, nearly all of it code mapped again
    (``RssFile`` in ``/proc/self/status``); a 4 MiB body of floats maps no
    more code than that, and a refused one less.
    """

    def __init__(self, proc, folder: Path) -> None:
        self.proc, self.folder = proc, folder
        self.line = peak_rss_line(lambda n: self._ask("touch", str(n))[1])
        verdict, self.overhead = self.of(SMALLEST)
        assert verdict == "decoded", verdict

    def __str__(self) -> str:
        return f"the child's {self.line}; a request's overhead: {self.overhead / 1e6:.2f} MB"

    def _ask(self, mode: str, arg: str) -> tuple[str, int]:
        self.proc.stdin.write(f"{mode} {arg}\n")
        self.proc.stdin.flush()
        verdict, spent = _line(self.proc).split()
        return verdict, int(spent)

    def of(self, body: bytes, mode: str = "server") -> tuple[str, int]:
        """The verdict on ``body`` ("decoded" or a status) and its cost."""
        path = self.folder / "body.json"
        path.write_bytes(body)
        return self._ask(mode, str(path))

    def body(self, item: bytes, count: int, junk: bytes = b"") -> bytes:
        """``_sized_body(item, count, junk)``, its elements and junk made
        larger by the least power of two that makes the float body of
        ``1 << 20`` elements (4 MiB) at least twice the overhead: where a
        request's overhead is large (10.5 MB under the TPU machine's gVisor,
        2.3 MB on the CPU box, whose bodies stay as they are) the bodies
        grow with it, so that the bound still binds."""
        scale = 1
        while 4 * (1 << 20) * scale < 2 * self.overhead:
            scale *= 2
        return _sized_body(item, count * scale, junk, JUNK_BYTES * scale)

    def bound(self, size: int) -> int:
        """What a body of ``size`` bytes may cost: 4x its size beyond the overhead."""
        return 4 * size + self.overhead

    def needs_a_bound_that_binds(self, size: int) -> None:
        """Skips the calling test, saying why, where ``ru_maxrss`` counts a
        byte other than once, or where the overhead is more than twice
        ``size`` (half of the 4x): the bound would then allow more than 6x
        the body, too near what parsing it whole costs for the bound to tell
        the two apart (measured: float data 11x, a list of ``0`` 8.7x)."""
        needs_peak_rss_counted_once(self.line)
        if self.overhead > 2 * size:
            pytest.skip(
                f"{self}, more than twice the body's {size / 1e6:.2f} MB, so that a bound "
                "of 4x its size beyond the overhead would allow more than 6x it"
            )


@pytest.fixture(scope="module")
def costs(tmp_path_factory):
    """The child that measures costs (``Costs``), one for the file."""
    folder = tmp_path_factory.mktemp("costs")
    proc = start_python(_CHILD, str(folder / "s"), str(Path(__file__).parent), stdin=True)
    try:
        assert _line(proc) == "ready\n", stop(proc)[1][-3000:]
        yield Costs(proc, folder)
    finally:
        stop(proc)  # closes its stdin: it ends


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
def test_a_body_costs_at_most_4x_its_size_in_memory(costs, item, count, junk, verdict):
    body = costs.body(item, count, junk)
    costs.needs_a_bound_that_binds(len(body))
    got, cost = costs.of(body)
    assert got == verdict
    print(f"{verdict}: a body of {len(body)} bytes cost {cost} bytes ({costs})")
    assert cost <= costs.bound(len(body)), (cost, len(body), str(costs))


#: The most a request's fixed overhead may cost in the child: 2.3 MB on the
#: CPU box, 10.5 MB under the TPU machine's gVisor. The bodies grow with the
#: overhead (``Costs.body``), so a fixed allocation added to every request
#: would loosen the bounds above rather than fail them: this fails it.
MOST_OVERHEAD = 16 << 20


def test_a_request_s_fixed_overhead_is_bounded(costs):
    needs_peak_rss_counted_once(costs.line)
    assert costs.overhead <= MOST_OVERHEAD, str(costs)


def test_float_data_parsed_whole_costs_more_than_4x_its_size(costs):
    # what the bound is for: the same body parsed as plain JSON, over the
    # bound the test above holds the server to, its overhead allowed for
    body = costs.body(b"0.5,", 1 << 20)
    costs.needs_a_bound_that_binds(len(body))
    got, cost = costs.of(body, mode="json")
    print(f"parsed whole: a body of {len(body)} bytes cost {cost} bytes ({costs})")
    assert got == "decoded" and cost > costs.bound(len(body)), (cost, len(body), str(costs))


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


async def test_a_data_list_of_many_chunks_decodes_as_the_whole_parse_decodes_it(tmp_path):
    # lists of several 256 KiB chunks of text (the bounded parse turns a list into
    # numbers a chunk at a time), cut at commas into pieces
    rng = np.random.default_rng(0)
    rows = 60_000
    floats = rng.normal(size=2 * rows).tolist()
    floats[7] = 0  # written -0 below: an integer, so 0.0
    ints = rng.integers(0, 2**63 - 1, size=2 * rows).tolist()
    ints[-1] = 2**64 - 1  # past int64, in the last piece
    inputs = {"f": LeafSpec(("B", 2), "float64"), "u": LeafSpec(("B", 2), "uint64")}
    limits = {"max_request_bytes": 1 << 24, "max_rows": rows}
    server = echo_server(tmp_path / "s", inputs, (rows,), **limits)
    body = json.dumps({
        "inputs": [
            {"name": "f", "datatype": "FP64", "shape": [rows, 2], "data": floats},
            {"name": "u", "datatype": "UINT64", "shape": [rows, 2], "data": ints},
        ],
        "parameters": {"binary_data_output": True},
    }).encode().replace(b", 0, ", b", -0, ", 1)  # fmt: skip
    assert b", -0, " in body
    async with posting(server) as c:
        r = await c.post(ECHO, content=body)
    assert r.status_code == 200, r.text
    f, u = _binary_outputs(r, {"f": np.float64, "u": np.uint64})
    # what json.loads makes of the body: the values above, the -0 an integer 0
    assert f.tobytes() == np.array(floats, np.float64).tobytes()
    assert u.tobytes() == np.array(ints, np.uint64).tobytes()
