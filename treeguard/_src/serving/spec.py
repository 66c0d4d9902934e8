"""``ServingSpec``: what a server accepts, and how it batches and compiles.

A spec holds the request inputs (a sub-spec of the model's ``batch_spec``
with the batch axis ``"B"``), the batch buckets, the limits on requests and
the queue, what happens to a request over the largest bucket, and whether a
compile after warm-up is allowed. It round-trips through JSON with
``"format": "treeguard.serving/1"``; reading is strict (unknown or duplicate
keys, wrong types and out-of-range numbers are refused, naming the field).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from .. import strictjson
from ..errors import ConfigError, FormatError
from ..paths import parse
from ..spec import LeafSpec, TreeSpec, spec_of
from ..verify.model import BATCH, Model

FORMAT = "treeguard.serving/1"
#: The default batch buckets: powers of two up to 64.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: No bucket may exceed this many rows.
MAX_BUCKET = 1 << 16
_MAX_SPEC_BYTES = 1 << 20


class Overflow(enum.Enum):
    """What happens to a request with more rows than the largest bucket."""

    REJECT = "reject"
    """Refuse it with 413, naming the largest bucket."""

    SPLIT = "split"
    """Run it as several batches on the same params and join the outputs.
    A request is never truncated."""


class CompilePolicy(enum.Enum):
    """What a compile after warm-up does (every bucket is compiled at warm-up,
    so a later compile means an input or params of an unplanned signature)."""

    FORBID = "forbid"
    """Fail the request with 503, count it and log why; the watchdog rolls back."""

    WARN = "warn"
    """Serve the request, count the compile and log why."""

    ALLOW = "allow"
    """Serve the request and count the compile."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on one request and on the queue.

    Attributes:
      max_request_bytes: the largest request body; checked before the body
        is read whole.
      max_rows: the most rows (batch entries) one request may hold.
      max_queue: the most requests waiting; one more gets 429.
      max_delay_ms: how long the batcher waits to gather a batch.
      timeout_s: how long a decoded request may wait in the batcher's queue;
        one not taken into a batch by then is answered 504 and never run.
      header_timeout_s: how long a connection may take to send a request's
        headers (a slow client is cut off).
      body_timeout_s: how long a request's body may take to arrive, from
        the first time its request waits for more of it.
      max_connections: the most open connections; one more is answered 503
        and closed.
      max_bodies: the most request bodies being waited for at once; one
        more is answered 503 (a body already whole when its request runs
        is never waited for).
      max_response_bytes: the largest response a request may ask for, its
        tensors' bytes on the wire (JSON counted at its widest); a request
        asking for more is refused with 413 before it runs.

    Example:
      >>> Limits(max_rows=8).max_rows
      8
    """

    max_request_bytes: int = 1 << 20
    max_rows: int = 256
    max_queue: int = 1024
    max_delay_ms: float = 2.0
    timeout_s: float = 10.0
    header_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    max_connections: int = 256
    max_bodies: int = 64
    max_response_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in (
            "max_request_bytes",
            "max_rows",
            "max_queue",
            "max_connections",
            "max_bodies",
            "max_response_bytes",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 40:
                raise ConfigError(f"limits.{name} is {v!r}", hint="an int from 1 to 2**40")
        for name, hi in (
            ("max_delay_ms", 10_000.0),
            ("timeout_s", 3600.0),
            ("header_timeout_s", 3600.0),
            ("body_timeout_s", 3600.0),
        ):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or not 0 <= v <= hi
            ):
                raise ConfigError(f"limits.{name} is {v!r}", hint=f"a number from 0 to {hi:g}")
        for name in ("timeout_s", "header_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"limits.{name} is 0", hint="a positive number of seconds")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ServingSpec:
    """The serving contract of one model.

    Attributes:
      inputs: the request inputs, a ``TreeSpec`` whose every leaf has the
        batch axis ``"B"`` first and fixed sizes elsewhere.
      buckets: the batch sizes compiled at warm-up, increasing.
      limits: the ``Limits``.
      overflow: ``Overflow.REJECT`` or ``Overflow.SPLIT``.
      compile_policy: ``CompilePolicy.FORBID``, ``WARN`` or ``ALLOW``.
      name: the model name in URLs and metrics.
      bounds: the input domain ``(low, high)`` every numeric input value must
        lie in (a request outside it is refused with 422), or None. Within
        declared bounds, a NaN or Inf output is the version's fault and
        counts against it; see ``WatchdogPolicy``.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> spec = ServingSpec.from_model(model, inputs=["['x']"], name="mlp")
      >>> spec.buckets, [leaf.path for leaf in spec.inputs.leaves]
      ((1, 2, 4, 8, 16, 32, 64), ["['x']"])
      >>> ServingSpec.from_json(spec.to_json()) == spec
      True
    """

    inputs: TreeSpec
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    limits: Limits = dataclasses.field(default_factory=Limits)
    overflow: Overflow = Overflow.REJECT
    compile_policy: CompilePolicy = CompilePolicy.FORBID
    name: str = "model"
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.bounds is not None:
            bounds = self.bounds
            if (
                not isinstance(bounds, (tuple, list))
                or len(bounds) != 2
                or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in bounds
                )
                or not bounds[0] < bounds[1]
            ):
                raise ConfigError(f"bounds is {bounds!r}", hint="two finite numbers, low < high")
            object.__setattr__(self, "bounds", (float(bounds[0]), float(bounds[1])))
        if not isinstance(self.inputs, TreeSpec):
            raise ConfigError(f"inputs is a {type(self.inputs).__name__}, not a TreeSpec")
        if self.inputs.num_leaves == 0:
            raise ConfigError("inputs has no leaves", hint="name at least one input")
        for leaf in self.inputs.leaves:
            if not leaf.shape or leaf.shape[0] != BATCH:
                raise ConfigError(
                    f"input {leaf.path}: shape {leaf.summary()} has no batch axis {BATCH!r} first",
                    hint=f'write it as ("{BATCH}", ...)',
                )
            if any(isinstance(d, str) for d in leaf.shape[1:]):
                raise ConfigError(
                    f"input {leaf.path}: shape {leaf.summary()} has a symbol besides the batch "
                    "axis",
                    hint="give every other dimension a size",
                )
        buckets = tuple(self.buckets)
        if not buckets:
            raise ConfigError("buckets is empty", hint="e.g. [1, 2, 4, 8]")
        for b in buckets:
            if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BUCKET:
                raise ConfigError(f"bucket {b!r} is not an int from 1 to {MAX_BUCKET}")
        if list(buckets) != sorted(set(buckets)):
            raise ConfigError(f"buckets {list(buckets)} are not strictly increasing")
        object.__setattr__(self, "buckets", buckets)
        if not isinstance(self.limits, Limits):
            raise ConfigError(f"limits is a {type(self.limits).__name__}, not Limits")
        object.__setattr__(self, "overflow", _enum(Overflow, self.overflow, "overflow"))
        object.__setattr__(
            self, "compile_policy", _enum(CompilePolicy, self.compile_policy, "compile_policy")
        )
        if (
            not isinstance(self.name, str)
            or not 1 <= len(self.name) <= 64
            or not all(c.isalnum() or c in "._-" for c in self.name)
        ):
            raise ConfigError(
                f"name {self.name!r}: 1-64 letters, digits, '.', '_' or '-' "
                "(it appears in URLs and metric labels)"
            )

    # -- building ------------------------------------------------------------

    @classmethod
    def from_model(
        cls, model: Model, /, *, inputs: Sequence[str] | None = None, **options: Any
    ) -> ServingSpec:
        """A spec whose inputs are the named leaves of ``model.batch_spec``.

        Args:
          model: the ``treeguard.verify.Model``.
          inputs: key paths of the batch leaves a request carries (``"['x']"``);
            None for every leaf.
          **options: the other fields (``buckets``, ``limits``, ...).

        Returns:
          The spec.

        Raises:
          ConfigError: naming a path that is not in the batch spec, or a
            batch spec that is not a tree of dicts.
        """
        leaves = {leaf.path: leaf for leaf in model.batch_spec.leaves}
        chosen = list(leaves) if inputs is None else list(inputs)
        template: dict[Any, Any] = {}
        for path in chosen:
            if path not in leaves:
                raise ConfigError(
                    f"input {path} is not in the model's batch spec",
                    hint=f"one of {', '.join(leaves)}",
                )
            entries = parse(path)
            if not entries or any(kind != "key" for kind, _ in entries):
                raise ConfigError(
                    f"input {path}: only paths of dict keys can be served",
                    hint="make the batch a dict of arrays",
                )
            node = template
            for _, key in entries[:-1]:
                node = node.setdefault(key, {})
            leaf = leaves[path]
            node[entries[-1][1]] = LeafSpec(leaf.shape, leaf.dtype)
        options.setdefault("name", _default_name(model.name))
        return cls(inputs=spec_of(template), **options)

    # -- derived -------------------------------------------------------------

    @property
    def largest(self) -> int:
        """The largest bucket."""
        return self.buckets[-1]

    @property
    def input_paths(self) -> list[str]:
        """Every input's key path, in flatten order."""
        return [leaf.path for leaf in self.inputs.leaves]

    def row_bytes(self) -> int:
        """The bytes one row of every input takes."""
        return sum(
            math.prod(int(d) for d in leaf.shape[1:]) * leaf.dtype.itemsize
            for leaf in self.inputs.leaves
        )

    # -- JSON ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return {
            "format": FORMAT,
            "name": self.name,
            "inputs": self.inputs.to_dict(),
            "buckets": list(self.buckets),
            "limits": dataclasses.asdict(self.limits),
            "overflow": self.overflow.value,
            "compile_policy": self.compile_policy.value,
            "bounds": None if self.bounds is None else list(self.bounds),
        }

    def to_json(self) -> str:
        """The spec as JSON text."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ServingSpec):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes) -> ServingSpec:
        """Reads a spec strictly.

        Raises:
          FormatError: for text that is not a ``treeguard.serving/1`` spec,
            naming the field.
          ConfigError: for a field of the right type and a bad value.
        """
        if len(text) > _MAX_SPEC_BYTES:
            raise FormatError(f"serving spec is larger than {_MAX_SPEC_BYTES} bytes")
        return cls.from_dict(strictjson.loads(text, "the serving spec"))

    @classmethod
    def from_dict(cls, data: Any) -> ServingSpec:
        """Reads the form ``to_dict`` writes (see ``from_json``)."""
        if not isinstance(data, dict):
            raise FormatError(f"serving spec is a JSON {type(data).__name__}, not an object")
        if data.get("format") != FORMAT:
            raise FormatError(
                f"serving spec format is {str(data.get('format'))[:40]!r}, not {FORMAT!r}",
                hint="write it with ServingSpec.save",
            )
        allowed = {
            "format",
            "name",
            "inputs",
            "buckets",
            "limits",
            "overflow",
            "compile_policy",
            "bounds",
        }
        extra = sorted(set(data) - allowed)
        if extra:
            raise FormatError(
                f"serving spec has unknown field(s) {extra}; allowed: {sorted(allowed)}"
            )
        if "inputs" not in data:
            raise FormatError("serving spec has no field 'inputs'")
        kwargs: dict[str, Any] = {"inputs": TreeSpec.from_dict(data["inputs"])}
        if "name" in data:
            kwargs["name"] = _typed(data["name"], str, "name")
        if "buckets" in data:
            kwargs["buckets"] = tuple(_typed(data["buckets"], list, "buckets"))
        if "limits" in data:
            limits = _typed(data["limits"], dict, "limits")
            names = {f.name for f in dataclasses.fields(Limits)}
            unknown = sorted(set(limits) - names)
            if unknown:
                raise FormatError(f"serving spec limits has unknown field(s) {unknown}")
            kwargs["limits"] = Limits(**limits)
        if data.get("bounds") is not None:
            kwargs["bounds"] = tuple(_typed(data["bounds"], list, "bounds"))
        for name in ("overflow", "compile_policy"):
            if name in data:
                kwargs[name] = _typed(data[name], str, name)
        return cls(**kwargs)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the spec as JSON."""
        path = os.fspath(path)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServingSpec:
        """Reads a spec written by ``save`` (see ``from_json``)."""
        with open(path, "rb") as f:
            raw = f.read(_MAX_SPEC_BYTES + 1)
        return cls.from_json(raw)


def _enum(kind: type[enum.Enum], value: Any, field: str) -> Any:
    if isinstance(value, kind):
        return value
    for member in kind:
        if member.value == value:
            return member
    raise ConfigError(
        f"{field} is {str(value)[:40]!r}", hint=f"one of {', '.join(m.value for m in kind)}"
    )


def _typed(value: Any, kind: type, field: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise FormatError(
            f"serving spec field {field!r} is a {type(value).__name__}, not {kind.__name__}"
        )
    return value


def _default_name(name: str) -> str:
    module, _, attr = name.rpartition(":")
    base = module.rsplit(".", 1)[-1] if module else attr.rsplit(".", 1)[-1]
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in base)[:64]
    return cleaned or "model"
