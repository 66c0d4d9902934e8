"""The model's release checks: what a version must pass, with the model in
hand, before its verdict may be recorded, and the structure it is loaded into.

``release_checks(model)`` are the checks ``treeguard store verify STORE V
--model MODULE:ATTR`` hands to ``ArtifactStore.verify``: ``model.contract``
(the params match the model's stored params spec, when it declares one),
``model.finite`` (no NaN or Inf in the params) and ``model.outputs``
(``apply`` gives finite outputs on the model's generated positive cases and
its stored reference batches). A verdict whose checks hold none of these was
recorded with no model check; ``verdicts.model_checks`` says which it ran, and
``treeguard serve`` refuses such a version unless ``--allow-unchecked``.
``verify_version`` is that verify, the one the command line and Python share.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np

from ..diff import check
from ..nonfinite import host_all_finite
from ..spec import LeafSpec, spec_of
from ..verify.cases import generate_cases
from ..verify.model import Model
from ..verify.refs import load_references
from .verdicts import PREFIX

log = logging.getLogger("treeguard.serving")


def params_like(model: Model) -> Any:
    """The structure every version of ``model`` is loaded into, so equinox
    modules, ``nnx.State`` and any registered node come back with their types.

    Returns:
      The model's declared params spec, in the structure traced from
      ``model.init`` (a spec read back from its JSON names nnx and equinox
      nodes but cannot rebuild them); without a declared spec, the traced
      structure and dtypes with every size left free (a model that pins no
      params contract may change its widths between versions); the declared
      spec as read when ``init`` cannot be traced or its key paths differ;
      else None (plain containers).

    Example:
      >>> from treeguard.examples import eqx_mlp
      >>> like = params_like(eqx_mlp.model)
      >>> like.leaves[0].dtype.name, len(like.leaves[0].shape)
      ('float32', 2)
    """
    declared = model.stored_params_spec()
    try:
        shapes = jax.eval_shape(model.init, model.key())
    except Exception as e:  # noqa: BLE001 - a model whose init cannot be traced
        log.warning(
            "the params' structure cannot be taken from init (%s); loading as %s",
            type(e).__name__,
            "the declared params spec" if declared is not None else "plain containers",
        )
        return declared
    traced, treedef = jax.tree.flatten_with_path(shapes)
    if declared is not None:
        # the declared leaves (the contract checked before any array is read)
        # in the traced nodes, when both name the same key paths in one order
        if [lf.path for lf in declared.leaves] != [jax.tree_util.keystr(p) for p, _ in traced]:
            return declared
        return spec_of(jax.tree.unflatten(treedef, list(declared.leaves)))
    free = [
        LeafSpec(tuple(f"_{i}_{j}" for j in range(x.ndim)), x.dtype)
        for i, (_, x) in enumerate(traced)
    ]
    return spec_of(jax.tree.unflatten(treedef, free))


def _batches(model: Model) -> list[tuple[str, Any]]:
    invalid = {"invalid_shape", *(inv.name for inv in model.invalid_inputs)}
    out = [
        (c.name, c.batch) for c in generate_cases(model) if not c.negative and c.name not in invalid
    ]
    if model.references is not None:
        refs = load_references(model.references)
        out += [(f"reference {c.name}", c.batch) for c in refs.cases if c.name in refs.expected]
    return out


def release_checks(model: Model) -> list[tuple[str, Any]]:
    """The model's checks, as ``(name, check)`` pairs for ``ArtifactStore.verify``.

    Example:
      >>> from treeguard.examples import mlp
      >>> [name for name, _ in release_checks(mlp.model)]
      ['model.contract', 'model.finite', 'model.outputs']
    """
    declared = model.stored_params_spec()

    def contract(tree: Any) -> bool:
        if declared is not None:
            check(tree, declared)
        return True

    def finite(tree: Any) -> bool:
        bad = [
            jax.tree_util.keystr(p)
            for p, x in jax.tree.leaves_with_path(tree)
            if not host_all_finite(np.asarray(x))
        ]
        if bad:
            raise ValueError(f"NaN or Inf in {', '.join(bad[:5])}")
        return True

    def outputs(tree: Any) -> bool:
        fn = jax.jit(model.apply)
        for name, batch in _batches(model):
            out = fn(tree, batch)
            for p, x in jax.tree.leaves_with_path(out):
                if not host_all_finite(np.asarray(x)):
                    path = jax.tree_util.keystr(p) or "<root>"
                    raise ValueError(f"output {path} is NaN or Inf on the case {name!r}")
        return True

    return [
        (f"{PREFIX}contract", contract),
        (f"{PREFIX}finite", finite),
        (f"{PREFIX}outputs", outputs),
    ]


def verify_version(store: Any, version: str, /, model: Model, *, like: Any = None) -> Any:
    """Verifies ``version`` with ``model``'s release checks, as ``treeguard
    store verify STORE VERSION --model MODULE:ATTR`` does: ``store.verify``
    with the checks ``model.contract``, ``model.finite`` and
    ``model.outputs``, the version loaded into the model's params structure.
    ``treeguard serve`` (and ``Server(..., allow_unchecked=False)``) takes a
    version only once such a verdict is recorded.

    Args:
      store: the ``ArtifactStore``.
      version: the version.
      model: the ``treeguard.verify.Model`` whose checks run.
      like: the tree or ``TreeSpec`` the version must match; default the
        structure the model's params are loaded into.

    Returns:
      The updated ``VersionInfo``: ``verified``, or ``rejected`` with why.

    Raises:
      UnknownVersionError: for an unknown version.
      StoreError: as ``ArtifactStore.verify`` does.

    Example:
      >>> import tempfile, jax, treeguard
      >>> from treeguard.examples import mlp
      >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
      >>> v = store.put(mlp.init(jax.random.key(0)))
      >>> info = verify_version(store, v, mlp.model)
      >>> info.status, [c.name for c in info.checks if c.name.startswith("model.")]
      ('verified', ['model.contract', 'model.finite', 'model.outputs'])
    """
    spec = params_like(model) if like is None else like
    return store.verify(version, like=spec, checks=release_checks(model))
