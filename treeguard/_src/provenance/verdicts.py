"""Verdicts signed with EC keys: the asymmetric scheme of a store's verdict signer.

A store hands its signer the bytes a verdict signs and keeps the text the
signer returns; a gate hands both back to ``verify``. ``EcSigner`` makes
that text with a private key (``ALGORITHM:FINGERPRINT:BASE64``, over the
DSSE encoding of the verdict with its own payload type, so no signature of
a model can pass for a verdict's) and checks it against a ``TrustPolicy``.
A signer given only public keys checks and cannot sign: whoever holds it
cannot make a verdict its gates accept.

The store's own key counts as trusted unless it is revoked, so a store
that signs accepts what it signed.
"""

from __future__ import annotations

from .errors import BadSignatureError, ProvenanceError
from .keys import PrivateKey
from .trail import Trail
from .trust import TrustPolicy, sign_text

#: The DSSE payload type of a store's verdict.
VERDICT_TYPE = "application/vnd.treeguard.verdict+json"


class EcSigner:
    """Signs verdicts with an EC private key and checks them against a trust policy.

    Args:
      key: the private key to sign with, or None for a signer that only checks.
      policy: the keys whose signatures count (the key's own public half is
        added unless revoked).

    Example:
      >>> import os, tempfile
      >>> from treeguard.provenance import TrustPolicy, generate_keys, PrivateKey
      >>> d = tempfile.mkdtemp()
      >>> key_path, pub = generate_keys(os.path.join(d, "ci"))
      >>> writer = EcSigner(PrivateKey.load(key_path), TrustPolicy())
      >>> text = writer.sign(b"a verdict")
      >>> reader = EcSigner(None, TrustPolicy.from_paths(trusted=[pub]))
      >>> reader.verify(b"a verdict", text) is None
      True
      >>> reader.sign(b"a forged verdict")
      Traceback (most recent call last):
      ...
      treeguard...ProvenanceError: this store holds public keys only: ...and cannot sign one
      hint: ...
    """

    def __init__(self, key: PrivateKey | None, policy: TrustPolicy) -> None:
        self.key = key
        trusted = dict(policy.trusted)
        if key is not None and key.public.fingerprint not in policy.revoked:
            trusted.setdefault(key.public.fingerprint, key.public)
        self.policy = TrustPolicy(trusted=trusted, revoked=policy.revoked)

    def sign(self, message: bytes) -> str:
        """The signature text of ``message``.

        Raises:
          ProvenanceError: for a signer without a private key, or whose key is revoked.
        """
        return sign_text(self._signing_key(), VERDICT_TYPE, message)

    def require_signing(self) -> None:
        """Refuses, before a verdict is judged, a signer that may not sign.

        Raises:
          ProvenanceError: for a signer without a private key.
          RevokedKeyError: for a signer whose key is revoked, naming it.
        """
        self._signing_key()

    def _signing_key(self) -> PrivateKey:
        """The private key, if this signer may sign.

        Raises:
          ProvenanceError: for a signer without a private key.
          RevokedKeyError: for a signer whose key is revoked, naming it.
        """
        if self.key is None:
            raise ProvenanceError(
                "this store holds public keys only: it checks verdicts and cannot sign one",
                hint="open the store with its signing key (--signing-key, "
                "$TREEGUARD_SIGNING_KEY_FILE) where verdicts are made",
            )
        if self.key.public.fingerprint in self.policy.revoked:
            self.policy.key(self.key.public.fingerprint)  # raises RevokedKeyError, naming it
        return self.key

    def verify(self, message: bytes, signature: str) -> str | None:
        """None for a signature of ``message`` by a trusted, unrevoked key.

        Raises:
          RevokedKeyError: for a verdict signed by a revoked key, naming it.
          UntrustedKeyError: for one signed by a key the policy does not trust.
          BadSignatureError: for one that does not verify, or an HMAC one.
        """
        trail = Trail.of(signature)
        if trail is not None and trail.fingerprint is None:
            raise BadSignatureError(
                "it is signed with an HMAC key, and this store checks EC signatures only",
                hint="verify the version again with the EC signing key",
            )
        self.policy.check_text(VERDICT_TYPE, message, signature)
        return None
