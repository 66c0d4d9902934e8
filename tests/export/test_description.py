"""An artifact's description is read strictly: what it wrote reads back, and
any JSON value in any field is either read or refused as a ``FormatError``
naming the field."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

import treeguard
from treeguard.export import Description

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


def _good() -> dict[str, Any]:
    spec = treeguard.spec_of({"w": treeguard.LeafSpec((2, 3), "float32")})
    return Description(
        "m",
        spec,
        {},
        [{"path": "", "shape": ["B", "1"], "dtype": "float32"}],
        1e-6,
        0.0,
        ("cpu", "tpu"),
        "0.10.2",
        10,
        ("standard",),
    ).to_dict()


def test_a_description_reads_back_as_written():
    assert Description.from_dict(_good()).to_dict() == _good()


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(sorted(_good())), value=JSON)
def test_any_value_in_any_field_is_read_or_refused_naming_it(field, value):
    data = _good() | {field: value}
    try:
        Description.from_dict(data)
    except treeguard.FormatError as e:
        assert "exported artifact's description" in str(e)
