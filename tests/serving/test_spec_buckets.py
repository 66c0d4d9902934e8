"""ServingSpec's JSON and validation; bucketing, admission and padding as a server runs them."""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from serving_support import mlp_spec, put_verified

import treeguard
from treeguard import ConfigError, LeafSpec, spec_of
from treeguard.examples import mlp
from treeguard.serving import (
    CompilePolicy,
    InferRequest,
    InvalidRequestError,
    Limits,
    Overflow,
    RawInput,
    Server,
    ServingSpec,
)
from treeguard.verify import Model


def test_json_round_trip(tmp_path):
    spec = mlp_spec(overflow="split", compile_policy="warn", limits=Limits(max_rows=100))
    assert spec.overflow is Overflow.SPLIT and spec.compile_policy is CompilePolicy.WARN
    spec.save(tmp_path / "s.json")
    back = ServingSpec.load(tmp_path / "s.json")
    assert back == spec
    assert json.loads(spec.to_json())["format"] == "treeguard.serving/1"


def test_default_spec_takes_every_batch_input_and_power_of_two_buckets():
    spec = ServingSpec.from_model(mlp.model)
    assert spec.input_paths == ["['x']", "['y']"]
    assert spec.buckets == (1, 2, 4, 8, 16, 32, 64)
    assert spec.inputs["['x']"].shape == ("B", 2)


def _doc(**change):
    d = json.loads(mlp_spec().to_json())
    d.update(change)
    return json.dumps(d)


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        (_doc(extra=1), treeguard.FormatError, "unknown field(s) ['extra']"),
        (_doc(format="treeguard.serving/2"), treeguard.FormatError, "not 'treeguard.serving/1'"),
        (_doc(buckets=[4, 2]), ConfigError, "buckets [4, 2] are not strictly increasing"),
        (_doc(buckets=[0, 2]), ConfigError, "bucket 0 is not an int from 1 to 65536"),
        (_doc(buckets=[1.5]), ConfigError, "bucket 1.5 is not an int"),
        (_doc(buckets="1,2"), treeguard.FormatError, "'buckets' is a str, not list"),
        (
            _doc(overflow="truncate"),
            ConfigError,
            "overflow is 'truncate'\nhint: one of reject, split",
        ),
        (_doc(compile_policy="maybe"), ConfigError, "hint: one of forbid, warn, allow"),
        (_doc(limits={"max_rows": -1}), ConfigError, "limits.max_rows is -1"),
        (_doc(limits={"max_delay_ms": 1e9}), ConfigError, "limits.max_delay_ms is 1000000000.0"),
        (_doc(limits={"speed": 1}), treeguard.FormatError, "limits has unknown field(s) ['speed']"),
        (_doc(name="a b"), ConfigError, "name 'a b'"),
        (
            '{"format": "treeguard.serving/1", "format": "x"}',
            treeguard.FormatError,
            "the key 'format' appears twice",
        ),
        ('{"format": NaN}', treeguard.FormatError, "NaN is not a JSON number"),
        ("[" * 100_000, treeguard.FormatError, "nests deeper than 512 levels"),
    ],
)
def test_strict_reading(text, kind, message):
    with pytest.raises(kind) as e:
        ServingSpec.from_json(text)
    assert message in str(e.value)


def test_inputs_must_come_from_the_batch_spec_with_the_batch_axis_first():
    with pytest.raises(ConfigError, match=r"input \['z'\] is not in the model's batch spec"):
        ServingSpec.from_model(mlp.model, inputs=["['z']"])
    bad = treeguard.spec_of({"x": treeguard.LeafSpec((2, "B"), "float32")})
    with pytest.raises(ConfigError, match=r"input \['x'\]: shape f32\[2,B\] has no batch axis"):
        ServingSpec(inputs=bad)


# -- buckets, admission and padding, as a server runs them --------------------------
#
# A probe model reports, for each row, the size of the batch it ran in (its bucket)
# and the sums of each input over that whole batch: padding with anything but zero
# rows shows in the sums, a wrong bucket in the sizes. Every row count up to past
# max_rows is sent to each server, so every bucket boundary is crossed.


def _probe(p: Any, batch: Any) -> dict[str, Any]:
    x, n = batch["x"], batch["n"]
    size = x.shape[0]
    return {
        "x": x * p["one"],
        "n": n,
        "bucket": jnp.full((size,), size, jnp.int32),
        "x_sum": jnp.broadcast_to(jnp.sum(x), (size,)),
        "n_sum": jnp.broadcast_to(jnp.sum(n.astype(jnp.int32)), (size,)),
    }


PROBE = Model(
    init=lambda key: {"one": np.ones((), np.float32)},
    apply=_probe,
    loss=lambda p, b: jnp.zeros(()),
    batch_spec=spec_of({"x": LeafSpec(("B", 3), "float32"), "n": LeafSpec(("B",), "int8")}),
    rtol=0.0,
    atol=0.0,
    name="probe",
)


@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    store = treeguard.ArtifactStore(tmp_path_factory.mktemp("probe") / "s")
    store.promote(put_verified(store, {"one": np.ones((), np.float32)}))
    return store


def _smallest_fitting(rows: int, buckets: tuple[int, ...]) -> int:
    return min(b for b in buckets if b >= rows)


def _rows(rows: int) -> InferRequest:
    x = np.arange(3 * rows, dtype=np.float32).reshape(rows, 3) + 1  # no zero anywhere
    n = (np.arange(rows) % 100 + 1).astype(np.int8)
    return InferRequest([
        RawInput("x", "FP32", [rows, 3], x.ravel().tolist()),
        RawInput("n", "INT8", [rows], n.tolist()),
    ])  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("buckets", "max_rows", "overflow"),
    [
        ((3, 5, 6, 16), 40, "split"),
        ((2, 7), 12, "reject"),
        ((4,), 3, "reject"),  # max_rows under the largest bucket
    ],
)
async def test_each_row_count_runs_in_the_smallest_bucket_padded_with_zeros_or_is_refused(
    probe_store, buckets, max_rows, overflow
):
    spec = ServingSpec(
        inputs=PROBE.batch_spec,
        buckets=buckets,
        overflow=overflow,
        limits=Limits(max_rows=max_rows),
        name="probe",
    )
    server = Server(PROBE, probe_store, spec=spec)
    server.start()
    largest = buckets[-1]
    async with server.running():
        for rows in range(max_rows + 3):
            req = _rows(rows)
            x, n = (np.array(i.data).reshape(i.shape) for i in req.inputs)
            try:
                out = {o.name: o.array for o in (await server.infer(req, "probe")).outputs}
            except InvalidRequestError as e:
                refused = (e.status, e.reason, str(e).split(";")[0])
            else:
                refused = None
            if rows < 1:
                assert refused == (422, "size", "the request has 0 rows")
            elif rows > max_rows:
                assert refused == (
                    413, "size", f"the request has {rows} rows, over the limit of {max_rows}"
                )  # fmt: skip
            elif rows > largest and overflow == "reject":
                assert refused == (
                    413,
                    "size",
                    f"the request has {rows} rows, over the largest batch bucket {largest}",
                )
            else:
                assert refused is None, (rows, refused)
                np.testing.assert_array_equal(out["x"], x)  # every row kept, in order
                np.testing.assert_array_equal(out["n"], n)
                # split into chunks of the largest bucket, the rest in the smallest that fits
                full, rest = divmod(rows, largest)
                chunks = [largest] * full + ([rest] if rest else [])
                assert out["bucket"].tolist() == [
                    _smallest_fitting(c, buckets) for c in chunks for _ in range(c)
                ]
                # each batch's sums are its own rows' sums: what padded it was zeros
                at, x_sums, n_sums = 0, [], []
                for c in chunks:
                    x_sums += [x[at : at + c].sum()] * c
                    n_sums += [int(n[at : at + c].astype(np.int32).sum())] * c
                    at += c
                np.testing.assert_array_equal(out["x_sum"], np.array(x_sums, np.float32))
                assert out["n_sum"].tolist() == n_sums
