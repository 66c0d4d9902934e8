"""Who signed a verdict, read back from its signature text, for listings and logs.

Reading a trail checks nothing (the store's signer does that) and needs no
``cryptography``: a listing shows who claims to have signed each verdict,
and marks as forged what the keys it was opened with refuse.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Trail:
    """Who signed a verdict, as its signature says (checked or not):
    ``VersionInfo.trail()``.

    Attributes:
      algorithm: ``"ecdsa-p256-sha256"``, or ``"hmac-sha256"``.
      fingerprint: the signing key's fingerprint (None for HMAC).
    """

    algorithm: str
    fingerprint: str | None

    def as_json(self, *, digest: str | None, signed_at: str) -> dict[str, Any]:
        """The trail as ``store ls --json`` shows it, with what was signed and when."""
        return {
            "algorithm": self.algorithm,
            "fingerprint": self.fingerprint,
            "digest": digest,
            "signed_at": signed_at,
        }

    @classmethod
    def of(cls, signature: object) -> Trail | None:
        """The trail a signature text carries; None for none or one not understood.

        Example:
          >>> Trail.of("ecdsa-p256-sha256:" + "ab" * 32 + ":AAAA").fingerprint[:4]
          'abab'
          >>> Trail.of("hmac-sha256:00").algorithm, Trail.of(None)
          ('hmac-sha256', None)
        """
        if not isinstance(signature, str):
            return None
        parts = signature.split(":")
        if len(parts) == 3 and parts[0].startswith("ecdsa-") and len(parts[1]) == 64:
            return cls(parts[0], parts[1])
        if len(parts) == 2 and parts[0] == "hmac-sha256":
            return cls(parts[0], None)
        return None
