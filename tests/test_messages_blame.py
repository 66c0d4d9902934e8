"""Pinned messages of errors that must blame the right thing: the type, the
leaf or key it concerns, and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest

import treeguard as tg

BIG = 10**5000  # more digits than Python will turn into text


def _raises(kind: type[BaseException], fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(kind) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_a_5000_digit_int_key_is_named_not_a_bare_value_error(tmp_path: Path) -> None:
    spec = tg.spec_of({"a": {BIG: jnp.ones(2)}})
    assert repr(spec) == "TreeSpec(['a'][<int of 5001 digits>]: f32[2])"
    assert _raises(tg.InvalidTreeError, spec.to_json) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['a']: key <int of 5001 digits> is too long for a spec to read back\n"
        "hint: use str keys, or int keys of at most 20 digits"
    )
    assert _raises(tg.TreeMismatchError, tg.check, {"a": {BIG: jnp.ones(3)}}, spec) == (
        "1 mismatch between the tree and the spec:\n"
        "  ['a'][<int of 5001 digits>]: shape (2,) in the spec, (3,) in the tree\n"
        "hint: an array of another shape would be broadcast or mis-assigned; fix it where it "
        "is built"
    )
    message = _raises(tg.InvalidTreeError, tg.save, tmp_path / "a.safetensors", {BIG: jnp.ones(2)})
    assert message.startswith(
        "1 invalid leaf or node in the tree:\n"
        "  <root>: key of 5001 digits is too long to read back from a spec\n"
    )


def test_a_5000_digit_int_in_metadata_is_a_type_error_naming_it(tmp_path: Path) -> None:
    message = _raises(
        TypeError,
        tg.save,
        tmp_path / "a.safetensors",
        {"w": jnp.ones(2)},
        metadata={"a": [1, {"b": BIG}]},
    )
    assert message == (
        "metadata['a'][1]['b']: an integer of 5001 digits is too long to read back\n"
        "hint: metadata holds JSON values only: str, finite numbers, bool, None, lists, dicts"
    )
