"""ServingSpec's JSON and validation; bucketing and padding as properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_support import mlp_spec

import treeguard
from treeguard import ConfigError

# internal: the bucket arithmetic under the batcher, tested apart from any server
from treeguard._src.serving.buckets import (  # _src: bucket arithmetic as properties
    admit,
    bucket_for,
    pad_rows,
)
from treeguard.examples import mlp
from treeguard.serving import CompilePolicy, Limits, Overflow, ServingSpec


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


BUCKETS = st.lists(st.integers(1, 512), min_size=1, max_size=8, unique=True).map(
    lambda b: tuple(sorted(b))
)


@settings(max_examples=50)
@given(BUCKETS, st.integers(-3, 600))
def test_smallest_bucket_that_fits(buckets, rows):
    b = bucket_for(rows, buckets)
    fitting = [x for x in buckets if x >= rows] if rows >= 1 else []
    assert b == (min(fitting) if fitting else None)


@settings(max_examples=50)
@given(BUCKETS, st.integers(-3, 2000), st.integers(1, 1500), st.sampled_from(list(Overflow)))
def test_admission_reasons_and_chunks(buckets, rows, max_rows, overflow):
    a = admit(rows, buckets, max_rows=max_rows, overflow=overflow)
    if rows < 1:
        assert a.reason == "empty"
    elif rows > max_rows:
        assert a.reason == "over_max_rows" and str(max_rows) in a.detail
    elif rows > buckets[-1] and overflow is Overflow.REJECT:
        assert a.reason == "over_largest_bucket" and str(buckets[-1]) in a.detail
    else:
        assert a.ok and sum(a.chunks) == rows
        assert all(1 <= c <= buckets[-1] for c in a.chunks)


@settings(max_examples=50)
@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 3))
def test_padding_keeps_rows_and_adds_zeros(rows, extra, cols):
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 1
    p = pad_rows(x, rows + extra)
    assert p.shape == (rows + extra, cols) and p.dtype == x.dtype
    np.testing.assert_array_equal(p[:rows], x)
    assert not p[rows:].any()


def test_padding_refuses_too_many_rows():
    with pytest.raises(ValueError, match="5 rows do not fit the bucket 4"):
        pad_rows(np.zeros((5, 2)), 4)
