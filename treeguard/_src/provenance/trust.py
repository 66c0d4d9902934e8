"""Whose signatures count: trusted keys, revoked keys, several of each at once.

A ``TrustPolicy`` holds public keys only, so whoever holds it can check a
signature and cannot make one. A signature names its key by fingerprint; the
policy refuses, in this order, a revoked key (at once, whatever it signed,
naming the key), a key it does not trust, and a signature that does not
verify. A key both trusted and revoked is revoked. Rotation is two keys
trusted at once, then the old one revoked.

Every signature is over a DSSE pre-authentication encoding (``pae``) of a
payload type and a payload: the type keeps a signature made for one purpose
(an OpenSSF Model Signing statement, a store's verdict) from being accepted
for another.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping

from .errors import BadSignatureError, RevokedKeyError, UntrustedKeyError
from .keys import PrivateKey, PublicKey, load_public_key

_TEXT_RE = re.compile(
    r"^(ecdsa-p(?:256|384|521)-sha(?:256|384|512)):([0-9a-f]{64}):([A-Za-z0-9+/=]{8,400})$"
)


def pae(payload_type: str, payload: bytes) -> bytes:
    """The DSSE v1 pre-authentication encoding: what a signature is made over.

    Example:
      >>> pae("t", b"ab")
      b'DSSEv1 1 t 2 ab'
    """
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclasses.dataclass(frozen=True)
class Signed:
    """A signature that a policy accepted.

    Attributes:
      key: the trusted key it verified against.
      signature: the DER-encoded ECDSA signature.
    """

    key: PublicKey
    signature: bytes


@dataclasses.dataclass(frozen=True)
class TrustPolicy:
    """The keys whose signatures count, and the keys that no longer do.

    Attributes:
      trusted: each trusted public key, by fingerprint.
      revoked: the fingerprint of each revoked key, with where it was named.

    Example:
      >>> import os, tempfile
      >>> from treeguard.provenance import generate_keys, PrivateKey
      >>> d = tempfile.mkdtemp()
      >>> (old_key, old), (_, new) = (generate_keys(os.path.join(d, n)) for n in ("old", "new"))
      >>> policy = TrustPolicy.from_paths(trusted=[old, new])
      >>> signer = PrivateKey.load(old_key)
      >>> sig = signer.sign(pae("t", b"data"))
      >>> policy.check("t", b"data", sig, fingerprint=signer.public.fingerprint).key.source == old
      True
      >>> rotated = TrustPolicy.from_paths(trusted=[old, new], revoked=[old])
      >>> rotated.check("t", b"data", sig, fingerprint=signer.public.fingerprint)
      Traceback (most recent call last):
      ...
      treeguard...RevokedKeyError: signed by key ... which is revoked ...
      hint: ...
    """

    trusted: Mapping[str, PublicKey] = dataclasses.field(default_factory=dict)
    revoked: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_paths(
        cls,
        *,
        trusted: Iterable[str | os.PathLike[str]] = (),
        revoked: Iterable[str | os.PathLike[str]] = (),
    ) -> TrustPolicy:
        """A policy from public key files.

        Raises:
          KeyFileError: for a file that is not an EC public key on an accepted curve.
        """
        keys = [load_public_key(p) for p in trusted]
        gone = {k.fingerprint: k.source for k in (load_public_key(p) for p in revoked)}
        return cls(trusted={k.fingerprint: k for k in keys}, revoked=gone)

    def __bool__(self) -> bool:
        return bool(self.trusted)

    def key(self, fingerprint: str | None, /) -> list[PublicKey]:
        """The trusted keys a signature naming ``fingerprint`` may be checked
        against (every one when it names none, as an older bundle does).

        Raises:
          RevokedKeyError: for a revoked key, naming it.
          UntrustedKeyError: for a key no trust list holds.
        """
        if fingerprint is None:
            return [k for fp, k in self.trusted.items() if fp not in self.revoked]
        if fingerprint in self.revoked:
            raise RevokedKeyError(
                f"signed by key {fingerprint[:16]}… (sha256 {fingerprint}), which is revoked "
                f"({self.revoked[fingerprint]}): what it signed no longer counts",
                fingerprint=fingerprint,
                hint="verify the version again with a trusted key that is not revoked",
            )
        key = self.trusted.get(fingerprint)
        if key is None:
            held = ", ".join(fp[:16] + "…" for fp in self.trusted) or "none"
            raise UntrustedKeyError(
                f"signed by key {fingerprint[:16]}… (sha256 {fingerprint}), which is not "
                f"trusted (trusted: {held})",
                fingerprint=fingerprint,
                hint="trust its public key (--trusted-key KEY.pub, $TREEGUARD_TRUSTED_KEYS) "
                "if you know whose it is",
            )
        return [key]

    def check(
        self, payload_type: str, payload: bytes, signature: bytes, /, *, fingerprint: str | None
    ) -> Signed:
        """Accepts a signature over ``pae(payload_type, payload)`` by a trusted,
        unrevoked key.

        Args:
          payload_type: what the payload is (its DSSE type).
          payload: the signed bytes.
          signature: the DER-encoded ECDSA signature.
          fingerprint: the key it names, or None to try every trusted key.

        Returns:
          The key it verified against, and the signature.

        Raises:
          RevokedKeyError, UntrustedKeyError: see ``key``.
          BadSignatureError: if it does not verify.
        """
        candidates = self.key(fingerprint)
        data = pae(payload_type, payload)
        for key in candidates:
            if key.verifies(signature, data):
                return Signed(key=key, signature=signature)
        named = f"key {fingerprint[:16]}…" if fingerprint else "any trusted key"
        raise BadSignatureError(
            f"the signature does not verify against {named}: what it signs was changed, "
            "or it was made with another key",
            fingerprint=fingerprint,
            hint="do not use what it signs; sign it again with a trusted key",
        )

    def check_text(self, payload_type: str, payload: bytes, text: str, /) -> Signed:
        """``check`` for a signature written as one line by ``sign_text``.

        Raises:
          BadSignatureError: for a line that is not a signature.
          RevokedKeyError, UntrustedKeyError: see ``key``.
        """
        match = _TEXT_RE.match(text) if isinstance(text, str) else None
        raw = None
        if match is not None:
            try:
                raw = base64.b64decode(match[3], validate=True)
            except binascii.Error:
                raw = None
        if match is None or raw is None:
            raise BadSignatureError(
                f"{str(text)[:40]!r} is not an EC signature (ALGORITHM:FINGERPRINT:BASE64)",
                hint="do not use what it claims to sign; sign it again with a trusted key",
            )
        signed = self.check(payload_type, payload, raw, fingerprint=match[2])
        if signed.key.algorithm != match[1]:
            raise BadSignatureError(
                f"the signature says {match[1]}, and key {match[2][:16]}… signs with "
                f"{signed.key.algorithm}",
                fingerprint=match[2],
                hint="do not use what it claims to sign; sign it again with a trusted key",
            )
        return signed


def sign_text(key: PrivateKey, payload_type: str, payload: bytes, /) -> str:
    """A signature of ``pae(payload_type, payload)`` as one line of ASCII:
    ``ALGORITHM:FINGERPRINT:BASE64``.

    Example:
      >>> import os, tempfile
      >>> from treeguard.provenance import generate_keys, PrivateKey
      >>> path, _ = generate_keys(os.path.join(tempfile.mkdtemp(), "k"))
      >>> sign_text(PrivateKey.load(path), "t", b"x").split(":")[0]
      'ecdsa-p256-sha256'
    """
    raw = key.sign(pae(payload_type, payload))
    return f"{key.public.algorithm}:{key.public.fingerprint}:{base64.b64encode(raw).decode()}"
