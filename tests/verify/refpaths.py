"""Where references recorded on a backend go, as the verify guide states it:
the declared file for the CPU, beside it under the backend's name for another
(``mlp.regression.safetensors`` -> ``mlp.regression.tpu.safetensors``)."""

from __future__ import annotations

import os
from pathlib import Path


def references_of(declared: str | os.PathLike[str], backend: str) -> Path:
    path = Path(declared)
    return path if backend == "cpu" else path.with_name(f"{path.stem}.{backend}{path.suffix}")
