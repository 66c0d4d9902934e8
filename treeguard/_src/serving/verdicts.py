"""Which of a verdict's checks were the model's release checks (no JAX here:
``treeguard store ls`` reads it).

The release checks (``release.release_checks``) are named ``model.<check>``;
a verdict whose recorded checks hold none of them was made with no model
check, and ``treeguard serve`` refuses it unless ``--allow-unchecked``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The prefix of every release check's name.
PREFIX = "model."


def model_checks(checks: Sequence[Any]) -> list[str]:
    """The names of the release checks among a verdict's recorded checks.

    Example:
      >>> from treeguard._src.store.records import CheckRecord
      >>> model_checks([CheckRecord("integrity", True), CheckRecord("model.finite", True)])
      ['model.finite']
    """
    return [c.name for c in checks if c.name.startswith(PREFIX)]
