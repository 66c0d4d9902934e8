"""EC keys in PEM: reading them strictly, their fingerprints, making new ones.

The curves are those OpenSSF Model Signing's ``key`` method accepts: P-256,
P-384 and P-521, each signing with ECDSA over the hash of its size (SHA-256,
SHA-384, SHA-512). A key's fingerprint is the sha256 of its public key in
PEM (SubjectPublicKeyInfo), in hex: the very value ``model_signing`` writes
as the bundle's ``publicKey.hint``, so a signature names its key the same way
in both tools.

A private key file is read only if it is a regular file (never a link, a
FIFO or a device), unencrypted, and neither readable nor writable by group
or others; a public key file only if it is a regular file. Both are at most
64 KiB.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from typing import Literal

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..atomic import fsync_dir, read_key_file, write_all
from .errors import KeyFileError

Curve = Literal["P-256", "P-384", "P-521"]
#: Each curve's NIST name, by the name ``cryptography`` gives it.
_CURVES: dict[str, Curve] = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
_BY_NAME: dict[Curve, type[ec.EllipticCurve]] = {
    "P-256": ec.SECP256R1,
    "P-384": ec.SECP384R1,
    "P-521": ec.SECP521R1,
}
#: Every curve a key may be on.
CURVES: tuple[Curve, ...] = tuple(_BY_NAME)
_KEY_FILE_LIMIT = 64 * 1024
_PRIVATE_MODE = 0o600
_PUBLIC_MODE = 0o644


def _curve(key: ec.EllipticCurvePublicKey, path: str) -> Curve:
    found = _CURVES.get(key.curve.name)
    if found is None:
        raise KeyFileError(
            f"the key is on curve {key.curve.name}; only P-256, P-384 and P-521 are accepted "
            "(the curves OpenSSF Model Signing signs with)",
            path=path,
            hint="make a key on one of them: `treeguard keys new NAME --curve P-256`",
        )
    return found


def fingerprint_of(key: ec.EllipticCurvePublicKey, /) -> str:
    """The sha256, in hex, of the public key in PEM (SubjectPublicKeyInfo).

    It is the ``publicKey.hint`` of an OpenSSF Model Signing bundle.

    Example:
      >>> from cryptography.hazmat.primitives.asymmetric import ec
      >>> len(fingerprint_of(ec.generate_private_key(ec.SECP256R1()).public_key()))
      64
    """
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


@dataclasses.dataclass(frozen=True)
class PublicKey:
    """An EC public key that checks signatures.

    Attributes:
      key: the ``cryptography`` key.
      fingerprint: the sha256 of its PEM, in hex (64 digits).
      curve: ``"P-256"``, ``"P-384"`` or ``"P-521"``.
      source: where it was read from (a path), for messages.
    """

    key: ec.EllipticCurvePublicKey
    fingerprint: str
    curve: Curve
    source: str

    @property
    def algorithm(self) -> str:
        """The signature algorithm, e.g. ``"ecdsa-p256-sha256"``."""
        bits = self.curve[2:]
        return f"ecdsa-p{bits}-sha{_hash_bits(self.curve)}"

    @property
    def short(self) -> str:
        """The fingerprint's first 16 digits, as messages show it."""
        return self.fingerprint[:16]

    def verifies(self, signature: bytes, data: bytes, /) -> bool:
        """Whether ``signature`` (DER-encoded ECDSA) is this key's over ``data``."""
        try:
            self.key.verify(signature, data, ec.ECDSA(_hash(self.curve)()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def pem(self) -> bytes:
        """The key in PEM (SubjectPublicKeyInfo)."""
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str], /) -> PublicKey:
        """Reads an EC public key from a PEM file.

        Args:
          path: the ``.pub`` file (``-----BEGIN PUBLIC KEY-----``).

        Returns:
          The key, with its fingerprint and curve.

        Raises:
          KeyFileError: for a file that is not a regular file, not a PEM public
            key, not EC, or on another curve.

        Example:
          >>> import tempfile, os
          >>> key, pub = generate_keys(os.path.join(tempfile.mkdtemp(), "alice"))
          >>> PublicKey.load(pub).curve
          'P-256'
        """
        return load_public_key(path)


@dataclasses.dataclass(frozen=True)
class PrivateKey:
    """An EC private key that signs.

    Attributes:
      key: the ``cryptography`` key.
      public: its public half.
    """

    key: ec.EllipticCurvePrivateKey
    public: PublicKey

    def sign(self, data: bytes, /) -> bytes:
        """The DER-encoded ECDSA signature of ``data``."""
        return self.key.sign(data, ec.ECDSA(_hash(self.public.curve)()))

    @classmethod
    def load(cls, path: str | os.PathLike[str], /, *, outside: str | None = None) -> PrivateKey:
        """Reads an unencrypted EC private key from a PEM file only its owner may read.

        Args:
          path: the ``.key`` file.
          outside: a directory the key may not lie in (a store's root, where
            anyone who can write the store could read or replace it).

        Returns:
          The key and its public half.

        Raises:
          KeyFileError: for a file that is not regular, that group or others
            may read or write, that lies inside ``outside``, that is encrypted,
            not PEM, not EC, or on another curve.

        Example:
          >>> import tempfile, os
          >>> key, _ = generate_keys(os.path.join(tempfile.mkdtemp(), "alice"), curve="P-384")
          >>> PrivateKey.load(key).public.algorithm
          'ecdsa-p384-sha384'
        """
        return load_signing_key(path, outside=outside)


def _hash(curve: Curve) -> type[hashes.HashAlgorithm]:
    return {"P-256": hashes.SHA256, "P-384": hashes.SHA384, "P-521": hashes.SHA512}[curve]


def _hash_bits(curve: Curve) -> int:
    return {"P-256": 256, "P-384": 384, "P-521": 512}[curve]


def _not_ec(key: object, path: str) -> KeyFileError:
    return KeyFileError(
        f"the key is {type(key).__name__.removeprefix('_')}, not an elliptic-curve key",
        path=path,
        hint="make one with `treeguard keys new NAME`",
    )


def _public(key: ec.EllipticCurvePublicKey, source: str) -> PublicKey:
    curve = _curve(key, source)
    return PublicKey(key=key, fingerprint=fingerprint_of(key), curve=curve, source=source)


def _read(
    path: str | os.PathLike[str], what: str, outside: str | None = None
) -> tuple[str, bytes, int]:
    """The key file's name, bytes and mode (see ``atomic.read_key_file``)."""
    name = os.fspath(path)
    if not name.strip():
        raise KeyFileError(
            f"the {what} path is empty (an unset shell variable?)",
            path=repr(name),
            hint="name the key file",
        )

    def refuse(message: str, hint: str) -> KeyFileError:
        return KeyFileError(message, path=name, hint=hint)

    fix = "name a regular PEM file (`treeguard keys new NAME` makes a pair)"
    data, mode = read_key_file(
        name, what=what, limit=_KEY_FILE_LIMIT, outside=outside, fix=fix, refuse=refuse
    )
    return name, data, mode


def load_public_key(path: str | os.PathLike[str], /) -> PublicKey:
    """``PublicKey.load``, whose docstring says what it reads and refuses."""
    name, data, _ = _read(path, "public key file")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        hint = "name the .pub half of the pair, not the private key"
        raise KeyFileError(
            f"not a PEM public key ({type(e).__name__})",
            path=name,
            hint=hint if b"PRIVATE KEY" in data else "make one with `treeguard keys new NAME`",
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise _not_ec(key, name)
    return _public(key, name)


def load_signing_key(path: str | os.PathLike[str], /, *, outside: str | None = None) -> PrivateKey:
    """``PrivateKey.load``, whose docstring says what it reads and refuses."""
    name, data, mode = _read(path, "private key file", outside)
    if mode & 0o077:
        raise KeyFileError(
            f"the private key may be read or written by others (mode "
            f"{stat.S_IMODE(mode):04o}), so anyone could sign with it",
            path=name,
            hint=f"chmod 600 {name}",
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            "the private key is encrypted; treeguard reads only unencrypted keys kept mode 600",
            path=name,
            hint="decrypt it into a file only you can read: `openssl ec -in KEY -out NEW.key`",
        ) from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise KeyFileError(
            f"not a PEM private key ({type(e).__name__})",
            path=name,
            hint="make one with `treeguard keys new NAME`",
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise _not_ec(key, name)
    return PrivateKey(key=key, public=_public(key.public_key(), name))


def _create(path: str, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def generate_keys(name: str | os.PathLike[str], /, *, curve: Curve = "P-256") -> tuple[str, str]:
    """Makes a new key pair: ``NAME.key`` (mode 0600) and ``NAME.pub``.

    Neither file may exist: a key is never overwritten.

    Args:
      name: the path of the pair without its suffix.
      curve: ``"P-256"`` (the default), ``"P-384"`` or ``"P-521"``.

    Returns:
      The paths of the private and the public key.

    Raises:
      KeyFileError: if either file exists, or for an unknown curve.

    Example:
      >>> import tempfile, os, stat
      >>> key, pub = generate_keys(os.path.join(tempfile.mkdtemp(), "alice"))
      >>> oct(stat.S_IMODE(os.stat(key).st_mode)), PublicKey.load(pub).fingerprint == (
      ...     PrivateKey.load(key).public.fingerprint)
      ('0o600', True)
    """
    base = os.fspath(name)
    key_path, pub_path = base + ".key", base + ".pub"
    if curve not in _BY_NAME:
        raise KeyFileError(
            f"unknown curve {curve!r}; one of {', '.join(CURVES)}",
            path=key_path,
            hint="pass --curve P-256, P-384 or P-521",
        )
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise KeyFileError(
                "a file is already there; a key is never overwritten",
                path=path,
                hint="choose another name, or remove the old pair on purpose first",
            )
    key = ec.generate_private_key(_BY_NAME[curve]())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _create(key_path, private, _PRIVATE_MODE)
    _create(pub_path, public, _PUBLIC_MODE)
    fsync_dir(os.path.dirname(os.path.abspath(key_path)))
    return key_path, pub_path
