"""The ``Model`` contract: what ``treeguard verify`` needs to know about a model."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import jax

from ..bench.budget import Budgets
from ..errors import ConfigError
from ..leaf import dtype_of, is_inexact, resolve_dtype
from ..spec import TreeSpec
from ..tolerance import Tolerance, TolerancePolicy

#: The symbol that names the batch axis in ``Model.batch_spec``.
BATCH = "B"


@dataclasses.dataclass(frozen=True)
class InvalidInput:
    """A batch the model must refuse.

    Attributes:
      name: how the report names it.
      batch: the batch passed to ``apply``.
      raises: the exception type (or types) ``apply`` must raise.

    Example:
      >>> import numpy as np
      >>> InvalidInput("nan_x", {"x": np.full((2, 2), np.nan)}, ValueError).raises
      (<class 'ValueError'>,)
    """

    name: str
    batch: Any
    raises: type[BaseException] | tuple[type[BaseException], ...] = ValueError

    def __post_init__(self) -> None:
        raises = self.raises if isinstance(self.raises, tuple) else (self.raises,)
        for r in raises:
            if not (isinstance(r, type) and issubclass(r, BaseException)):
                raise ConfigError(f"invalid input {self.name!r}: raises={r!r} is no exception type")
        object.__setattr__(self, "raises", raises)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Model:
    """A model described for ``treeguard verify``: pure functions, a batch
    contract with a symbolic batch axis ``"B"``, and explicit tolerances.

    Attributes:
      init: ``init(key) -> params``.
      apply: ``apply(params, batch) -> outputs``; must raise on invalid input.
      loss: ``loss(params, batch) -> scalar``.
      batch_spec: the batch's ``TreeSpec``; axis ``"B"`` is the batch axis.
      rtol: relative tolerance of every numeric comparison.
      atol: absolute tolerance.
      tolerances: per-dtype overrides, ``{"bfloat16": Tolerance(1e-2, 1e-2)}``;
        keys are dtype names or short names (``"bf16"``).
      backend_tolerances: per-backend tolerances, ``{"tpu": Tolerance(1e-2,
        1e-3)}``: the regression check compares at the loosest of ``rtol``/
        ``atol`` and the tolerance of each backend involved (this run's, the
        references'), so a model may accept a TPU's default matmul precision,
        or compare one backend's run with another's references on purpose
        (declared cross-backend tolerances). Keys are backend names
        (``"cpu"``, ``"gpu"``, ``"tpu"``).
      update: optional ``update(params, grads) -> params`` (one optimiser
        step), or, with ``opt_init``, ``update(params, grads, opt_state) ->
        (params, opt_state)``.
      optimizer: optional optimizer with optax's ``init(params)`` and
        ``update(grads, opt_state, params) -> (updates, opt_state)``; the
        updates are added to the params (optax's ``apply_updates``
        convention). Give this or ``update``, not both.
      opt_init: ``opt_init(params) -> opt_state``: the first optimizer
        state for the three-argument ``update``.
      output_spec: optional ``TreeSpec`` of the outputs, with ``"B"``.
      params_spec: optional stored params spec (a ``TreeSpec`` or a JSON
        path); ``init``'s params must still match it.
      references: the regression file (``.safetensors``) recorded on the
        CPU; None for none. References recorded on another backend sit
        beside it, named for the backend (``mlp.regression.tpu.safetensors``);
        a run compares with its own backend's when they exist.
      invalid_inputs: batches ``apply`` must refuse, beyond the generated
        invalid shape.
      invalid_raises: what ``apply`` must raise on the generated invalid shape.
      cases: extra named positive batches, added to the generated ones.
      splits: ``{"train": batch, "val": batch, "test": batch}`` (or a
        callable returning it); examples lie along axis 0.
      seed: seeds ``init``'s key and the generated cases.
      batch_size: the size of the standard, zeros and boundary batches.
      bounds: the input domain ``(low, high)`` of generated float and int
        leaves; the boundary case sits on it.
      key_kind: ``"typed"`` (``jax.random.key``) or ``"legacy"``
        (``jax.random.PRNGKey``): the key ``init`` receives.
      training_steps: how many ``update`` steps the training check takes.
      name: how reports name the model.
      performance: optional ``treeguard.bench.Budgets`` (compile seconds,
        p95, temp bytes) that the ``performance`` check holds the benchmark
        of ``jit(apply)`` to; None skips the check.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from treeguard import LeafSpec, spec_of
      >>> m = Model(init=lambda k: {"w": jnp.ones(2)}, apply=lambda p, b: b["x"] @ p["w"],
      ...           loss=lambda p, b: jnp.mean(b["x"] @ p["w"]),
      ...           batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}), rtol=1e-6, atol=1e-6)
      >>> m.tolerance_for(jnp.float32)
      Tolerance(rtol=1e-06, atol=1e-06)
    """

    init: Callable[[jax.Array], Any]
    apply: Callable[[Any, Any], Any]
    loss: Callable[[Any, Any], Any]
    batch_spec: TreeSpec
    rtol: float
    atol: float
    tolerances: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)
    backend_tolerances: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)
    update: Callable[..., Any] | None = None
    optimizer: Any = None
    opt_init: Callable[[Any], Any] | None = None
    output_spec: TreeSpec | None = None
    params_spec: TreeSpec | str | os.PathLike[str] | None = None
    references: str | os.PathLike[str] | None = None
    invalid_inputs: Sequence[InvalidInput] = ()
    invalid_raises: tuple[type[BaseException], ...] = (ValueError,)
    cases: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    splits: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None
    seed: int = 0
    batch_size: int = 8
    bounds: tuple[float, float] = (-1.0, 1.0)
    key_kind: Literal["typed", "legacy"] = "typed"
    training_steps: int = 5
    name: str = "model"
    performance: Budgets | None = None

    def __post_init__(self) -> None:
        if self.performance is not None and not isinstance(self.performance, Budgets):
            raise ConfigError(
                f"Model.performance is {self.performance!r}; hint: use "
                "treeguard.bench.Budgets(compile_s=..., p95_s=..., temp_bytes=...)"
            )
        _check_functions(self)
        _check_batch_spec(self)
        _check_tolerances(self)
        _check_settings(self)

    # -- derived ------------------------------------------------------------

    @property
    def trains(self) -> bool:
        """Whether the model can take a training step (``update`` or ``optimizer``)."""
        return self.update is not None or self.optimizer is not None

    def key(self) -> jax.Array:
        """A fresh key for ``init``, of the declared kind, from ``seed``."""
        if self.key_kind == "legacy":
            return jax.random.PRNGKey(self.seed)
        return jax.random.key(self.seed)

    @property
    def tolerance_policy(self) -> TolerancePolicy:
        """The declared tolerances as the one policy every comparison uses:
        ``rtol``/``atol`` for a float leaf, a per-dtype override where one is
        declared, integer, boolean and key leaves compared exactly."""
        return TolerancePolicy(
            default=Tolerance(self.rtol, self.atol), dtypes=dict(self.tolerances)
        )

    def regression_policy(self, backends: Iterable[str | None]) -> TolerancePolicy:
        """The policy the regression check compares with when ``backends``
        (this run's and the references') are involved: ``tolerance_policy``
        with its default widened to each declared ``backend_tolerances``
        entry of those backends.

        Example:
          >>> import jax.numpy as jnp
          >>> from treeguard.examples.mlp import model
          >>> m = dataclasses.replace(model, backend_tolerances={"tpu": Tolerance(1e-2, 1e-3)})
          >>> m.regression_policy(["cpu", "tpu"]).for_leaf("", jnp.float32)
          Tolerance(rtol=0.01, atol=0.001)
          >>> m.regression_policy(["cpu"]).for_leaf("", jnp.float32) == m.tolerance_for(jnp.float32)
          True
        """
        rtol, atol = float(self.rtol), float(self.atol)
        for b in dict.fromkeys(backends):
            t = self.backend_tolerances.get(b) if b is not None else None
            if t is not None:
                rtol, atol = max(rtol, float(t.rtol)), max(atol, float(t.atol))
        return TolerancePolicy(default=Tolerance(rtol, atol), dtypes=dict(self.tolerances))

    def declares_backend(self, backend: str | None) -> bool:
        """Whether ``backend_tolerances`` names ``backend``."""
        return backend is not None and backend in self.backend_tolerances

    def tolerance_for(self, dtype: Any) -> Tolerance:
        """The tolerance for leaves of ``dtype`` (see ``tolerance_policy``)."""
        return self.tolerance_policy.for_leaf("", dtype)

    def tolerance_table(self) -> dict[str, dict[str, float]]:
        """Every declared tolerance, for the report: ``default`` and each dtype."""
        out = {"default": {"rtol": float(self.rtol), "atol": float(self.atol)}}
        for k, v in sorted(self.tolerances.items()):
            out[resolve_dtype(k).name] = {"rtol": float(v.rtol), "atol": float(v.atol)}
        for k, v in sorted(self.backend_tolerances.items()):
            out[f"backend {k}"] = {"rtol": float(v.rtol), "atol": float(v.atol)}
        return out

    def stored_params_spec(self) -> TreeSpec | None:
        """The stored params spec, read from its file when a path was given.

        Raises:
          ConfigError: if the file is missing or not a spec.
        """
        if self.params_spec is None or isinstance(self.params_spec, TreeSpec):
            return self.params_spec
        path = Path(self.params_spec)
        try:
            return TreeSpec.load(path)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"Model.params_spec {path}: {e}; hint: write it with "
                "spec_of(params).save(path), or pass params_spec=None"
            ) from e

    def split_data(self) -> Mapping[str, Any] | None:
        """The train/val/test data, calling ``splits`` when it is a function."""
        if self.splits is None:
            return None
        data = self.splits() if callable(self.splits) else self.splits
        if not isinstance(data, Mapping):
            raise ConfigError(f"Model.splits gave a {type(data).__name__}, not a mapping of splits")
        return data


def is_float(dtype: Any) -> bool:
    """Whether a dtype is a real floating type (bfloat16 and float8 included)."""
    dt = dtype_of(dtype)
    return is_inexact(dt) and dt.kind != "c"


def _check_functions(self: Model) -> None:
    """Refuses functions and an optimizer not given in a form a Model takes."""
    for attr in ("init", "apply", "loss"):
        if not callable(getattr(self, attr)):
            raise ConfigError(f"Model.{attr} is {getattr(self, attr)!r}, not a function")
    if self.update is not None and not callable(self.update):
        raise ConfigError(f"Model.update is {self.update!r}, not a function")
    if self.optimizer is not None:
        if not (
            callable(getattr(self.optimizer, "init", None))
            and callable(getattr(self.optimizer, "update", None))
        ):
            raise ConfigError(
                f"Model.optimizer is a {type(self.optimizer).__name__} without init and "
                "update; hint: pass an optax.GradientTransformation, e.g. optax.adam(1e-3)"
            )
        if self.update is not None or self.opt_init is not None:
            raise ConfigError(
                "Model has both optimizer= and update=/opt_init=; hint: give optimizer= "
                "alone, or update(params, grads, opt_state) with opt_init="
            )
    if self.opt_init is not None and (not callable(self.opt_init) or self.update is None):
        raise ConfigError(
            "Model.opt_init needs a function and update(params, grads, opt_state) -> "
            "(params, opt_state); hint: pass both, or optimizer= for an optax optimizer"
        )


def _check_batch_spec(self: Model) -> None:
    """Refuses a batch spec that is no TreeSpec or has a symbol besides ``B``."""
    if not isinstance(self.batch_spec, TreeSpec):
        raise ConfigError(
            f"Model.batch_spec is a {type(self.batch_spec).__name__}, not a TreeSpec; "
            'hint: spec_of({"x": LeafSpec(("B", 2), "float32")})'
        )
    if BATCH not in self.batch_spec.symbols:
        raise ConfigError(
            f"Model.batch_spec {self.batch_spec!r} has no batch axis {BATCH!r}; "
            'hint: write the batch dimension as "B", e.g. LeafSpec(("B", 2), "float32")'
        )
    if self.batch_spec.symbols - {BATCH}:
        raise ConfigError(
            f"Model.batch_spec uses symbols {sorted(self.batch_spec.symbols - {BATCH})} "
            f"besides {BATCH!r}; hint: give every other dimension a size"
        )


def _check_tolerances(self: Model) -> None:
    """Refuses a tolerance that is no Tolerance, or keyed by no dtype or backend."""
    Tolerance(self.rtol, self.atol)
    for k, v in self.tolerances.items():
        if not isinstance(v, Tolerance):
            raise ConfigError(f"Model.tolerances[{k!r}] is {v!r}; hint: use Tolerance(rtol, atol)")
        resolve_dtype(k)
    for k, v in self.backend_tolerances.items():
        if not isinstance(k, str) or not k.isidentifier() or k != k.lower():
            raise ConfigError(
                f"Model.backend_tolerances has the key {k!r}; hint: name a backend as "
                'jax.default_backend() does: "cpu", "gpu" or "tpu"'
            )
        if not isinstance(v, Tolerance):
            raise ConfigError(
                f"Model.backend_tolerances[{k!r}] is {v!r}; hint: use Tolerance(rtol, atol)"
            )


def _check_settings(self: Model) -> None:
    """Refuses an output spec, batch size, bounds, key kind, step count or
    invalid input out of range."""
    if self.output_spec is not None and not isinstance(self.output_spec, TreeSpec):
        raise ConfigError(
            f"Model.output_spec is a {type(self.output_spec).__name__}, not a TreeSpec"
        )
    if not isinstance(self.batch_size, int) or self.batch_size < 2:
        raise ConfigError(f"Model.batch_size is {self.batch_size!r}", hint="use an int >= 2")
    lo, hi = self.bounds
    if not lo < hi:
        raise ConfigError(f"Model.bounds {self.bounds!r}: low must be below high")
    if self.key_kind not in ("typed", "legacy"):
        raise ConfigError(f'Model.key_kind is {self.key_kind!r}; hint: "typed" or "legacy"')
    if not isinstance(self.training_steps, int) or self.training_steps < 1:
        raise ConfigError(f"Model.training_steps is {self.training_steps!r}", hint="an int >= 1")
    for inv in self.invalid_inputs:
        if not isinstance(inv, InvalidInput):
            raise ConfigError(f"Model.invalid_inputs holds {inv!r}; hint: use InvalidInput(...)")
