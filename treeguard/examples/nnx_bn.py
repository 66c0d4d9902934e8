"""A flax.nnx MLP with BatchNorm, described for ``treeguard verify``: a model
whose state is more than ``nnx.Param``.

``nnx.BatchNorm`` keeps its running mean and variance as ``nnx.BatchStat``
variables, not ``nnx.Param``. Splitting the module with ``nnx.Param`` alone
leaves them out (flax refuses it: "Non-exhaustive filters"), and dropping
them would serve a model whose normalisation is lost. So the tree treeguard
checks, saves, stores and serves is the module's whole state,
``nnx.split(module)``: an ``nnx.State`` holding both kinds, each leaf at its
key path (``['bn']['mean']`` beside ``['linear1']['kernel']``).

``apply`` normalises with the running statistics (inference);
``loss`` with the batch's own (training), so its gradient with respect to
the running statistics is zero and an optimizer step leaves them as they
are. A training loop updates them by running the merged module in training
mode and taking its state again (``nnx.state(module)``).

Run it with ``treeguard verify treeguard.examples.nnx_bn:model``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from treeguard import LeafSpec, spec_of
from treeguard.examples._common import features, split, uniform
from treeguard.verify import Model

IN, WIDTH, OUT = 4, 16, 3


class BNMLP(nnx.Module):
    """Linear(4->16) -> BatchNorm -> ReLU -> Linear(16->3)."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(IN, WIDTH, rngs=rngs)
        self.bn = nnx.BatchNorm(WIDTH, rngs=rngs)
        self.linear2 = nnx.Linear(WIDTH, OUT, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        h = self.bn(self.linear1(x), use_running_average=not train)
        out: jax.Array = self.linear2(nnx.relu(h))
        return out


#: The module's static graph; its whole state (Param and BatchStat) travels apart.
GRAPHDEF, _ = nnx.split(nnx.eval_shape(lambda: BNMLP(rngs=nnx.Rngs(0))))


def init(key: jax.Array) -> Any:
    """A fresh module's whole state: its ``nnx.Param`` and its ``nnx.BatchStat``.

    Example:
      >>> state = jax.eval_shape(init, jax.random.key(0))  # shapes only, nothing compiled
      >>> sorted(state["bn"].keys())
      ['bias', 'mean', 'scale', 'var']
      >>> type(state["bn"]["mean"]).__name__, type(state["bn"]["scale"]).__name__
      ('BatchStat', 'Param')
    """
    _graphdef, state = nnx.split(BNMLP(rngs=nnx.Rngs(params=key)))
    return state


def apply(state: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Logits ``(B, 3)`` for ``batch["x"]`` of shape ``(B, 4)``, normalised
    with the running statistics.

    Raises:
      ValueError: if ``x`` is not ``(B, 4)``.
    """
    module: Any = nnx.merge(GRAPHDEF, state)
    out: jax.Array = module(features(batch, IN))
    return out


def loss(state: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean softmax cross-entropy against the integer ``batch["label"]``, with
    the batch's own statistics (training mode)."""
    module: Any = nnx.merge(GRAPHDEF, state)
    logits = module(features(batch, IN), train=True)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    out: jax.Array = losses.mean()
    return out


def splits() -> dict[str, dict[str, np.ndarray]]:
    """Disjoint train/val/test data; the label is the largest of the first three inputs.

    Example:
      >>> {k: v["x"].shape for k, v in splits().items()}
      {'train': (64, 4), 'val': (16, 4), 'test': (16, 4)}
    """
    x = uniform(11, (IN,))
    return split(x=x, label=x[:, :OUT].argmax(axis=1).astype(np.int32))


model = Model(
    init=init,
    apply=apply,
    loss=loss,
    optimizer=optax.adam(1e-2),
    batch_spec=spec_of({"x": LeafSpec(("B", IN), "float32"), "label": LeafSpec(("B",), "int32")}),
    output_spec=spec_of(LeafSpec(("B", OUT), "float32")),
    rtol=1e-4,
    atol=1e-5,
    splits=splits,
    name="treeguard.examples.nnx_bn:model",
)
