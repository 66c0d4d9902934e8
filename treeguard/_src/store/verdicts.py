"""A version's verdict: judged, recorded once, signed, and checked before
its status is trusted.

``verify`` reads a version against its contract and runs the caller's
checks (``judge``); a read that fails is read again, and only bytes wrong on
every try are a verdict, never a failed read (``_read_steadily``). The
``Judgement`` is recorded in one place, ``_record`` (in a multi-process job,
the one every process agrees on, written by process 0), bound to the digest
it was computed on and signed by the store's ``VerdictSigner`` (signing.py)
where it has one. ``check_verdict`` is the rule every gate applies to a recorded
verdict, ``verified`` or ``rejected`` alike: in a store with a signer it
must carry a signature the signer accepts, and a store that has ever
signed is never used without one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import strictjson
from ..env import environment
from ..errors import (
    FormatError,
    IntegrityError,
    SignatureError,
    StorageError,
    StoreError,
    TreeguardError,
    TreeMismatchError,
)
from ..provenance.errors import ProvenanceError
from . import exported, objecterrors, payload, pointer, records
from .backend import Backend, record_of
from .checks import Check, run_checks
from .lead import lead_acts
from .payload import shardable
from .records import CheckRecord, VersionInfo
from .signing import KEY_ENV, VerdictSigner

#: The statuses a verdict records; each is signed, and checked, alike.
VERDICTS = ("verified", "rejected")
#: How many times verify reads a version before it gives up without a verdict.
READS = 3
#: The pause before the second read (doubled before each next one).
_PAUSE = 0.1


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What ``judge`` found, before it is recorded.

    Attributes:
      results: every check's result, the integrity and contract checks first.
      reason: why the version is rejected; None when every check passed.
      digest: the digest of the bytes it was computed on (None when the
        version could not be read).
      contract: how the contract was named (``"`like`"``, a version).
    """

    results: list[CheckRecord]
    reason: str | None
    digest: str | None
    contract: str

    def verdict(self) -> dict[str, Any]:
        """The verdict's fields as a record keeps them, not yet signed."""
        return {
            "status": "rejected" if self.reason else "verified",
            "reason": self.reason,
            "checks": [dataclasses.asdict(r) for r in self.results],
            "contract": self.contract,
            "digest": self.digest,
            "verified_env": environment(),
            "signature": None,
            "updated": records.now(),
        }


def format_contract(e: TreeMismatchError, contract_name: str) -> str:
    """A contract failure's text with the contract named (no file path)."""
    return str(
        TreeMismatchError(e.mismatches, expected_from=contract_name, actual_from=e.actual_from)
    )


def judge(
    load: Callable[[list[str]], Any],
    evidence: tuple[str, str],
    contract_name: str,
    checks: Sequence[Check],
) -> Judgement:
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
        return Judgement(
            results, f"contract: {text}", digests[0] if digests else None, contract_name
        )
    except (IntegrityError, FormatError) as e:  # about the bytes; never a failed read
        return Judgement(
            [CheckRecord("integrity", False, str(e))], f"integrity: {e}", None, contract_name
        )
    results = [
        CheckRecord("integrity", True, verified),
        CheckRecord("contract", True, f"matches {contract_name}"),
    ]
    more, reason = run_checks(tree, checks)
    return Judgement(results + more, reason, digests[0], contract_name)


def message(store_id: str, version: str, record: dict[str, Any]) -> bytes:
    """The bytes a verdict's signature covers: the store's id, the version,
    its uid, the digest, the status, the reason, the checks (and the kind
    of a version that is not a file, and the digest of the exported
    artifact the verdict covers, when it covers one)."""
    signed = {
        "store": store_id,
        "version": version,
        "uid": record.get("uid"),
        "digest": record.get("digest"),
        "status": record.get("status"),
        "reason": record.get("reason"),
        "checks": record.get("checks") or [],
    }
    if record.get("kind", "file") != "file":  # absent from older records, signed without it
        signed["kind"] = record["kind"]
    if isinstance(record.get("exported"), str):  # absent from verdicts without an artifact
        signed["exported"] = record["exported"]
    return strictjson.dumps(signed).encode("ascii")


def check_verdict(
    signer: VerdictSigner | None, marker: dict[str, Any], version: str, record: dict[str, Any]
) -> None:
    """Checks the signature of a version's verdict, whatever its status,
    before the status is trusted: a forged ``rejected`` is refused as
    forged, as a forged ``verified`` is. A candidate has no verdict.

    Args:
      signer: the store's signer, or None.
      marker: the store's marker (its id is signed with each verdict; its
        ``signed`` flag says whether the store has ever signed one).
      version: the version.
      record: its record.

    Raises:
      SignatureError: with a signer, for a verdict that is unsigned or whose
        signature the signer does not accept; without one, for a verdict
        of a signed store or one that carries a signature.
    """
    if record["status"] not in VERDICTS:
        return
    if signer is None:
        if marker.get("signed") or isinstance(record.get("signature"), str):
            raise unkeyed(version)
        return
    got = record.get("signature")
    if not isinstance(got, str):
        raise SignatureError(
            f"version {version}'s verdict is not signed, and this store has a key",
            version=version,
            hint=f"verify it again with the key (store.verify({version!r})) to sign it",
        )
    try:
        why = signer.verify(message(str(marker["id"]), version, record), got)
    except ProvenanceError as e:  # an EC signer's refusal, typed: it gains the version
        raise type(e)(
            f"version {version}'s verdict is refused: {e.message}",
            fingerprint=e.fingerprint,
            version=version,
            hint=e.hint,
        ) from None
    if why is not None:
        raise SignatureError(
            f"version {version}'s verdict signature does not match: {why}",
            version=version,
            hint="do not trust this version; verify it again with the right key",
        )


def unkeyed(version: str | None) -> SignatureError:
    """The error of a signed store opened without its key."""
    return SignatureError(
        "this store signs its verdicts, and it was opened without its key: no verdict "
        "can be trusted or written",
        version=version,
        hint=f"open it with its key (key=..., or ${KEY_ENV} naming the key file), or with "
        "its EC keys (trusted_keys=..., --trusted-key, $TREEGUARD_TRUSTED_KEYS)",
    )


def verify(
    backend: Backend,
    signer: VerdictSigner | None,
    version: str,
    like: Any,
    checks: Sequence[Check],
) -> VersionInfo:
    """``ArtifactStore.verify``: judges ``version`` against ``like`` (else the
    current version's spec, else its own) and records the verdict."""
    location, before = record_of(backend, version)
    try:
        backend.verifiable(version, location, before)
    except StoreError as refused:  # by the verdict it holds (a bucket's): is that one forged?
        _refusing(backend, signer, version, before, refused)
        raise
    if signer is None and backend.require().get("signed"):
        raise unkeyed(version)
    if signer is not None:
        signer.require_signing()  # before any byte is read: a checker that cannot sign
    contract, contract_name = _contract(backend, version, like)
    # the exported artifact the verdict will cover, as it is before the read
    covers = exported.digest_now(backend, version)
    kind = payload.of(before)
    together = kind.collective and shardable(like) and _processes() > 1
    # a collective read is tried once: every process tries again, or none does
    tries = 1 if together else READS

    def read(digests: list[str]) -> Any:
        return _read_steadily(backend, version, (before, contract), digests, tries)

    if not together:
        return _record(
            backend,
            signer,
            version,
            (before, covers),
            judge(read, kind.evidence, contract_name, checks),
        )
    try:
        mine: Judgement | StorageError = judge(read, kind.evidence, contract_name, checks)
    except StorageError as failed:  # no verdict: every process must hear it
        mine = failed
    agreed = _agreed(version, mine)

    def record() -> bytes:  # process 0 records what every process agreed on
        _record(backend, signer, version, (before, covers), agreed)
        return b""

    lead_acts(
        record,
        failed=lambda why: StoreError(
            f"process 0 could not record the verdict on {version}: {why}",
            version=version,
            hint=f"verify it again: store.verify({version!r})",
        ),
    )
    return records.info(version, *record_of(backend, version))


def _processes() -> int:
    """How many processes the job has."""
    from ..sharded import hosts  # lazy: jax's multi-process utilities

    return hosts.process_count()


def _read_steadily(
    backend: Backend,
    version: str,
    against: tuple[dict[str, Any], Any],
    digests: list[str],
    tries: int,
) -> Any:
    """The version read for its verdict (``against``: its record and the
    contract), which stands once recorded: a read that fails is tried again
    (up to ``tries`` times), so a transient failure (a file held by another
    process for a moment, a short or broken answer, a replaced ETag, the
    network) never becomes a permanent ``rejected``. A tree of another
    structure is a verdict at once; bytes that are wrong on every try
    (``_about_the_bytes``) are one too. Any other failure is a
    ``StorageError``, and no verdict is recorded."""
    record, contract = against
    failures: list[Exception] = []
    pause = _PAUSE
    for attempt in range(tries):
        if attempt:
            time.sleep(pause)
            pause *= 2
        digests.clear()
        try:
            return backend.read_for_verdict(version, record, contract, digests)
        except TreeMismatchError:
            raise  # the bytes read, every hash checked, are of another structure
        except (IntegrityError, FormatError, StorageError, OSError) as e:
            failures.append(e)
    if all(_about_the_bytes(e) for e in failures):
        raise failures[-1]
    last = failures[-1]
    why = last.message if isinstance(last, TreeguardError) else str(last)
    raise StorageError(
        f"reading version {version} for its verdict failed {len(failures)} times "
        f"(last: {why.splitlines()[0]}); no verdict was recorded",
        version=version,
        context=backend.storage.where(f"versions/{version}"),
        hint="check the disk or the server and what else opens the version, then verify it "
        f"again: store.verify({version!r})",
    ) from failures[-1]


def _about_the_bytes(e: Exception) -> bool:
    """Whether a failed read for a verdict says the bytes are wrong: they
    hash wrong, or are no checkpoint, as read whole; not a read that failed
    (``gates.reading`` makes those an ``IntegrityError`` caused by the
    failure: a broken or short answer, a replaced object, an ``OSError``),
    nor anything caused, however deep, by a request to object storage that
    failed (a ``StorageError``: the network, the server, an answer that
    contradicts itself or the object's HEAD)."""
    if objecterrors.from_a_request(e):
        return False
    if isinstance(e, IntegrityError):
        return not isinstance(e.__cause__, (FormatError, OSError))
    return isinstance(e, FormatError)


def _agreed(version: str, mine: Judgement | StorageError) -> Judgement:
    """In a multi-process job, the verdict every process agrees on: none if
    any process could not read the version (each raises), else the first
    reason any gives.

    Raises:
      StorageError: in every process, if one could not read the version.
    """
    from ..sharded import hosts  # lazy: jax's multi-process utilities

    if isinstance(mine, StorageError):
        said = b"!" + mine.message.splitlines()[0].encode("utf-8")
    else:
        said = b"=" + (mine.reason or "").encode("utf-8")
    heard = [h.decode("utf-8", "replace") for h in hosts.allgather_bytes(said)]
    failed = next((h[1:] for h in heard if h.startswith("!")), None)
    if isinstance(mine, StorageError):
        raise mine
    if failed is not None:
        raise StorageError(
            f"another process could not read version {version} for its verdict ({failed})",
            version=version,
            hint=f"see that process's error, then verify it again: store.verify({version!r})",
        )
    first = next((h[1:] for h in heard if h[1:]), None)
    if first is not None and mine.reason is None:
        return dataclasses.replace(
            mine,
            results=[*mine.results, CheckRecord("other processes", False, first)],
            reason=first,
        )
    return mine


def _contract(backend: Backend, version: str, like: Any) -> tuple[Any, str]:
    """What ``version`` must match, and how it is named: ``like``, else the
    current version's stored spec, else nothing but its own."""
    if like is not None:
        return like, "`like`"
    cur = pointer.of_store(backend).current
    if cur is not None and cur != version:
        return backend.stored_spec(cur, *record_of(backend, cur)), f"version {cur} (current)"
    return None, "its own stored spec"


def _refusing(
    backend: Backend,
    signer: VerdictSigner | None,
    version: str,
    before: dict[str, Any],
    refused: StoreError,
) -> None:
    """Names a forged verdict that stands in the way of a new one as forged.

    Raises:
      SignatureError: if the verdict ``refused`` stands on is forged.
    """
    try:
        check_verdict(signer, backend.require(), version, before)
    except SignatureError as e:
        raise SignatureError(
            f"{e.message}; {refused.message}",
            version=version,
            context=refused.context,
            hint=refused.hint,
        ) from e


def forged(
    backend: Backend, signer: VerdictSigner | None, versions: Sequence[VersionInfo]
) -> dict[str, str]:
    """Each of ``versions`` whose verdict ``signer`` does not vouch for, with
    why; empty without a signer (see ``ArtifactStore.forged_verdicts``)."""
    marker = backend.require()
    if signer is None:
        return {}
    out: dict[str, str] = {}
    for info in versions:
        if info.status in VERDICTS:
            try:
                check_verdict(signer, marker, info.version, backend.record(info.version)[1])
            except SignatureError as e:
                out[info.version] = e.message
            except StoreError:
                continue  # changed since it was listed (gc's remove() reads it again)
    return out


def _record(
    backend: Backend,
    signer: VerdictSigner | None,
    version: str,
    seen: tuple[dict[str, Any], str | None],
    judgement: Judgement,
) -> VersionInfo:
    """The one place a verdict is written: under the lock, only on the
    version it was judged on (``seen``: its record and its exported
    artifact's digest before the read), signed, then logged."""
    before, covers = seen
    verdict = judgement.verdict() | {"exported": covers}
    digest = judgement.digest
    with backend.locked():
        location, data = record_of(backend, version)
        if (
            data.get("uid") != before.get("uid")
            or (digest is not None and backend.digest_now(version, location, data) != digest)
            or exported.digest_now(backend, version) != covers
        ):
            raise StoreError(
                f"version {version} was replaced while it was verified; no verdict recorded",
                version=version,
                hint=f"verify it again: store.verify({version!r})",
            )
        marker = backend.require()
        if signer is not None:
            # from now on the store refuses to be used without the key
            marker = backend.mark("signed")
            verdict["signature"] = signer.sign(message(str(marker["id"]), version, data | verdict))
        elif marker.get("signed"):
            raise unkeyed(version)
        data = backend.save_verdict(version, data, verdict)
        backend.append("verify", version, {"status": verdict["status"], "reason": judgement.reason})
    return records.info(version, location, data)
