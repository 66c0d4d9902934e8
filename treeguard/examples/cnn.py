"""A small flax.nnx CNN (3,658 parameters), described for ``treeguard verify``
and trained with optax's adam.

The module is ``CNN``: two 3x3 convolutions, each followed by ReLU and 2x2
average pooling, then two linear layers, on 8x8 one-channel images with 10
classes. ``treeguard verify`` needs pure functions of a params tree, so the
module is split once into its graph (``GRAPHDEF``, static) and its
``nnx.Param`` state: ``init`` builds a fresh module and returns the params,
``apply`` merges them back with ``nnx.merge``.

Run it with ``treeguard verify treeguard.examples.cnn:model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from treeguard import LeafSpec, spec_of
from treeguard.examples._common import split, uniform
from treeguard.verify import Model

SIDE, CLASSES = 8, 10


class CNN(nnx.Module):
    """Conv(1->8) -> pool -> Conv(8->16) -> pool -> Linear(64->32) -> Linear(32->10)."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), rngs=rngs)
        self.linear1 = nnx.Linear(16 * (SIDE // 4) ** 2, 32, rngs=rngs)
        self.linear2 = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        pool = {"window_shape": (2, 2), "strides": (2, 2)}
        x = nnx.avg_pool(nnx.relu(self.conv1(x)), **pool)  # type: ignore[no-untyped-call]
        x = nnx.avg_pool(nnx.relu(self.conv2(x)), **pool)  # type: ignore[no-untyped-call]
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


#: The module's static graph; the params travel apart from it.
GRAPHDEF, _ = nnx.split(nnx.eval_shape(lambda: CNN(rngs=nnx.Rngs(0))), nnx.Param)


def init(key: jax.Array) -> Any:
    """A fresh module's ``nnx.Param`` state (an ``nnx.State``).

    Example:
      >>> params = jax.eval_shape(init, jax.random.key(0))  # shapes only, nothing compiled
      >>> sum(x.size for x in jax.tree.leaves(params))
      3658
    """
    _graphdef, params = nnx.split(CNN(rngs=nnx.Rngs(params=key)), nnx.Param)
    return params


def apply(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Logits ``(B, 10)`` for ``batch["image"]`` of shape ``(B, 8, 8, 1)``.

    Raises:
      ValueError: if the image is not ``(B, 8, 8, 1)``.
    """
    x = batch["image"]
    if x.ndim != 4 or tuple(x.shape[1:]) != (SIDE, SIDE, 1):
        raise ValueError(f"batch['image'] must be (B, {SIDE}, {SIDE}, 1), got {tuple(x.shape)}")
    module: Any = nnx.merge(GRAPHDEF, params)
    out: jax.Array = module(x)
    return out


def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean softmax cross-entropy against the integer ``batch["label"]``."""
    logits = apply(params, batch)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    out: jax.Array = losses.mean()
    return out


def splits() -> dict[str, dict[str, np.ndarray]]:
    """Disjoint train/val/test images; the label is the brightest row.

    Example:
      >>> {k: v["image"].shape for k, v in splits().items()}
      {'train': (64, 8, 8, 1), 'val': (16, 8, 8, 1), 'test': (16, 8, 8, 1)}
    """
    image = uniform(7, (SIDE, SIDE, 1), low=0.0)
    return split(image=image, label=image[..., 0].sum(axis=2).argmax(axis=1).astype(np.int32))


DATA = Path(__file__).parent / "data"

model = Model(
    init=init,
    apply=apply,
    loss=loss,
    optimizer=optax.adam(1e-2),
    batch_spec=spec_of(
        {"image": LeafSpec(("B", SIDE, SIDE, 1), "float32"), "label": LeafSpec(("B",), "int32")}
    ),
    output_spec=spec_of(LeafSpec(("B", CLASSES), "float32")),
    references=DATA / "cnn.regression.safetensors",
    rtol=1e-4,
    atol=1e-5,
    bounds=(0.0, 9.0),
    splits=splits,
    name="treeguard.examples.cnn:model",
)
