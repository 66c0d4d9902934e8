"""The hand-over of a streamed bucket object's parts: every part in order
while they add up to the object's size; a stream that runs past it or ends
short is an IntegrityError naming the object, its size and what came, and
the part that would run past is never handed over.

A real server's answer never runs past its Content-Length (the client stops
reading there), so these feed the hand-over parts directly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treeguard import IntegrityError
from treeguard._src.store.download import hand_over  # _src: no server sends more than it announces

WHERE = "s3://bucket/store/versions/v000001/data-0123456789abcdef/0.0-8.0-16"


def _taken(parts: list[bytes], size: int) -> tuple[int, list[tuple[int, bytes]]]:
    seen: list[tuple[int, bytes]] = []
    got = hand_over(parts, size, lambda at, part: seen.append((at, bytes(part))), WHERE)
    return got, seen


@given(st.lists(st.binary(max_size=64), max_size=12))
def test_parts_that_add_up_to_the_size_are_handed_over_in_order(parts: list[bytes]) -> None:
    size = sum(len(p) for p in parts)
    got, seen = _taken(parts, size)
    assert got == size
    assert b"".join(p for _, p in seen) == b"".join(parts)
    assert [at for at, _ in seen] == [sum(len(p) for p in parts[:i]) for i in range(len(parts))]


@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=12), st.data())
def test_a_stream_that_runs_past_the_size_is_refused_naming_the_object(
    parts: list[bytes], data: st.DataObject
) -> None:
    size = data.draw(st.integers(0, sum(len(p) for p in parts) - 1))
    seen: list[tuple[int, bytes]] = []
    with pytest.raises(IntegrityError) as e:
        hand_over(parts, size, lambda at, part: seen.append((at, bytes(part))), WHERE)
    text = str(e.value)
    assert text.startswith(f"{WHERE}: the object's stream ran past its {size:,} bytes: "), text
    assert "or more came" in text
    assert sum(len(p) for _, p in seen) <= size  # never a byte past the size handed over


def test_a_stream_that_ends_short_is_refused_naming_the_object() -> None:
    with pytest.raises(IntegrityError) as e:
        _taken([b"ab", b"cd"], 1030)
    assert str(e.value).startswith(
        f"{WHERE}: the object's stream ended after 4 of its 1,030 bytes"
    ), str(e.value)


def test_the_message_names_the_size_and_how_many_bytes_came() -> None:
    with pytest.raises(IntegrityError) as e:
        _taken([b"x" * 1000, b"y" * 30], 1024)
    assert str(e.value).splitlines()[0] == (
        f"{WHERE}: the object's stream ran past its 1,024 bytes: 1,030 or more came"
    )
