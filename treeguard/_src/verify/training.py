"""The ``training`` check: a few steps reduce the loss, and the params, updates
and optimizer state keep their contracts."""

from __future__ import annotations

import numpy as np

from ..diff import mismatches
from ..spec import spec_of
from .context import CheckResult, Context, mismatch_lines, outcome


def check_training(ctx: Context) -> CheckResult:
    """A few training steps reduce the loss on the standard batch; the params,
    the optimizer's updates and the optimizer state keep their contracts."""
    model = ctx.model
    step = ctx.programs.step
    if not ctx.programs.trains:
        return CheckResult("training", "skip", "the model has no update and no optimizer")
    params = ctx.params()
    spec = spec_of(params)
    state = ctx.programs.opt_state()
    state_spec = spec_of(state) if state is not None else None
    batch = ctx.batch(ctx.standard())
    losses: list[float] = []
    bad: list[str] = []
    info: list[str] = []
    if state_spec is not None:
        info.append(
            f"optimizer state: {state_spec.num_leaves} leaves, {state_spec.num_params} values"
        )
    for i in range(1, model.training_steps + 1):
        out = step(params, state, batch)
        losses.append(float(out.loss))
        if out.updates is not None:
            found = mismatches(out.updates, spec)
            bad += mismatch_lines(
                found, f"step {i} updates", "the params", "the optimizer's updates"
            )
            if found:
                break
        params, state = out.params, out.opt_state
        found = mismatches(params, spec)
        bad += mismatch_lines(found, f"step {i} params", "init's params", "the updated params")
        if state_spec is not None:
            found_state = mismatches(state, state_spec)
            bad += mismatch_lines(
                found_state, f"step {i} optimizer state", "the initial state", "the updated state"
            )
            found = found + found_state
        if found:
            break
    if not bad:  # the loss after the last step (the next step's "before")
        losses.append(float(step(params, state, batch).loss))
    trail = " -> ".join(f"{v:.6g}" for v in losses)
    rows = [{"step": i, "loss": v} for i, v in enumerate(losses)]
    if not bad and not (np.isfinite(losses[-1]) and losses[-1] < losses[0]):
        bad.append(
            f"loss went {trail} over {len(losses) - 1} update step(s) on case "
            f"{ctx.standard().name!r}: it did not decrease; hint: check the sign and "
            "the step size of update"
        )
    return outcome(
        "training",
        bad,
        f"loss {losses[0]:.6g} -> {losses[-1]:.6g} over {len(losses) - 1} steps; params "
        + ("and optimizer state keep their specs" if state_spec is not None else "keep their spec"),
        "training does not work",
        evidence=info if bad else [f"loss: {trail}", *info],
        rows=rows,
    )
