"""The regression cases: small batches generated from the batch spec and a seed.

Generation uses numpy's PCG64 generator, not JAX's PRNG, and the cases are
stored with the references, so a stored case never depends on the generator
again. The positive cases are ``standard`` (``batch_size`` examples),
``single`` (one), ``zeros`` and ``boundary`` (every element on the edge of
``bounds``); the negative case ``invalid_shape`` changes one feature axis,
and ``apply`` must refuse it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..leaf import summarize
from ..paths import keystr
from ..spec import LeafSpec, TreeSpec
from ..walk import flatten, structure_of
from .model import BATCH, Model, is_float


@dataclasses.dataclass(frozen=True)
class Case:
    """One named batch.

    Attributes:
      name: ``standard``, ``single``, ``zeros``, ``boundary``, ``invalid_shape``
        or a user-given name.
      batch: the batch (numpy arrays).
      raises: for a negative case, the exception types ``apply`` must
        raise; empty for a positive case.
      note: what the case is, for the report.
    """

    name: str
    batch: Any
    raises: tuple[type[BaseException], ...] = ()
    note: str = ""

    @property
    def negative(self) -> bool:
        return bool(self.raises)

    def summary(self) -> str:
        """The batch's leaves as ``x: f32[8,2], y: f32[8,1]``."""
        parts = []
        leaves, treedef = flatten(self.batch)
        for path, leaf in zip(structure_of(self.batch, treedef).leaf_paths(), leaves):
            a = np.asarray(leaf)
            parts.append(f"{keystr(path) or '<root>'}: {summarize(a.shape, a.dtype)}")
        return ", ".join(parts)


def _shape(leaf: LeafSpec, b: int) -> tuple[int, ...]:
    return tuple(b if d == BATCH else int(d) for d in leaf.shape)


def _fill(
    leaf: LeafSpec,
    shape: tuple[int, ...],
    kind: str,
    rng: np.random.Generator,
    bounds: tuple[float, float],
) -> np.ndarray[Any, Any]:
    lo, hi = bounds
    dt = leaf.dtype
    if kind == "zeros":
        return np.zeros(shape, dt)
    if dt == np.bool_:
        if kind == "boundary":
            return np.asarray(np.arange(int(np.prod(shape))) % 2 == 1).reshape(shape)
        return rng.integers(0, 2, shape).astype(bool)
    if is_float(dt) or dt.kind == "c":
        if kind == "boundary":
            vals = np.where(np.arange(int(np.prod(shape))) % 2 == 0, lo, hi).reshape(shape)
        else:
            vals = rng.uniform(lo, hi, shape)
        if dt.kind == "c":  # both parts within the bounds
            imag = np.flip(vals) if kind == "boundary" else rng.uniform(lo, hi, shape)
            return np.asarray(vals + 1j * imag).astype(dt)
        return np.asarray(vals, np.float32).astype(dt)
    # int4 and uint4 too, which numpy's iinfo does not know
    info = jnp.iinfo(dt)  # type: ignore[no-untyped-call]
    ilo, ihi = max(int(np.ceil(lo)), int(info.min)), min(int(np.floor(hi)), int(info.max))
    if kind == "boundary":
        return np.where(np.arange(int(np.prod(shape))) % 2 == 0, ilo, ihi).reshape(shape).astype(dt)
    return rng.integers(ilo, ihi + 1, shape).astype(dt)


def _batch(
    spec: TreeSpec, b: int, kind: str, rng: np.random.Generator, bounds: tuple[float, float]
) -> Any:
    leaves = [_fill(leaf, _shape(leaf, b), kind, rng, bounds) for leaf in spec.leaves]
    return jax.tree.unflatten(spec.treedef, leaves)


def invalid_shape(
    spec: TreeSpec, b: int, rng: np.random.Generator, bounds: tuple[float, float]
) -> tuple[Any, str]:
    """A batch with one feature axis one wider than the contract says.

    The first leaf with a fixed-size axis gets its last such axis grown by
    one; with no fixed axis anywhere, the first leaf gets an extra axis.

    Returns:
      The batch and a note naming the change.
    """
    leaves = list(spec.leaves)
    target = next((i for i, lf in enumerate(leaves) if any(d != BATCH for d in lf.shape)), 0)
    out = []
    note = ""
    for i, leaf in enumerate(leaves):
        shape = _shape(leaf, b)
        if i == target:
            fixed = [j for j, d in enumerate(leaf.shape) if d != BATCH]
            if fixed:
                j = fixed[-1]
                bad = (*shape[:j], shape[j] + 1, *shape[j + 1 :])
            else:
                bad = (*shape, 2)
            note = (
                f"{leaf.path or '<root>'} is {summarize(bad, leaf.dtype)} where the contract "
                f"says {leaf.summary()}"
            )
            shape = bad
        out.append(_fill(leaf, shape, "standard", rng, bounds))
    return jax.tree.unflatten(spec.treedef, out), note


def generate_cases(model: Model) -> list[Case]:
    """The positive and negative cases of ``model``, deterministically from its seed.

    Args:
      model: the model; its ``batch_spec``, ``seed``, ``batch_size``,
        ``bounds``, ``cases`` and ``invalid_inputs`` are read.

    Returns:
      The cases: the four generated positive ones, the model's extra
      cases, the generated ``invalid_shape`` and the model's invalid inputs.

    Raises:
      ConfigError: if the batch spec cannot be built from plain containers.

    Example:
      >>> import jax.numpy as jnp
      >>> from treeguard import LeafSpec, spec_of
      >>> from treeguard._src.verify.model import Model
      >>> m = Model(init=lambda k: {}, apply=lambda p, b: b["x"], loss=lambda p, b: 0.0,
      ...           batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}), rtol=0, atol=0)
      >>> [(c.name, c.summary()) for c in generate_cases(m)]  # doctest: +NORMALIZE_WHITESPACE
      [('standard', "['x']: f32[8,2]"), ('single', "['x']: f32[1,2]"),
       ('zeros', "['x']: f32[8,2]"), ('boundary', "['x']: f32[8,2]"),
       ('invalid_shape', "['x']: f32[8,3]")]
    """
    rng = np.random.Generator(np.random.PCG64(model.seed))
    spec = model.batch_spec
    try:
        spec.treedef  # noqa: B018 - raises for a spec that cannot be rebuilt
    except Exception as e:
        raise ConfigError(f"Model.batch_spec cannot be built into batches: {e}") from e
    n = model.batch_size
    cases = [
        Case("standard", _batch(spec, n, "standard", rng, model.bounds), note=f"{n} examples"),
        Case("single", _batch(spec, 1, "standard", rng, model.bounds), note="one example"),
        Case("zeros", _batch(spec, n, "zeros", rng, model.bounds), note="every element 0"),
        Case(
            "boundary",
            _batch(spec, n, "boundary", rng, model.bounds),
            note=f"every element on the bounds {model.bounds}",
        ),
    ]
    for name, batch in model.cases.items():
        cases.append(Case(name, batch, note="declared by the model"))
    bad, note = invalid_shape(spec, n, rng, model.bounds)
    cases.append(Case("invalid_shape", bad, tuple(model.invalid_raises), note))
    for inv in model.invalid_inputs:
        assert isinstance(inv.raises, tuple)
        cases.append(Case(inv.name, inv.batch, inv.raises, "declared by the model"))
    return cases
