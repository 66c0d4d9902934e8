"""Whether a stored artifact can run here: this jax and this platform.

``jax.export`` keeps a calling convention version with each artifact and
reads those between ``minimum_supported_calling_convention_version`` and
``maximum_supported_calling_convention_version`` (jax's stated window:
artifacts from releases up to six months older load). An artifact outside
it, one exported for platforms that do not include this process's, or one
whose bytes jax cannot read is refused with an ``ArtifactError`` naming
both sides: the jax (or platform) that wrote it and the one here.
"""

from __future__ import annotations

import re
from typing import Any

import jax

from ..errors import ArtifactError
from ..hashing.engine import digest
from .description import Description


def here() -> str:
    """This process's platform as ``jax.export`` names it (``cpu``, ``tpu``, ``cuda``...)."""
    from jax import export  # lazy: only a server of an artifact imports jax.export

    return str(export.default_export_platform())


def window() -> tuple[int, int]:
    """The calling convention versions this jax reads."""
    from jax import export  # lazy: only a server of an artifact imports jax.export

    return (
        int(export.minimum_supported_calling_convention_version),
        int(export.maximum_supported_calling_convention_version),
    )


def check_servable(description: Description, version: str) -> None:
    """Refuses an artifact this jax or this platform cannot run.

    Args:
      description: the artifact's description.
      version: the store's version it belongs to (for the message).

    Raises:
      ArtifactError: ``jax`` when its calling convention is outside this
        jax's window; ``platform`` when it was exported for other
        platforms; each naming what the artifact says and what runs here.

    Example:
      >>> from treeguard import LeafSpec, spec_of
      >>> d = Description("m", spec_of({"w": LeafSpec((2,), "float32")}), {}, [], 1e-6, 1e-6,
      ...                 ("cpu",), "0.4.1", 1, ())
      >>> check_servable(d, "v000001")
      Traceback (most recent call last):
      ...
      treeguard.ArtifactError: version v000001's exported artifact was written by jax 0.4.1 ...
    """
    low, high = window()
    conv = description.calling_convention
    if not low <= conv <= high:
        raise ArtifactError(
            f"version {version}'s exported artifact was written by jax {description.jax} "
            f"(calling convention {conv}), outside the window of jax {jax.__version__} here "
            f"(calling conventions {low} to {high})",
            version=version,
            field="jax",
            hint=f"export the version again with jax {jax.__version__} (treeguard export "
            f"MODULE:ATTR --store STORE {version} on a new version), or serve it with a jax "
            f"whose window holds {conv}",
        )
    platform = here()
    if platform not in description.platforms:
        raise ArtifactError(
            f"version {version}'s exported artifact was exported for "
            f"{', '.join(description.platforms)}, and this process runs on {platform}",
            version=version,
            field="platform",
            hint=f"export it for {platform} too: treeguard export MODULE:ATTR --store STORE "
            f"VERSION --platform {platform} (on a new version), or serve it on "
            f"{description.platforms[0]}",
        )


#: Source locations in a module's text: where the Python that traced it stood,
#: which differs between two exports of one function.
_LOCATIONS = re.compile(r"^#loc\d*\s*=.*$|\s*loc\((?:[^()]|\([^()]*\))*\)", re.MULTILINE)


def function_of(table: dict[int | None, Any]) -> str:
    """What an artifact computes, apart from where it was traced: each
    part's batch size and StableHLO module's text without source locations,
    hashed. Two exports of one function with params of one structure give
    the same."""
    text = "\n".join(
        f"{key}:{_LOCATIONS.sub('', str(exported.mlir_module()))}"
        for key, exported in table.items()
    )
    return digest(text.encode("utf-8"), "blake3")


def deserialize(blob: bytes, description: Description, version: str) -> dict[int | None, Any]:
    """The artifact's ``jax.export.Exported`` parts, read by this jax.

    Returns:
      Each part by its batch size (``None`` for the one symbolic part).

    Raises:
      ArtifactError: ``jax`` when this jax cannot read the bytes; ``digest``
        when they say another calling convention or platforms than the
        description, or do not split into its parts.
    """
    from jax import export  # lazy: only a server of an artifact imports jax.export

    sizes = description.parts or (len(blob),)
    keys: list[int | None] = list(description.batches) or [None]
    if sum(sizes) != len(blob) or len(sizes) != len(keys):
        raise ArtifactError(
            f"version {version}'s exported artifact holds {len(blob)} bytes, and its "
            f"description {len(sizes)} parts of {sum(sizes)}",
            version=version,
            field="digest",
            hint="do not serve it; export the version again",
        )
    table: dict[int | None, Any] = {}
    start = 0
    for key, size in zip(keys, sizes):
        part = blob[start : start + size]
        start += size
        try:
            exported = export.deserialize(bytearray(part))
        except Exception as e:  # whatever jax cannot read is refused
            raise ArtifactError(
                f"version {version}'s exported artifact, written by jax {description.jax}, "
                f"cannot be read by jax {jax.__version__} here: {type(e).__name__}",
                version=version,
                field="jax",
                hint=f"export the version again with jax {jax.__version__}",
            ) from e
        said = (int(exported.calling_convention_version), tuple(exported.platforms))
        if said != (description.calling_convention, description.platforms):
            raise ArtifactError(
                f"version {version}'s exported artifact says calling convention {said[0]} for "
                f"{', '.join(said[1])}, its description {description.calling_convention} for "
                f"{', '.join(description.platforms)}",
                version=version,
                field="digest",
                hint="do not serve it; export the version again",
            )
        table[key] = exported
    return table
