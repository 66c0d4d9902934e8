"""Versions in and out of a store as models signed in the OpenSSF Model
Signing format (the ``sign`` extra).

Out (``export``): a verified version whose verdict the store's keys vouch
for is copied to a new directory, the copy checked against the verdict's
digest (every tensor re-hashed), then signed with the store's signing key:
``DIR/model.safetensors`` and ``DIR/model.sig``, which ``model_signing
verify key DIR --signature DIR/model.sig --public_key KEY.pub`` accepts.

In (``add``): a model file or directory signed by ``model_signing sign
key`` is copied into a private staging directory (links, FIFOs and devices
refused), checked there against its signature (a trusted, unrevoked key;
every file its signed digest), and only then its one safetensors file is
read (a treeguard checkpoint with every hash checked, a foreign one by its
structure) and put as a candidate, with the signer and the signed digests
in its metadata. A refused model leaves nothing in the store.

Both work on a store in a local directory or a bucket; export writes a
file version as ``model.safetensors`` and a sharded version as its manifest
and data directory, each checked on the copy before it is signed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..atomic import current_umask, fsync_dir, open_regular, write_all
from ..checkpoint import read_foreign
from ..errors import FormatError, StoreError
from ..hashing import Source, pread_into, source_size
from ..provenance.errors import ProvenanceError
from ..sharded.manifest import MANIFEST_NAME
from ..sharded.manifest import read as read_manifest
from . import gates, payload
from .backend import Backend, Record
from .layout import MODEL_FILE
from .objects import is_url
from .records import is_sharded
from .signing import VerdictSigner

if TYPE_CHECKING:
    from ..provenance.oms import ModelManifest
    from ..provenance.verdicts import EcSigner

#: The key under which a model added with ``add`` records where it came from.
SIGNED_BY = "signed_model"

#: The bytes a copy moves at a time.
COPY_CHUNK = 8 * 1024 * 1024


def _ec(signer: VerdictSigner | None, what: str) -> EcSigner:
    # the sign extra (cryptography): imported when a signed model is asked for
    from ..provenance.verdicts import EcSigner

    if not isinstance(signer, EcSigner):
        raise ProvenanceError(
            f"{what} needs a store opened with EC keys",
            hint="open the store with --signing-key / --trusted-key (signing_key=, trusted_keys=)",
        )
    return signer


def export(
    backend: Backend, signer: VerdictSigner | None, version: str, directory: str
) -> ModelManifest:
    """Writes ``version`` to ``directory`` with its OMS signature (see the module).

    Raises:
      ProvenanceError: without a signing key.
      StoreError, SignatureError, IntegrityError: for a version that fails a
        gate, or a copy whose bytes are not the verdict's.
      FileExistsError: if ``directory`` exists; nothing is written.
    """
    ec = _ec(signer, "export")
    from ..provenance.model import sign_model  # the sign extra, as in _ec

    if ec.key is None:
        raise ProvenanceError(
            "export signs the model, and this store holds public keys only",
            hint="open the store with its signing key (--signing-key)",
        )
    location, record, digest = gates.gate(backend, signer, version, full=False)
    target = os.path.abspath(directory)
    if os.path.lexists(target):
        raise FileExistsError(f"{target}: already exists; export writes a new directory")
    parent = os.path.dirname(target)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
    try:
        _checked_copy(backend, version, (location, record, digest), staging)
        manifest = sign_model(staging, ec.key, name=os.path.basename(target))
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp made it 0700
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(parent)
    return manifest


def _checked_copy(
    backend: Backend, version: str, gated: tuple[str, Record, str], staging: str
) -> None:
    """Copies the version's checkpoint (its file, or a sharded version's
    manifest and data) into ``staging``, then reads the copy again, every
    tensor or shard hashed, refusing any digest but the verdict's."""
    location, record, digest = gated
    if is_sharded(record) and is_url(location):
        raise StoreError(
            f"version {version} is sharded and kept in a bucket: exporting it is not supported",
            version=version,
            context=location,
            hint="load it onto a mesh with store.load_verified(version, like), or put the tree "
            "whole (store.put) and export that version",
        )
    if is_sharded(record):
        _copy_sharded(location, staging)
    else:  # a tensors version is written as the one file it stands for
        with backend.checkpoint_source(version, location) as source:
            _copy_from(source, os.path.join(staging, MODEL_FILE))
    # the bytes shipped are the verdict's: every tensor re-hashed on the copy
    with gates.reading(version, since="verified", where=location):
        payload.exported_as(record).recheck(staging, digest)


def _copy_sharded(source: str, staging: str) -> None:
    """Copies a sharded checkpoint's manifest and the data directory it
    names (regular files and real directories only) into ``staging``.

    Raises:
      FormatError: for a link or special file in it.
    """
    data = read_manifest(source).data
    _copy(os.path.join(source, MANIFEST_NAME), os.path.join(staging, MANIFEST_NAME))
    top = os.path.join(source, data)
    for here, dirs, files in os.walk(top):
        rel = os.path.relpath(here, source)
        os.makedirs(os.path.join(staging, rel))
        for name in dirs:
            if os.path.islink(os.path.join(here, name)):
                raise FormatError(f"{os.path.join(here, name)}: a link in a sharded checkpoint")
        for name in files:
            _copy(os.path.join(here, name), os.path.join(staging, rel, name))


def _copy(src: str, dst: str) -> None:
    fd = open_regular(src, what="file")
    try:
        _copy_from(fd, dst)
    finally:
        os.close(fd)


def _copy_from(source: Source, dst: str) -> None:
    """Copies every byte of ``source`` (a descriptor or a ``RangeReader``)
    to the new file ``dst``, fsynced.

    Raises:
      FormatError: if the source ends before its size (a file that shrank).
    """
    size = source_size(source)
    buf = memoryview(bytearray(min(size, COPY_CHUNK) or 1))
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        offset = 0
        while offset < size:
            n = pread_into(source, buf[: min(len(buf), size - offset)], offset)
            if n == 0:
                raise FormatError(f"{dst}: its source ended at byte {offset} of {size}")
            write_all(out, buf[:n])
            offset += n
        os.fsync(out)
    finally:
        os.close(out)


def add(
    signer: VerdictSigner | None,
    model: str,
    *,
    signature: str | None,
    metadata: Mapping[str, Any] | None,
) -> tuple[Any, dict[str, Any]]:
    """Checks a signed model (see the module) and returns its tree and the
    metadata to put it with; the caller puts it.

    Raises:
      ProvenanceError: without trusted keys; and its kinds for a model whose
        signature is missing, does not verify, is by an untrusted or revoked
        key, or whose files differ from what was signed.
      FormatError: for a link or special file in the model, a signature that
        is not an OMS bundle, or a model without exactly one safetensors file.
    """
    ec = _ec(signer, "adding a signed model")
    from ..provenance.model import default_signature, verify_model  # the sign extra, as in _ec

    if not ec.policy.trusted:
        raise ProvenanceError(
            "adding a signed model needs trusted keys: none is given",
            hint="name the signer's public key with --trusted-key (trusted_keys=)",
        )
    source = os.fspath(model)
    sig = os.fspath(signature) if signature is not None else default_signature(source)
    with tempfile.TemporaryDirectory(prefix="treeguard-add-") as private:
        staged, staged_sig = _stage(source, sig, private)
        try:
            signed = verify_model(staged, policy=ec.policy, signature=staged_sig)
        except ProvenanceError as e:  # checked on the private copy; said of the user's path
            raise e.at(source) from None
        names = [n for n in signed.manifest.digests if n == "." or n.endswith(".safetensors")]
        if len(names) != 1:
            raise StoreError(
                f"the signed model holds {len(names)} safetensors files; a version holds one",
                context=source,
                hint="sign a directory with one .safetensors file (other files are checked, "
                "and kept only in the record of what was signed)",
            )
        weights = staged if names[0] == "." else os.path.join(staged, names[0])
        tree = read_foreign(weights)
    user = dict(metadata or {})
    user[SIGNED_BY] = {
        "fingerprint": signed.key.fingerprint,
        "algorithm": signed.key.algorithm,
        "hash_type": signed.manifest.algorithm,
        "digests": dict(signed.manifest.digests),
        "model": signed.manifest.name,
    }
    return tree, user


def _stage(source: str, signature: str, private: str) -> tuple[str, str]:
    """Copies the model (refusing links and special files) and its signature
    into ``private``; returns the copies' paths (the signature's own path
    when there is none, for ``verify_model`` to report it missing)."""
    staged_sig = signature
    if os.path.lexists(signature):
        staged_sig = os.path.join(private, "signature.sig")
        _copy(signature, staged_sig)
    if not os.path.isdir(source):
        staged = os.path.join(private, os.path.basename(source))
        _copy(source, staged)
        return staged, staged_sig
    from ..provenance.model import model_files  # the sign extra, as in _ec

    staged = os.path.join(private, "model")
    own = os.path.relpath(os.path.abspath(signature), os.path.abspath(source))
    for rel in model_files(source, ignore=[own.replace(os.sep, "/")]):
        dst = os.path.join(staged, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        _copy(os.path.join(source, rel), dst)
    return staged, staged_sig


class SignedModels:
    """``ArtifactStore``'s faces of this module, over its backend and signer."""

    _backend: Backend
    _signer: VerdictSigner | None
    put: Callable[..., Any]

    def add_signed(
        self,
        model: str | os.PathLike[str],
        /,
        *,
        signature: str | os.PathLike[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Puts a model signed with OpenSSF Model Signing (``model_signing sign
        key``) as a candidate, only if a trusted, unrevoked key signed it and
        every file matches its signed digest.

        The model is copied into a private directory first and checked there,
        so the bytes put are the bytes checked. Its one ``.safetensors`` file
        becomes the version (a treeguard checkpoint with every hash checked,
        or a foreign one matched by name); the signer's fingerprint, the
        algorithm and every signed digest are kept in its metadata under
        ``"signed_model"``. A refused model leaves nothing in the store.

        Args:
          model: a model file or directory.
          signature: its signature (``DIR/model.sig`` or ``FILE.sig`` if None).
          metadata: more JSON metadata for the version.

        Returns:
          The new candidate's name.

        Raises:
          ProvenanceError: for a store without trusted EC keys, and its kinds
            (``MissingSignatureError``, ``BadSignatureError``,
            ``UntrustedKeyError``, ``RevokedKeyError``, ``SignedDigestError``)
            for a model that is refused.
          FormatError: for a link or special file in the model, or a
            signature that is not an OMS v1.0 bundle.
          StoreError: for a model without exactly one safetensors file.
        """
        tree, user = add(
            self._signer,
            os.fspath(model),
            signature=None if signature is None else os.fspath(signature),
            metadata=metadata,
        )
        name: str = self.put(tree, metadata=user)
        return name

    def export(self, version: str, directory: str | os.PathLike[str], /) -> Any:
        """Writes a verified version to a new directory with its OpenSSF Model
        Signing signature, which ``model_signing verify key DIRECTORY
        --signature DIRECTORY/model.sig --public_key KEY.pub`` accepts.

        The version passes the gates (verified, its verdict signed by a
        trusted, unrevoked key), its file is copied and the copy re-hashed
        against the verdict's digest, then the directory is signed with the
        store's signing key and renamed into place: a refusal leaves nothing.

        Args:
          version: a verified version (a file version is written as
            ``model.safetensors``, a sharded one as its manifest and data).
          directory: where to write it; it must not exist.

        Returns:
          The signed ``ModelManifest`` (each file's sha256).

        Raises:
          ProvenanceError: for a store without an EC signing key.
          StoreError, SignatureError, IntegrityError: for a version that
            fails a gate, or a copy whose bytes are not the verdict's.
          FileExistsError: if ``directory`` exists.
        """
        return export(self._backend, self._signer, version, os.fspath(directory))
