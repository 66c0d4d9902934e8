"""How a store's verdicts are signed and checked: the ``VerdictSigner``
interface, and HMAC-SHA256 (``HmacSigner``) as its first scheme.

The lifecycle never sees a key. It hands a signer the bytes a verdict
signs (``verdicts.message``: the store's id, the version, its uid, the file
digest, the status, the reason and the checks) and keeps the string the
signer returns in the verdict's ``signature``; a gate hands the same bytes
and that string back to ``verify``. Which records need a signature, and
what to say when one is missing or wrong, is decided once, in verdicts.py,
whatever the scheme, so a second scheme (EC keys) plugs in as another
``VerdictSigner`` without touching the lifecycle.

With HMAC every party that can check a verdict can also make one: the key
is a shared secret of at least 16 bytes, given as ``key=`` or in the file
``$TREEGUARD_STORE_KEY_FILE`` names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import stat
from collections.abc import Sequence
from typing import Protocol

from ..atomic import read_key_file
from ..errors import ConfigError, StoreError
from ..provenance.variables import KEY_VARIABLES, REVOKED_ENV, SIGNING_KEY_ENV, TRUSTED_ENV

#: The environment variable naming a key file, used when no ``key=`` is given.
KEY_ENV = "TREEGUARD_STORE_KEY_FILE"
_MIN_KEY = 16
_KEY_FILE_LIMIT = 4096


class VerdictSigner(Protocol):
    """One scheme of signing verdicts, and of checking them.

    A store holds at most one signer; ``ArtifactStore`` makes it from its
    key and hands it every verdict to sign and every signature to check.
    """

    def sign(self, message: bytes) -> str:
        """The signature of ``message``, as the text kept in the record.

        Raises:
          SignatureError: if this signer can check signatures but not make them.
        """
        ...

    def verify(self, message: bytes, signature: str) -> str | None:
        """None if ``signature`` is a good signature of ``message``; else why
        it is not, as a clause that follows "does not match: "."""
        ...

    def require_signing(self) -> None:
        """Refuses a signer that can check signatures but not make them,
        before a verdict is judged.

        Raises:
          SignatureError: if this signer cannot sign.
        """
        ...


class HmacSigner:
    """HMAC-SHA256 with a shared key: ``hmac-sha256:`` and the hex digest.

    Args:
      key: the secret, at least 16 bytes (checked by ``signer_for``).

    Example:
      >>> signer = HmacSigner(b"a key of sixteen bytes")
      >>> signature = signer.sign(b"a verdict")
      >>> signature.startswith("hmac-sha256:"), signer.verify(b"a verdict", signature)
      (True, None)
      >>> print(signer.verify(b"another verdict", signature))
      the verdict or its file digest was changed, or it was signed with another key
    """

    _PREFIX = "hmac-sha256:"

    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, message: bytes) -> str:
        return self._PREFIX + hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> str | None:
        if hmac.compare_digest(signature, self.sign(message)):
            return None
        return "the verdict or its file digest was changed, or it was signed with another key"

    def require_signing(self) -> None:
        return None  # whoever holds the key signs


@dataclasses.dataclass(frozen=True)
class EcKeys:
    """The EC key files a store is opened with (see ``treeguard.provenance``).

    Attributes:
      signing_key: the private key that signs verdicts, or None.
      trusted_keys: the public keys whose verdicts count.
      revoked_keys: the public keys whose verdicts no longer count.
    """

    signing_key: str | os.PathLike[str] | None = None
    trusted_keys: Sequence[str | os.PathLike[str]] = ()
    revoked_keys: Sequence[str | os.PathLike[str]] = ()

    def __bool__(self) -> bool:
        return self.signing_key is not None or bool(self.trusted_keys) or bool(self.revoked_keys)

    @classmethod
    def from_env(cls) -> EcKeys:
        """The key files ``$TREEGUARD_SIGNING_KEY_FILE``, ``$TREEGUARD_TRUSTED_KEYS``
        and ``$TREEGUARD_REVOKED_KEYS`` name (lists joined by ``os.pathsep``).

        Raises:
          ConfigError: for a variable that is set but names no file (an unset
            shell variable expanded), which would silently mean "no key".
        """
        found: dict[str, list[str]] = {}
        for name in KEY_VARIABLES:
            value = os.environ.get(name)
            if value is None:
                continue
            paths = [p for p in value.split(os.pathsep) if p.strip()]
            if not paths:
                raise ConfigError(
                    f"${name} is set but names no key file",
                    context=name,
                    hint=f"set it to the key file's path, or unset it (`unset {name}`)",
                )
            found[name] = paths
        signing = found.get(SIGNING_KEY_ENV, [])
        if len(signing) > 1:
            raise ConfigError(
                f"${SIGNING_KEY_ENV} names {len(signing)} files; a store signs with one key",
                context=SIGNING_KEY_ENV,
                hint="name one private key file",
            )
        return cls(
            signing_key=signing[0] if signing else None,
            trusted_keys=found.get(TRUSTED_ENV, []),
            revoked_keys=found.get(REVOKED_ENV, []),
        )


def signer_for(
    key: bytes | str | None, *, root: str | None, keys: EcKeys | None = None
) -> VerdictSigner | None:
    """The signer of a store opened with ``key`` (HMAC) or EC ``keys``, else
    with the key files the environment names; None for none.

    Args:
      key: the HMAC key given to the store, or None.
      root: the store's directory (a key file may not lie inside it), or
        None for a store in a bucket.
      keys: the EC key files given to the store, or None.

    Raises:
      StoreError: for a key shorter than 16 bytes, or a key file that cannot
        be read, that others may rewrite (group- or world-writable) or that
        lies inside the store.
      ConfigError: for a key variable set to the empty string (an unset
        shell variable expanded), which would silently mean "no key"; for an
        HMAC key and EC keys at once.
      KeyFileError: for an EC key file that cannot be used.
    """
    if key is None and not keys:
        from_env = EcKeys.from_env()
        if from_env and os.environ.get(KEY_ENV) is not None:
            raise ConfigError(
                f"both ${KEY_ENV} (an HMAC key) and EC key variables are set; a store "
                "signs with one scheme",
                context=KEY_ENV,
                hint=f"unset {KEY_ENV} to use the EC keys, or the EC variables to use HMAC",
            )
        keys = from_env
    if keys:
        if key is not None:
            raise ConfigError(
                "a store is opened with an HMAC key or with EC keys, not both",
                context="key=",
                hint="pass key= for HMAC, or signing_key=/trusted_keys= for EC keys",
            )
        return _ec_signer(keys, root)
    return _hmac_signer(key, root)


def _ec_signer(keys: EcKeys, root: str | None) -> VerdictSigner:
    # the sign extra (cryptography) is imported only when EC keys are named
    from ..provenance.keys import load_signing_key
    from ..provenance.trust import TrustPolicy
    from ..provenance.verdicts import EcSigner

    private = (
        load_signing_key(keys.signing_key, outside=root) if keys.signing_key is not None else None
    )
    policy = TrustPolicy.from_paths(trusted=keys.trusted_keys, revoked=keys.revoked_keys)
    return EcSigner(private, policy)


def _hmac_signer(key: bytes | str | None, root: str | None) -> VerdictSigner | None:
    source = "key="
    if key is None:
        path = os.environ.get(KEY_ENV)
        if path is None:
            return None
        if not path.strip():
            raise ConfigError(
                f"{KEY_ENV} is set but empty, so no key file is named",
                context=KEY_ENV,
                hint=f"set it to the key file's path, or unset it (`unset {KEY_ENV}`) to run "
                "the store unsigned on purpose",
            )
        source = f"{KEY_ENV}={path}"
        key = _read_key_file(path, source, root)
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < _MIN_KEY:
        raise StoreError(
            f"the store key is {len(raw)} bytes; at least {_MIN_KEY} are needed",
            context=source,
            hint="make one with `python -c 'import secrets; print(secrets.token_hex(32))'`",
        )
    return HmacSigner(raw)


def _read_key_file(path: str, source: str, root: str | None) -> bytes:
    def refuse(message: str, hint: str) -> StoreError:
        return StoreError(message, context=source, hint=hint)

    fix = "point the variable at a regular file holding only the key (16 or more random bytes)"
    raw, mode = read_key_file(
        path, what="key file", limit=_KEY_FILE_LIMIT, outside=root, fix=fix, refuse=refuse
    )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            f"the key file is writable by others (mode {stat.S_IMODE(mode):04o}), so "
            "anyone may replace the key and sign verdicts",
            context=source,
            hint="chmod 600 the key file",
        )
    return raw.strip()
