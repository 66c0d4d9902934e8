"""A model on disk signed and checked as OpenSSF Model Signing does it.

A model is a file or a directory. Its files are listed without following
any link (a link, FIFO, socket or device anywhere in it is refused), each
is hashed once by the hashing engine, and the manifest of their digests is
signed (``sign_model``) or compared with the one a trusted signature
vouches for (``verify_model``): every file that is missing, added or
changed is named, never just the first. The signature file itself, and the
git paths ``model_signing`` leaves out by default, are not part of the model.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Collection, Mapping

from ..atomic import atomic_write, file_kind, open_regular, read_regular
from ..dirtree import plain_bytes
from ..errors import FormatError, cap_lines
from ..hashing import DEFAULT, Algorithm, hash_file
from .errors import MissingSignatureError, SignedDigestError
from .keys import PrivateKey, PublicKey
from .oms import BUNDLE_LIMIT, MAX_FILES, ModelManifest, read_oms_bundle, write_oms_bundle
from .trust import TrustPolicy

#: The signature's file name in a model's directory (``model_signing``'s default).
SIGNATURE_NAME = "model.sig"
#: The paths ``model_signing`` leaves out of a directory by default.
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")


@dataclasses.dataclass(frozen=True)
class SignedModel:
    """A model whose every file matches a trusted signature.

    Attributes:
      manifest: the digests the signature vouches for.
      key: the trusted key that signed them.
      signature: the signature file's path.
    """

    manifest: ModelManifest
    key: PublicKey
    signature: str


def _ignored(name: str, ignore: Collection[str]) -> bool:
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in ignore)


def model_files(path: str | os.PathLike[str], /, *, ignore: Collection[str] = ()) -> list[str]:
    """The files of a model, relative to it and sorted (``["."]`` for a file).

    Args:
      path: a model file or directory.
      ignore: relative paths left out (a directory leaves out all below it).

    Raises:
      FormatError: for anything but regular files and directories in it,
        or a model of more than ``MAX_FILES`` files.
      FileNotFoundError: if nothing is at ``path``.

    Example:
      >>> import pathlib, tempfile
      >>> d = tempfile.mkdtemp()
      >>> for name in ("w.bin", "model.sig"):
      ...     _ = pathlib.Path(d, name).write_bytes(b"x")
      >>> model_files(d, ignore=["model.sig"])
      ['w.bin']
    """
    name = os.fspath(path)
    st = os.stat(name)
    if stat.S_ISREG(st.st_mode):
        return ["."]
    if not stat.S_ISDIR(st.st_mode):
        raise _not_plain(name, "", st.st_mode)
    out: list[str] = []

    def keep(rel: str) -> None:
        if not _ignored(rel, ignore):
            out.append(rel)

    def too_big(what: str) -> FormatError:
        return FormatError(f"the model holds {what}", context=name, hint="sign a smaller model")

    plain_bytes(
        name,
        max_entries=MAX_FILES,
        refuse=lambda rel, mode: _not_plain(name, rel, mode),
        too_big=too_big,
        found=keep,
    )
    return out


def _not_plain(model: str, rel: str, mode: int) -> FormatError:
    return FormatError(
        f"{rel or 'the model'} is {file_kind(mode)}, not a regular file or directory",
        context=model,
        hint="a signed model holds only regular files and directories; links are never followed",
    )


def hash_files(
    path: str | os.PathLike[str], names: Collection[str], /, *, algorithm: Algorithm = DEFAULT
) -> dict[str, str]:
    """The digest of each named file of a model (one read of each).

    Raises:
      FormatError: for a file that is not a regular file (a link swapped in).
    """
    root = os.fspath(path)
    out: dict[str, str] = {}
    for rel in names:
        fd = open_regular(root if rel == "." else os.path.join(root, rel), what="model file")
        try:
            out[rel] = hash_file(fd, algorithm)
        finally:
            os.close(fd)
    return out


def default_signature(path: str | os.PathLike[str], /) -> str:
    """Where a model's signature goes: ``DIR/model.sig`` for a directory,
    ``FILE.sig`` beside a model that is one file."""
    name = os.fspath(path)
    return os.path.join(name, SIGNATURE_NAME) if os.path.isdir(name) else name + ".sig"


def _inside(model: str, signature: str) -> str | None:
    rel = os.path.relpath(os.path.abspath(signature), os.path.abspath(model))
    return None if rel.startswith("..") or os.path.isabs(rel) else rel.replace(os.sep, "/")


def sign_model(
    path: str | os.PathLike[str],
    key: PrivateKey,
    /,
    *,
    signature: str | os.PathLike[str] | None = None,
    algorithm: Algorithm = "sha256",
    digests: Mapping[str, str] | None = None,
    name: str | None = None,
) -> ModelManifest:
    """Signs a model file or directory, writing an OpenSSF Model Signing
    v1.0 signature that ``model_signing verify key`` accepts.

    Args:
      path: the model.
      key: the signing key.
      signature: where to write it (``default_signature(path)`` if None).
      algorithm: ``"sha256"`` (the default: the ``model_signing verify key``
        command line recomputes sha256 whatever the signature says) or
        ``"blake3"`` (read by ``model_signing``'s library and by treeguard).
      digests: each file's digest, already computed by whoever wrote the
        files (never hashed twice); None hashes them here.
      name: the model's name in the statement (its file's or directory's
        name if None).

    Returns:
      The signed manifest.

    Raises:
      FormatError: for a link or special file in the model, or ``digests``
        that do not name exactly the model's files.

    Example:
      >>> import os, pathlib, tempfile
      >>> from treeguard.provenance import generate_keys, PrivateKey, TrustPolicy
      >>> d = tempfile.mkdtemp()
      >>> key, pub = generate_keys(os.path.join(d, "alice"))
      >>> model = os.path.join(d, "model")
      >>> os.mkdir(model)
      >>> _ = pathlib.Path(model, "w.bin").write_bytes(b"weights")
      >>> sorted(sign_model(model, PrivateKey.load(key)).digests)
      ['w.bin']
      >>> ok = verify_model(model, policy=TrustPolicy.from_paths(trusted=[pub]))
      >>> ok.key.fingerprint == PrivateKey.load(key).public.fingerprint
      True
    """
    model = os.fspath(path)
    target = os.fspath(signature) if signature is not None else default_signature(model)
    own = _inside(model, target)
    ignore = [*GIT_PATHS, *([own] if own else [])]
    names = model_files(model, ignore=ignore)
    if digests is None:
        found = hash_files(model, names, algorithm=algorithm)
    elif sorted(digests) != names:
        raise FormatError(
            f"the digests given name {len(digests)} files, the model holds {len(names)}",
            context=model,
            hint="pass the digest of every file of the model, or none to hash them here",
        )
    else:
        found = dict(digests)
    title = name if name is not None else os.path.basename(os.path.abspath(model))
    manifest = ModelManifest(title, algorithm, found, tuple(ignore))
    atomic_write(target, write_oms_bundle(manifest, key))
    return manifest


def verify_model(
    path: str | os.PathLike[str],
    /,
    *,
    policy: TrustPolicy,
    signature: str | os.PathLike[str] | None = None,
) -> SignedModel:
    """Checks a model against its OpenSSF Model Signing signature: signed by
    a trusted, unrevoked key, and every file matching its signed digest.

    Args:
      path: the model file or directory.
      policy: the keys whose signatures count.
      signature: the signature file (``default_signature(path)`` if None).

    Returns:
      The manifest and the key that signed it.

    Raises:
      MissingSignatureError: if there is no signature file.
      FormatError: for a signature file that is not an OMS v1.0 bundle.
      RevokedKeyError, UntrustedKeyError, BadSignatureError: for a
        signature that does not count (before any file is hashed).
      SignedDigestError: naming every file missing, added or changed.
    """
    model = os.fspath(path)
    where = os.fspath(signature) if signature is not None else default_signature(model)
    try:
        data = read_regular(where, limit=BUNDLE_LIMIT, what="signature file")
    except FileNotFoundError:
        raise MissingSignatureError(
            "the model has no signature: nothing vouches for its files",
            context=where,
            hint="sign it (`model_signing sign key MODEL --private_key KEY`) or name the "
            "signature with --signature",
        ) from None
    manifest, signed = read_oms_bundle(data, policy, context=where)
    own = _inside(model, where)
    listed = set(manifest.digests)
    git = [p for p in GIT_PATHS if not any(_ignored(n, [p]) for n in listed)]
    ignore = {*manifest.ignore_paths, *git, *([own] if own else [])}
    names = model_files(model, ignore=ignore)
    found = hash_files(model, [n for n in names if n in listed], algorithm=manifest.algorithm)
    problems = [f"  {n}: missing" for n in sorted(listed - set(names))]
    problems += [f"  {n}: not signed (added after signing)" for n in names if n not in listed]
    problems += [
        f"  {n}: {manifest.algorithm} {found[n][:12]}… on disk, {manifest.digests[n][:12]}… signed"
        for n in sorted(found)
        if found[n] != manifest.digests[n]
    ]
    if problems:
        bad = tuple(p.strip().split(":")[0] for p in problems)
        raise SignedDigestError(
            "\n".join(
                [
                    f"{len(problems)} file(s) differ from what key {signed.key.short}… signed:",
                    *cap_lines(problems),
                ]
            ),
            names=bad,
            fingerprint=signed.key.fingerprint,
            context=model,
            hint="do not use this model; get a fresh copy from where it was signed",
        )
    return SignedModel(manifest=manifest, key=signed.key, signature=where)
