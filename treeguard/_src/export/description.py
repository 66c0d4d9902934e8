"""What an exported artifact is: the description kept beside its bytes.

An artifact is ``jax.export``'s serialization of one function,
``served(param_leaves, input_leaves) -> outputs``: the model's ``apply``
with its params passed as their leaves (in the params' flatten order) and
the serving spec's inputs as theirs, the batch axis a symbol. So the bytes
hold no weight and no Python: the params come from the version's
checkpoint, as for the Python-model server.

``Description`` is the JSON written beside the bytes (``exported.json``,
whose digest the version's verdict covers): the format, the params' spec
(the structure they are loaded into, without their classes), the serving
spec, the outputs, the tolerance, the platforms, the jax that wrote it and
``jax.export``'s calling convention version. No JAX is needed to read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import FormatError
from ..spec import TreeSpec

#: The description's format; a newer one is refused.
FORMAT = "treeguard.exported/1"


@dataclasses.dataclass(frozen=True)
class Description:
    """An exported artifact's description.

    Attributes:
      model: the model's name.
      params: the params' ``TreeSpec`` (leaves in flatten order, the order
        the function takes them in).
      serving: the ``ServingSpec`` as its dict (``ServingSpec.to_dict``).
      outputs: each output as ``{"path", "shape", "dtype"}`` (the batch axis ``"B"``).
      rtol: the model's relative tolerance.
      atol: its absolute tolerance.
      platforms: the platforms the function was exported for (``cpu``, ``tpu``...).
      jax: the jax version that wrote it.
      calling_convention: ``jax.export``'s calling convention version.
      validated: the cases the export was checked on against the live model.
      batches: the batch size of each part of the artifact, for a function
        exported once per bucket; empty for one part with a symbolic batch axis.
      parts: the bytes of each part, in order (they are concatenated);
        empty for one part.

    Example:
      >>> from treeguard import LeafSpec, spec_of
      >>> d = Description("m", spec_of({"w": LeafSpec((2,), "float32")}), {}, [], 1e-6, 1e-6,
      ...                 ("cpu",), "0.10.2", 10, ("standard",))
      >>> Description.from_dict(d.to_dict()) == d
      True
    """

    model: str
    params: TreeSpec
    serving: dict[str, Any]
    outputs: list[dict[str, Any]]
    rtol: float
    atol: float
    platforms: tuple[str, ...]
    jax: str
    calling_convention: int
    validated: tuple[str, ...]
    batches: tuple[int, ...] = ()
    parts: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The description as JSON values."""
        return {
            "format": FORMAT,
            "model": self.model,
            "params": self.params.to_dict(),
            "serving": self.serving,
            "outputs": self.outputs,
            "rtol": self.rtol,
            "atol": self.atol,
            "platforms": list(self.platforms),
            "jax": self.jax,
            "calling_convention": self.calling_convention,
            "validated": list(self.validated),
            "batches": list(self.batches),
            "parts": list(self.parts),
        }

    @classmethod
    def from_dict(cls, data: Any, *, context: str | None = None) -> Description:
        """Reads a description, each field's type checked.

        Raises:
          FormatError: for another format or a field of the wrong type, naming it.
        """

        def bad(why: str) -> FormatError:
            return FormatError(
                f"the exported artifact's description: {why}",
                context=context,
                hint="export the version again with this treeguard",
            )

        if not isinstance(data, dict):
            raise bad("not an object")
        if data.get("format") != FORMAT:
            raise bad(f"format {str(data.get('format'))[:40]!r}, this treeguard reads {FORMAT}")
        kinds: dict[str, tuple[type, ...]] = {
            "model": (str,),
            "params": (dict,),
            "serving": (dict,),
            "outputs": (list,),
            "rtol": (float, int),
            "atol": (float, int),
            "platforms": (list,),
            "jax": (str,),
            "calling_convention": (int,),
            "validated": (list,),
            "batches": (list,),
            "parts": (list,),
        }
        for key, kind in kinds.items():
            if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
                raise bad(f"{key} is {type(data.get(key)).__name__}, not {kind[0].__name__}")
        if not all(isinstance(p, str) for p in data["platforms"]) or not data["platforms"]:
            raise bad("platforms is not a list of names")
        for key in ("batches", "parts"):
            if not all(type(n) is int and n > 0 for n in data[key]):
                raise bad(f"{key} is not a list of positive integers")
        if data["parts"] and len(data["parts"]) != max(len(data["batches"]), 1):
            raise bad(f"{len(data['parts'])} parts for {len(data['batches'])} batch sizes")
        try:
            params = TreeSpec.from_dict(data["params"])
        except (FormatError, ValueError, TypeError) as e:
            raise bad(f"params is no spec ({e})") from e
        return cls(
            model=data["model"],
            params=params,
            serving=data["serving"],
            outputs=data["outputs"],
            rtol=float(data["rtol"]),
            atol=float(data["atol"]),
            platforms=tuple(data["platforms"]),
            jax=data["jax"],
            calling_convention=data["calling_convention"],
            validated=tuple(str(v) for v in data["validated"]),
            batches=tuple(data["batches"]),
            parts=tuple(data["parts"]),
        )
