"""Ctrl-C held over steps that must run whole, and waits for a thread's
work that Ctrl-C ends without leaving the future's lock held. Each test
sends a real SIGINT to this process, handled by a handler of its own (it
raises ``Stop``, so nothing reaches pytest as a ``KeyboardInterrupt``)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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


def test_ctrl_c_while_a_thread_s_work_is_awaited_ends_the_wait_and_frees_its_lock(
    handled: list[int],
) -> None:
    """Ctrl-C as soon as the wait has taken the future's lock (CPython's
    ``Condition`` takes it in Python code, so an interrupt can land just
    after): the wait ends with it, and the lock is free, so the thread ends
    the future (a plain ``future.result()`` leaves the lock held there, and
    the thread waits for it forever)."""
    go = threading.Event()
    sent = []

    def after_a_lock_is_taken(frame: FrameType, event: str, arg: Any) -> None:
        in_condition = (
            frame.f_code.co_name == "__enter__" and "threading" in frame.f_code.co_filename
        )
        if event == "c_return" and in_condition and not sent:
            sent.append(frame.f_code.co_filename)
            signal.raise_signal(signal.SIGINT)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(go.wait, 60)  # a safety stop: a thread that waits forever
        sys.setprofile(after_a_lock_is_taken)
        try:
            with pytest.raises(Stop):
                interrupts.result(future)
        finally:
            sys.setprofile(None)
        assert sent  # Ctrl-C came as the lock was taken
        go.set()
        assert interrupts.result(future) is True  # the thread ended the future
    assert handled == [signal.SIGINT]


def test_ctrl_c_ends_a_wait_for_a_thread_that_does_not_end(handled: list[int]) -> None:
    """Ctrl-C as ``result`` starts to block (a ``Condition``'s wait) ends
    the wait, though the thread goes on."""
    go = threading.Event()

    def as_it_blocks(frame: FrameType, event: str, arg: Any) -> None:
        if (
            event == "call"
            and frame.f_code.co_name == "wait"
            and "threading" in frame.f_code.co_filename
        ):
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(go.wait, 60)  # a safety stop: a thread that waits forever
        sys.setprofile(as_it_blocks)
        try:
            with pytest.raises(Stop):
                interrupts.result(future)
        finally:
            sys.setprofile(None)
        assert not future.done()
        go.set()
    assert handled == [signal.SIGINT]


def test_a_thread_s_error_is_raised_by_result_and_returned_by_error() -> None:
    with ThreadPoolExecutor(1) as pool:
        failed = pool.submit(int, "x")
        with pytest.raises(ValueError, match="invalid literal"):
            interrupts.result(failed)
        assert isinstance(interrupts.error(failed), ValueError)
        assert interrupts.error(pool.submit(int, "7")) is None
