"""What the bundled examples share: the data of their splits check (``ROWS``
rows drawn from one seed, cut into disjoint train, val and test splits) and
the check of a batch of feature rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

#: The rows of every example's data.
ROWS = 96
#: The disjoint splits those rows are cut into.
CUTS = {"train": slice(0, 64), "val": slice(64, 80), "test": slice(80, 96)}


def uniform(
    seed: int, shape: tuple[int, ...], *, low: float = -1.0, high: float = 1.0
) -> np.ndarray:
    """``ROWS`` float32 rows of ``shape``, uniform in ``[low, high)``, drawn from ``seed``.

    Example:
      >>> x = uniform(0, (2,))
      >>> x.shape, x.dtype.name, bool((x >= -1.0).all() and (x < 1.0).all())
      ((96, 2), 'float32', True)
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    return rng.uniform(low, high, (ROWS, *shape)).astype(np.float32)


def split(**columns: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """The rows of ``columns`` cut into the ``CUTS`` splits, each a dict of the same columns.

    Example:
      >>> parts = split(x=np.arange(ROWS))
      >>> {k: (int(v["x"][0]), len(v["x"])) for k, v in parts.items()}
      {'train': (0, 64), 'val': (64, 16), 'test': (80, 16)}
    """
    return {k: {name: col[s] for name, col in columns.items()} for k, s in CUTS.items()}


def features(batch: Mapping[str, jax.Array], width: int) -> jax.Array:
    """``batch["x"]``, checked to be of shape ``(B, width)``.

    Raises:
      ValueError: if it is not.

    Example:
      >>> features({"x": np.ones((3, 4))}, 2)
      Traceback (most recent call last):
      ...
      ValueError: batch['x'] must have shape (B, 2), got (3, 4)
    """
    x = batch["x"]
    if x.ndim != 2 or x.shape[-1] != width:
        raise ValueError(f"batch['x'] must have shape (B, {width}), got {tuple(x.shape)}")
    return x
