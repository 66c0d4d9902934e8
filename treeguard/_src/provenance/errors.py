"""The errors of provenance: a signature refused, a key file that cannot be used.

They live beside the code that raises them, in the hierarchy of
``treeguard._src.errors`` (each renders from its fields and carries its exit
code on the class, as every treeguard error does)::

    SignatureError (StoreError)        a verdict unsigned or wrongly signed   exit 1
    └── ProvenanceError                a signature refused                    exit 1
        ├── MissingSignatureError      no signature where one is required
        ├── BadSignatureError          a signature that does not verify
        ├── UntrustedKeyError          signed by a key no trust list holds
        ├── RevokedKeyError            signed by a revoked key
        └── SignedDigestError          bytes that differ from their signed digest
    KeyFileError (TreeguardError, ValueError)  a key file that cannot be used  exit 2

A ``ProvenanceError`` is a ``SignatureError``, so every gate that refuses a
forged HMAC verdict refuses an unsigned, untrusted or revoked one the same
way. Each names the key's fingerprint where one is known, never a key's bytes.

Example:
  >>> e = RevokedKeyError("signed by a revoked key", fingerprint="ab" * 32, hint="re-verify")
  >>> e.exit_code, e.fingerprint[:4], isinstance(e, SignatureError)
  (1, 'abab', True)
"""

from __future__ import annotations

from typing import Self

from ..errors import SignatureError, TreeguardError, present_as


class ProvenanceError(SignatureError):
    """A signature was refused: missing, not verifying, from a key that is
    not trusted or is revoked, or over digests the bytes no longer have.

    Attributes:
      fingerprint: the sha256 fingerprint of the key concerned, when known.
      version: the store version concerned, when there is one.
    """

    def __init__(
        self,
        message: str = "",
        *,
        fingerprint: str | None = None,
        version: str | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        super().__init__(message, version=version, context=context, hint=hint)

    def at(self, context: str) -> Self:
        """The same refusal (its class and every field), said of ``context``
        (the user's path, where the check ran on a private copy).

        Example:
          >>> e = SignedDigestError("changed", names=("w",), context="/tmp/copy").at("model")
          >>> str(e), e.names
          ('model: changed', ('w',))
        """
        moved = type(self).__new__(type(self))
        moved.__dict__.update(self.__dict__, context=context)
        moved.args = (moved._render(),)
        return moved


class MissingSignatureError(ProvenanceError):
    """No signature where the trust policy requires one."""


class BadSignatureError(ProvenanceError):
    """A signature that does not verify against the key it names: the signed
    bytes were changed, or it was made with another key."""


class UntrustedKeyError(ProvenanceError):
    """A signature by a key that no trust list holds."""


class RevokedKeyError(ProvenanceError):
    """A signature by a revoked key: it stops counting at once, whatever it signed."""


class SignedDigestError(ProvenanceError):
    """Bytes that differ from the digests a valid signature vouches for: a
    file changed, missing, or added after signing.

    Attributes:
      names: each file (or tensor) at fault, with what is wrong with it.
    """

    def __init__(
        self,
        message: str = "",
        *,
        names: tuple[str, ...] = (),
        fingerprint: str | None = None,
        version: str | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.names = names
        super().__init__(
            message, fingerprint=fingerprint, version=version, context=context, hint=hint
        )


class KeyFileError(TreeguardError, ValueError):
    """A key file that cannot be used: unreadable, not a PEM EC key, on a
    curve other than P-256, P-384 or P-521, encrypted, or a private key that
    others may read or write. Exit code 2: the input cannot be used.

    Attributes:
      path: the key file.
    """

    def __init__(
        self, message: str = "", *, path: str, context: str | None = None, hint: str | None = None
    ) -> None:
        self.path = path
        super().__init__(message, context=context or path, hint=hint)


present_as(
    "treeguard.provenance",
    ProvenanceError,
    MissingSignatureError,
    BadSignatureError,
    UntrustedKeyError,
    RevokedKeyError,
    SignedDigestError,
    KeyFileError,
)
