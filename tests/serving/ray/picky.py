"""The bundled MLP, made picky on purpose: in a process whose pid is listed
in the file ``$TREEGUARD_PICKY_PIDS``, its params contract is one no version
meets, so a version checked there fails its contract check. It stands for a
replica whose model code or environment differs from the rest of the fleet.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from treeguard import TreeSpec, spec_of
from treeguard.examples import mlp
from treeguard.verify import Model


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class PickyModel(Model):
    def stored_params_spec(self) -> TreeSpec | None:
        listed = Path(os.environ.get("TREEGUARD_PICKY_PIDS", "/nonexistent"))
        try:
            pids = {int(p) for p in listed.read_text().split()}
        except OSError:
            pids = set()
        if os.getpid() in pids:
            return spec_of({"dense9": {"w": np.zeros((1,), np.float32)}})
        return super().stored_params_spec()


model = PickyModel(**{f.name: getattr(mlp.model, f.name) for f in dataclasses.fields(Model)})
