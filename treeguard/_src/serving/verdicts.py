"""What a served version's verdict says: which of its checks were the
model's release checks (no JAX here: ``treeguard store ls`` reads it), and
who signed it (the provenance a server shows and logs).

The release checks (``release.release_checks``) are named ``model.<check>``;
a verdict whose recorded checks hold none of them was made with no model
check, and ``treeguard serve`` refuses it unless ``--allow-unchecked``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import TreeguardError

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


def version_trail(store: Any, version: str) -> dict[str, Any] | None:
    """Who signed a version's verdict, over which digest and when, as
    ``store ls --json`` shows it; None for an unsigned verdict or an
    unreadable record. A served version passed the store's gate, so with
    trusted keys the signature named here was checked.

    Args:
      store: the ``ArtifactStore`` the version is served from.
      version: the version's name.

    Returns:
      ``{"algorithm", "fingerprint", "digest", "signed_at"}`` or None.

    Example:
      >>> import tempfile, numpy as np, treeguard as tg
      >>> store = tg.ArtifactStore.init(tempfile.mkdtemp() + "/s")
      >>> v = store.put({"w": np.zeros(2, np.float32)})
      >>> version_trail(store, v) is None  # no key: nothing signed
      True
    """
    try:
        info = store.info(version)
    except (TreeguardError, OSError):
        return None
    trail = info.trail()
    return None if trail is None else trail.as_json(digest=info.digest, signed_at=info.updated)


def trail_text(trail: dict[str, Any] | None) -> str:
    """One line for the log: who signed the served version's verdict.

    Example:
      >>> trail_text(None)
      'its verdict is not signed'
      >>> trail_text({"algorithm": "hmac-sha256", "fingerprint": None,
      ...             "digest": "blake3:ab", "signed_at": "2026-12-05T09:00:00Z"})
      'its verdict (blake3:ab) signed with hmac-sha256 by the store key at 2026-12-05T09:00:00Z'
    """
    if trail is None:
        return "its verdict is not signed"
    who = f"key {trail['fingerprint']}" if trail["fingerprint"] else "the store key"
    return (
        f"its verdict ({trail['digest']}) signed with {trail['algorithm']} by {who} "
        f"at {trail['signed_at']}"
    )
