"""What a recorded jitted step costs the host once it runs: one compiled
program (the check inside it), nothing compiled again, and nothing copied
from the host to the device on any step, whichever ``check``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import treeguard as tg

from . import nanmodels as nm


def _compiles(caplog: pytest.LogCaptureFixture, run: Callable[[], Any]) -> list[str]:
    """The XLA compilations that ``run`` makes."""
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        run()
    return [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]


def _plain(tmp_path: Path, check: Any) -> tuple[tg.RecordedStep, list[Any], Any]:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        params = {"w": params["w"] - 0.1 * batch["x"], "b": params["b"] * 0.5}
        return params, state + 1.0, jnp.sum(params["w"] ** 2)

    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(step, check=check)
    return train, [{"w": jnp.ones((4, 4)), "b": jnp.ones(4)}, jnp.zeros(())], {"x": jnp.ones(4)}


def _optax(tmp_path: Path, check: Any) -> tuple[tg.RecordedStep, list[Any], Any]:
    recorder = tg.FlightRecorder(tmp_path, batch="digest")
    train = recorder.wrap(tg.optax_step(optax.adam(1e-3)), loss=nm.tiny_loss, check=check)
    params = {"w": jnp.ones(3)}
    return train, [params, train.init(params)], {"x": jnp.array([1.0, 4.0, 9.0])}


@pytest.mark.parametrize("check", ["now", "next"])
@pytest.mark.parametrize("make", [_plain, _optax], ids=["jitted-function", "optax_step"])
def test_a_recorded_step_is_one_program_and_moves_nothing_to_the_device_once_warm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Any, check: Any
) -> None:
    train, side, batch = make(tmp_path, check)

    def steps(n: int) -> None:
        for _ in range(n):
            side[0], side[1], loss = train(side[0], side[1], batch)
            float(loss)  # a loop that logs its loss
        train.flush()

    # the step, its check and the loss carrying the flag: one program (with
    # check="next", beside the tiny one that makes the run's first mark where the
    # step's program will put the marks it returns)
    assert len(_compiles(caplog, lambda: steps(1))) == (2 if check == "next" else 1)
    with jax.transfer_guard_host_to_device("disallow"):
        assert _compiles(caplog, lambda: steps(20)) == []
        # the guard is on: a batch on the host is refused
        with pytest.raises(Exception, match="host-to-device"):
            train(side[0], side[1], jax.tree.map(np.asarray, batch))
    assert train.step_number == 21
