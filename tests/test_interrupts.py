"""Ctrl-C held over steps that must run whole. Each test sends a real SIGINT to this process, handled by a handler of its own (it
raises ``Stop``, so nothing reaches pytest as a ``KeyboardInterrupt``)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from treeguard._src import interrupts  # _src: the mechanism under the store's put


class Stop(Exception):
    """What this module's SIGINT handler raises."""


@pytest.fixture
def handled() -> Iterator[list[int]]:
    """A SIGINT handler that counts its calls and raises ``Stop``, for the
    test's length (tests run on the main thread, where handlers run)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run on the main thread only")
    calls: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)
        raise Stop

    before = signal.signal(signal.SIGINT, stop)
    try:
        yield calls
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_a_section_is_raised_once_after_it(handled: list[int]) -> None:
    ran = []
    with pytest.raises(Stop), interrupts.deferred():
        signal.raise_signal(signal.SIGINT)
        ran.append("after the first")
        signal.raise_signal(signal.SIGINT)
        ran.append("after the second")
    assert ran == ["after the first", "after the second"]
    assert handled == [signal.SIGINT]  # held twice, handed on once


def test_a_section_without_ctrl_c_leaves_the_handler_as_it_was(handled: list[int]) -> None:
    before = signal.getsignal(signal.SIGINT)
    with interrupts.deferred():
        assert signal.getsignal(signal.SIGINT) is not before  # the holder meanwhile
    assert signal.getsignal(signal.SIGINT) is before
    assert handled == []
    with pytest.raises(Stop):
        signal.raise_signal(signal.SIGINT)  # handled at once again


def test_an_inner_section_hands_what_it_held_to_the_outer_one(handled: list[int]) -> None:
    ran = []
    with pytest.raises(Stop), interrupts.deferred():
        with interrupts.deferred():
            signal.raise_signal(signal.SIGINT)
        ran.append("the outer section's rest")
    assert ran == ["the outer section's rest"]
    assert handled == [signal.SIGINT]


def test_ctrl_c_held_while_a_section_fails_is_raised_over_its_error(handled: list[int]) -> None:
    with pytest.raises(Stop) as raised, interrupts.deferred():
        signal.raise_signal(signal.SIGINT)
        raise OSError("the section's own failure")
    assert isinstance(raised.value.__context__, OSError)


def test_a_section_leaves_an_ignored_ctrl_c_ignored(handled: list[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts.deferred():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert handled == []


def test_a_section_off_the_main_thread_runs_plainly(handled: list[int]) -> None:
    ran: list[Any] = []

    def section() -> None:
        try:
            with interrupts.deferred():  # signal.signal would raise ValueError here
                ran.append(signal.getsignal(signal.SIGINT))
        except BaseException as e:  # pragma: no cover - the failure this test looks for
            ran.append(e)

    thread = threading.Thread(target=section)
    thread.start()
    thread.join()
    assert ran == [signal.getsignal(signal.SIGINT)]
