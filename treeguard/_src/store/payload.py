"""What a version holds, behind one interface: a checkpoint file or a
sharded checkpoint.

A version's record names its kind (``file`` or ``sharded``); ``of(record)``
gives the payload that knows how to read, re-check and load that kind. The
store never branches on the kind itself.

- ``FilePayload``: ``model.safetensors``; its digest is the header digest
  (which covers every tensor's hash).
- ``ShardedPayload``: ``save_sharded``'s manifest and data directories in
  the version's directory; its digest is the manifest's, and since the
  manifest alone does not prove the bytes, a full check reads every shard
  again. Its directory is walked before any use: a link, FIFO, socket or
  device anywhere in it is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar

from ..checkpoint import read_header
from ..errors import FormatError, IntegrityError, TreeMismatchError
from ..sharded.manifest import read as read_manifest
from ..sharded.manifest import sharded_digest
from ..spec import TreeSpec, spec_of
from . import gates
from .checks import Check, run_checks
from .layout import MODEL_FILE, Layout
from .records import CheckRecord, is_sharded

#: What ``judge`` returns: the check results, the reason for a rejection
#: (None when every check passed), and the digest the verdict was computed
#: on (None when the version could not be read).
Verdict = tuple[list[CheckRecord], str | None, str | None]


def shardable(like: Any) -> bool:
    """Whether ``like`` is a tree whose every leaf carries a sharding to
    restore onto (a ``jax.Array`` or a ``jax.ShapeDtypeStruct`` with one)."""
    if like is None or isinstance(like, TreeSpec):
        return False
    import jax  # lazy: jax is imported only where a sharded tree can be

    leaves = jax.tree.leaves(like)
    return bool(leaves) and all(
        isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and getattr(x, "sharding", None)
        for x in leaves
    )


def format_contract(e: TreeMismatchError, contract_name: str) -> str:
    """A contract failure's text with the contract named (no file path)."""
    return str(
        TreeMismatchError(e.mismatches, expected_from=contract_name, actual_from=e.actual_from)
    )


class FilePayload:
    """A version that holds one checkpoint file."""

    kind: ClassVar[str] = "file"
    #: whether loading it onto shardings is a collective of every process
    collective: ClassVar[bool] = False
    evidence: ClassVar[tuple[str, str]] = ("header valid", "header and every tensor hash match")

    def location(self, version_dir: str) -> str:
        """The path the checkpoint readers take: the file."""
        return os.path.join(version_dir, MODEL_FILE)

    def check_plain(self, layout: Layout, version_dir: str, version: str) -> None:
        """Nothing to walk: the file is opened without following links."""

    def stored_spec(self, version_dir: str) -> TreeSpec:
        return read_header(self.location(version_dir)).spec

    def digest_now(self, version_dir: str) -> str:
        return read_header(self.location(version_dir)).digest

    def recheck(self, version_dir: str, digest: str) -> None:
        """Reads every byte again and refuses another digest."""
        gates.verify_expecting(self.location(version_dir), digest=digest)

    def load(
        self,
        version: str,
        version_dir: str,
        like: Any,
        digest: str | None,
        *,
        subtree: str | None = None,
        ignore: Collection[str] = (),
    ) -> Any:
        return gates.load_expecting(
            self.location(version_dir), like=like, digest=digest, subtree=subtree, ignore=ignore
        )

    def read_for_verdict(
        self, layout: Layout, version_dir: str, version: str, contract: Any, digests: list[str]
    ) -> Any:
        """Loads the version against ``contract``, leaving the digest it
        read under in ``digests`` before any array is read."""
        model = self.location(version_dir)
        digests.append(read_header(model).digest)
        return gates.load_expecting(model, like=contract, digest=digests[0])


class ShardedPayload:
    """A version that holds ``save_sharded``'s manifest and data."""

    kind: ClassVar[str] = "sharded"
    collective: ClassVar[bool] = True
    evidence: ClassVar[tuple[str, str]] = (
        "manifest valid",
        "manifest and every shard's digest match",
    )

    def location(self, version_dir: str) -> str:
        """The path the sharded readers take: the version's directory."""
        return version_dir

    def check_plain(self, layout: Layout, version_dir: str, version: str) -> None:
        layout.plain_tree(version_dir, version=version)

    def stored_spec(self, version_dir: str) -> TreeSpec:
        return read_manifest(version_dir).spec

    def digest_now(self, version_dir: str) -> str:
        return sharded_digest(version_dir)

    def recheck(self, version_dir: str, digest: str) -> None:
        """Reads every shard again in this process and hashes it."""
        gates.recheck_sharded(version_dir, digest=digest)

    def load(
        self,
        version: str,
        version_dir: str,
        like: Any,
        digest: str | None,
        *,
        subtree: str | None = None,
        ignore: Collection[str] = (),
    ) -> Any:
        if not shardable(like):
            raise ValueError(
                f"version {version} is sharded: `like` must be a tree of jax.Arrays or "
                "jax.ShapeDtypeStructs with shardings, the layout to restore onto\n"
                "hint: `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, "
                "spec))` for each leaf"
            )
        return gates.load_sharded_expecting(
            version_dir, like=like, digest=digest, subtree=subtree, ignore=ignore
        )

    def read_for_verdict(
        self, layout: Layout, version_dir: str, version: str, contract: Any, digests: list[str]
    ) -> Any:
        """Onto ``contract``'s shardings when it has them (every process of
        a job calls verify then), else whole onto this process's first device."""
        from ..sharded.load import contract_mismatches  # lazy: orbax and tensorstore
        from ..sharded.recheck import read_local  # lazy: orbax and tensorstore

        layout.plain_tree(version_dir, version=version)
        digests.append(sharded_digest(version_dir))
        if shardable(contract):
            return gates.load_sharded_expecting(version_dir, like=contract, digest=digests[0])
        manifest = read_manifest(version_dir)
        if contract is not None:
            want = contract if isinstance(contract, TreeSpec) else spec_of(contract)
            found = contract_mismatches(manifest.spec, want)
            if found:
                raise TreeMismatchError(found, expected_from="`like`", actual_from="the checkpoint")
        return read_local(version_dir, digest=digests[0])[2]


Payload = FilePayload | ShardedPayload

_FILE = FilePayload()
_SHARDED = ShardedPayload()


def of(record: dict[str, Any]) -> Payload:
    """The payload of a validated record's kind."""
    return _SHARDED if is_sharded(record) else _FILE


def digest_now(version_dir: str, record: dict[str, Any]) -> str | None:
    """The digest of the checkpoint there now (header or manifest), or None."""
    try:
        return of(record).digest_now(version_dir)
    except (FormatError, OSError):
        return None


def judge(
    load: Callable[[list[str]], Any],
    evidence: tuple[str, str],
    contract_name: str,
    checks: Sequence[Check],
) -> Verdict:
    """Loads a version for its verdict and runs the checks on it.

    Args:
      load: reads the version against the contract; appends the digest it
        read under to the list it is given before it reads any array.
      evidence: the integrity check's evidence when the contract fails (the
        header or manifest was valid) and when every hash matched.
      contract_name: how the contract is named in the evidence.
      checks: the caller's checks, run on the loaded tree.
    """
    valid, verified = evidence
    digests: list[str] = []
    try:
        tree = load(digests)
    except TreeMismatchError as e:
        text = format_contract(e, contract_name)
        results = [CheckRecord("integrity", True, valid), CheckRecord("contract", False, text)]
        return results, f"contract: {text}", digests[0] if digests else None
    except (IntegrityError, FormatError, OSError) as e:
        return [CheckRecord("integrity", False, str(e))], f"integrity: {e}", None
    results = [
        CheckRecord("integrity", True, verified),
        CheckRecord("contract", True, f"matches {contract_name}"),
    ]
    more, reason = run_checks(tree, checks)
    return results + more, reason, digests[0]
