"""The ``treeguard store`` command group.

Exit codes, as for every treeguard command: 0 done, 1 refused, 2 usage or a
directory that is not a store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from .._src.display import fmt_bytes
from .._src.errors import StoreError
from .._src.export.listing import listed
from .._src.serving.verdicts import model_checks
from .._src.store import ArtifactStore, RetentionPolicy
from .ckpt import read_like
from .console import console, shown
from .failures import Group
from .loader import load_model
from .options import given_keys, key_options, like_option


@click.group("store", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def store() -> None:
    """Manage an artifact store: list, verify, promote, roll back, collect garbage, repair.

    Exit codes: 0 done; 1 refused (a version not verified, a changed file, a
    bad signature, no version to roll back to, a rejected verify); 2 usage or
    a directory that is not a store. With $TREEGUARD_STORE_KEY_FILE set,
    verdicts are signed (HMAC) and unsigned ones refused; with --signing-key
    (an EC private key) each verdict is signed with it, and with --trusted-key
    only verdicts signed by a trusted, unrevoked key count.

    ROOT is a directory or a bucket URL (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX);
    the client reads AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_REGION and AWS_ALLOW_HTTP from the environment.
    """


def _store(root: Path) -> ArtifactStore:
    """The store at ROOT, opened with the command's key options (or the
    environment's keys when none is given)."""
    return ArtifactStore(root, **given_keys())


def _open_store(root: Path) -> ArtifactStore:
    """Opens an existing store; reads nothing and creates nothing."""
    s = _store(root)
    s.current()  # a directory that is not a store, or a damaged pointer, stops here
    return s


@store.command("init")
@click.argument("root", type=click.Path(path_type=Path))
@click.option(
    "--dedup",
    is_flag=True,
    help="Store tensors once per content: each later put writes only the tensors "
    "the store does not hold (also turns it on for an existing store).",
)
def init_command(root: Path, dedup: bool) -> None:
    """Make ROOT a store (created if absent; an existing store is left as it is;
    a bucket prefix must be empty)."""
    s = ArtifactStore.init(root, dedup=dedup)
    console().print(f"[green]store[/green]: {shown(s.root)}")


_STATUS_STYLE = {
    "verified": "green",
    "rejected": "red",
    "candidate": "yellow",
    "writing": "dim",
    "unreadable": "red",
    "forged": "red",
}


@store.command("ls")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def ls_command(root: Path, as_json: bool) -> None:
    """List ROOT's versions with their status; the current one is marked.

    With $TREEGUARD_STORE_KEY_FILE set (or EC keys given), each verdict's
    signature is checked: one that fails is listed as forged, with what it
    claims in its reason. The signer column (and "trail" in --json: the
    algorithm, the key's fingerprint, the digest signed and when) says who
    each verdict's signature names. The exported column (and "exported" in
    --json) says what a version holds of an exported artifact (treeguard
    export): the platforms and the jax of one its verdict covers, else why
    a server would not take it (unverified, uncovered, changed, missing,
    unreadable, refused). An artifact's size is checked, none of its bytes
    read: a server hashes them all when it loads them.
    """
    s = _open_store(root)
    current, previous = s.current(), s.previous()
    versions = s.versions()
    signatures = _signatures(s, versions)
    artifacts = listed(s, versions)
    if as_json:
        listed_json = [_version_json(v, signatures, artifacts) for v in versions]
        head = {"root": s.root, "current": current, "previous": previous}
        click.echo(json.dumps(head | {"versions": listed_json}, indent=1))
        return
    table = Table(box=None, pad_edge=False)
    columns = (
        *("", "version", "status", "kind", "created", "params", "size", "checks"),
        *("exported", "signer"),
    )
    for col in (*columns, "reason"):
        table.add_column(col, overflow="fold")
    for v in versions:
        mark = "*" if v.version == current else ("<" if v.version == previous else "")
        status, reason = v.status, v.reason
        signature, why = signatures.get(v.version, (None, ""))
        if signature == "forged":
            status, reason = "forged", f"claims {v.status}: {why}"
        style = _STATUS_STYLE.get(status, "")
        reason = reason.splitlines()[0][:80] if reason else ""
        table.add_row(
            mark,
            shown(v.version),
            f"[{style}]{shown(status)}[/{style}]" if style else shown(status),
            shown(v.kind),
            shown(v.created),
            f"{v.num_params:,}" if v.num_params is not None else "",
            fmt_bytes(v.nbytes) if v.nbytes is not None else "",
            _checks_cell(v),
            shown(artifacts[v.version].cell()) if v.version in artifacts else "",
            _signer_cell(v),
            shown(reason),
        )
    out = console()
    out.print(
        f"[bold]{shown(s.root)}[/bold]  current: {current or 'none'}  "
        f"previous: {previous or 'none'}"
    )
    out.print(table)


def _version_json(
    v: Any, signatures: dict[str, tuple[str, str]], artifacts: dict[str, Any]
) -> dict[str, Any]:
    """One version as ``store ls --json`` lists it."""
    return {
        "version": v.version,
        "status": v.status,
        "signature": signatures.get(v.version, (None, ""))[0],
        "trail": _trail_json(v),
        "kind": v.kind,
        "reason": v.reason,
        "created": v.created,
        "num_params": v.num_params,
        "nbytes": v.nbytes,
        "metadata": v.metadata,
        "checks": model_checks(v.checks),  # the model's release checks
        "exported": artifacts[v.version].as_json() if v.version in artifacts else None,
    }


def _signatures(s: ArtifactStore, versions: list[Any]) -> dict[str, tuple[str, str]]:
    """In a store opened with its key: each verdict's signature, ``valid`` or
    ``forged`` with why. Without a key nothing can be told apart (empty)."""
    if not s.signed:
        return {}
    forged = s.forged_verdicts(versions)
    return {
        v.version: ("forged", forged[v.version]) if v.version in forged else ("valid", "")
        for v in versions
        if v.status in ("verified", "rejected")
    }


def _trail_json(v: Any) -> dict[str, Any] | None:
    """Who signed the verdict (by its signature, checked or not), what and when."""
    trail = v.trail()
    return None if trail is None else trail.as_json(digest=v.digest, signed_at=v.updated)


def _signer_cell(v: Any) -> str:
    """The verdict's signer: an EC key's fingerprint (first 16 digits), or ``hmac``."""
    trail = v.trail()
    if trail is None:
        return ""
    return "hmac" if trail.fingerprint is None else f"{trail.fingerprint[:16]}…"


def _checks_cell(v: Any) -> str:
    """The model's release checks a verdict ran; ``[]`` for none."""
    if v.status not in ("verified", "rejected"):
        return ""
    names = model_checks(v.checks)
    return ", ".join(n.removeprefix("model.") for n in names) if names else "[]"


@store.command("verify")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
@like_option("VERSION must match")
# -- the model's release checks (serving) --
@click.option(
    "--model",
    "model_target",
    metavar="MODULE:ATTR",
    default=None,
    help="Also run the model's checks (contract, finite, outputs) before the verdict.",
)
def store_verify_command(
    root: Path, version: str, like: Path | None, model_target: str | None
) -> None:
    """Verify VERSION (hashes and contract) and record verified or rejected.

    With --model, the model's release checks run too; a verdict without them
    records no model check, and `treeguard serve` refuses it unless
    --allow-unchecked.
    """
    s = _open_store(root)
    spec = read_like(like)
    if model_target is None:
        info = s.verify(version, like=spec)
    else:
        # The release checks import JAX: only once a model is asked for.
        from .._src.serving.release import verify_version

        model = load_model(model_target, command="store verify")
        info = verify_version(s, version, model, like=spec)
    # -- end of the model's release checks --
    if info.status == "verified":
        console().print(f"[green]verified[/green]: {shown(version)}")
        return
    raise StoreError(f"{version} rejected: {info.reason}", version=version)


@store.command("promote")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
def promote_command(root: Path, version: str) -> None:
    """Make the verified VERSION current."""
    s = _open_store(root)
    s.promote(version)
    console().print(f"[green]current[/green]: {shown(version)}")


@store.command("export")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
@click.argument("directory", type=click.Path(path_type=Path))
def export_command(root: Path, version: str, directory: Path) -> None:
    """Write the verified VERSION to a new DIRECTORY, signed for OpenSSF Model Signing.

    DIRECTORY gets model.safetensors and model.sig, signed with
    --signing-key; `model_signing verify key DIRECTORY --signature
    DIRECTORY/model.sig --public_key KEY.pub` accepts it.
    """
    s = _open_store(root)
    manifest = s.export(version, directory)
    console().print(
        f"[green]exported[/green]: {shown(version)} to {shown(str(directory))} "
        f"({len(manifest.digests)} file(s), {manifest.algorithm}, signed)"
    )


@store.command("add")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--signature",
    type=click.Path(path_type=Path),
    default=None,
    help="The model's OMS signature (default: MODEL/model.sig, or MODEL.sig for a file).",
)
def add_command(root: Path, model: Path, signature: Path | None) -> None:
    """Put MODEL (a file or directory signed by `model_signing sign key`) as a candidate.

    Only with --trusted-key: the signature must be by a trusted, unrevoked
    key and every file must match its signed digest; otherwise nothing is
    written (exit 1). ROOT is made a store if it is not one yet, as by a put.
    """
    s = _store(root)
    version = s.add_signed(model, signature=signature)
    signed = s.info(version).metadata["signed_model"]
    console().print(
        f"[green]candidate[/green]: {shown(version)} signed by "
        f"{shown(signed['fingerprint'][:16])}… ({shown(signed['algorithm'])})"
    )


@store.command("rollback")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
def rollback_command(root: Path) -> None:
    """Return to the previous verified version."""
    s = _open_store(root)
    before = s.current()
    now = s.rollback()
    console().print(f"[green]rolled back[/green]: {shown(before)} -> {shown(now)}")


@store.command("repair")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
def repair_command(root: Path, version: str) -> None:
    """Point a damaged store at VERSION: for a pointer that names a version the
    store does not hold (gc stops on it), or a pointer missing or malformed.

    VERSION must pass every gate promote checks. The former versions the
    pointer remembers are kept, less those the store does not hold; the
    repair is logged with what it dropped.
    """
    dropped = _store(root).repair(version)
    console().print(
        f"[green]current[/green]: {shown(version)}; dropped from the pointer: "
        f"{shown(', '.join(dropped)) or 'nothing'}"
    )


@store.command("gc")
@key_options
@click.argument("root", type=click.Path(path_type=Path))
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="How many of the newest versions to keep.",
)
@click.option(
    "--orphan-grace",
    type=click.FloatRange(min=0),
    default=RetentionPolicy().orphan_grace_s,
    show_default=True,
    metavar="SECONDS",
    help="In a bucket, how old (by the bucket's clock) the data of a put with no"
    " record must be to be removed; 0 once no put is running.",
)
def gc_command(root: Path, keep: int, orphan_grace: float) -> None:
    """Remove old versions; never the current or a former current one."""
    s = _open_store(root)
    removed = s.gc(policy=RetentionPolicy(keep_last=keep, orphan_grace_s=orphan_grace))
    console().print(f"removed {len(removed)}: {shown(', '.join(removed)) or 'nothing'}")
