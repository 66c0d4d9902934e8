"""The ``treeguard store`` command group.

Exit codes, as for every treeguard command: 0 done, 1 refused, 2 usage or a
directory that is not a store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.table import Table

from .._src.errors import (
    ConfigError,
    FormatError,
    IntegrityError,
    StoreError,
    UnknownVersionError,
)
from .._src.store import ArtifactStore, RetentionPolicy
from .ckpt import EXIT_FAIL, EXIT_USAGE, _exit, _human, _out, _read_like


@click.group("store", context_settings={"help_option_names": ["-h", "--help"]})
def store() -> None:
    """Manage an artifact store: list, verify, promote, roll back, collect garbage.

    Exit codes: 0 done; 1 refused (a version not verified, a changed file, a
    bad signature, no version to roll back to, a rejected verify); 2 usage or
    a directory that is not a store. With $TREEGUARD_STORE_KEY_FILE set,
    verdicts are signed and unsigned ones refused.

    ROOT is a directory or a bucket URL (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX);
    the client reads AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_REGION and AWS_ALLOW_HTTP from the environment.
    """


def _open_store(root: Path) -> ArtifactStore:
    """Opens an existing store; reads nothing and creates nothing."""
    try:
        s = ArtifactStore(root)
        s.current()  # a directory that is not a store, or a damaged pointer, stops here
    except (StoreError, ConfigError) as e:
        _exit(EXIT_USAGE, str(e))
    except OSError as e:
        _exit(EXIT_USAGE, f"{root}: {e}")
    return s


@store.command("init")
@click.argument("root", type=click.Path(path_type=Path))
def init_command(root: Path) -> None:
    """Make ROOT a store (created if absent; an existing store is left as it is;
    a bucket prefix must be empty)."""
    try:
        s = ArtifactStore.init(root)
    except (StoreError, ConfigError, OSError) as e:
        _exit(EXIT_USAGE, str(e))
    _out().print(f"[green]store[/green]: {s.root}")


@contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except UnknownVersionError as e:
        _exit(EXIT_USAGE, str(e))
    except (StoreError, IntegrityError) as e:
        _exit(EXIT_FAIL, str(e))
    except (FormatError, OSError) as e:
        _exit(EXIT_USAGE, str(e))


_STATUS_STYLE = {
    "verified": "green",
    "rejected": "red",
    "candidate": "yellow",
    "writing": "dim",
    "unreadable": "red",
}


@store.command("ls")
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def ls_command(root: Path, as_json: bool) -> None:
    """List ROOT's versions with their status; the current one is marked."""
    s = _open_store(root)
    with _store_errors():
        current, previous = s.current(), s.previous()
        versions = s.versions()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": s.root,
                    "current": current,
                    "previous": previous,
                    "versions": [
                        {
                            "version": v.version,
                            "status": v.status,
                            "kind": v.kind,
                            "reason": v.reason,
                            "created": v.created,
                            "num_params": v.num_params,
                            "nbytes": v.nbytes,
                            "metadata": v.metadata,
                        }
                        for v in versions
                    ],
                },
                indent=1,
            )
        )
        return
    table = Table(box=None, pad_edge=False)
    for col in ("", "version", "status", "kind", "created", "params", "size", "reason"):
        table.add_column(col, overflow="fold")
    for v in versions:
        mark = "*" if v.version == current else ("<" if v.version == previous else "")
        style = _STATUS_STYLE.get(v.status, "")
        reason = (v.reason or "").splitlines()[0][:80] if v.reason else ""
        table.add_row(
            mark,
            v.version,
            f"[{style}]{v.status}[/{style}]" if style else v.status,
            v.kind,
            v.created,
            f"{v.num_params:,}" if v.num_params is not None else "",
            _human(v.nbytes) if v.nbytes is not None else "",
            reason,
        )
    out = _out()
    out.print(
        f"[bold]{s.root}[/bold]  current: {current or 'none'}  previous: {previous or 'none'}"
    )
    out.print(table)


@store.command("verify")
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
@click.option(
    "--like", type=click.Path(path_type=Path), default=None, help="The contract to match."
)
def store_verify_command(root: Path, version: str, like: Path | None) -> None:
    """Verify VERSION (hashes and contract) and record verified or rejected."""
    s = _open_store(root)
    spec = _read_like(like)
    with _store_errors():
        info = s.verify(version, like=spec)
    if info.status == "verified":
        _out().print(f"[green]verified[/green]: {version}")
        return
    _exit(EXIT_FAIL, f"{version} rejected: {info.reason}")


@store.command("promote")
@click.argument("root", type=click.Path(path_type=Path))
@click.argument("version")
def promote_command(root: Path, version: str) -> None:
    """Make the verified VERSION current."""
    s = _open_store(root)
    with _store_errors():
        s.promote(version)
    _out().print(f"[green]current[/green]: {version}")


@store.command("rollback")
@click.argument("root", type=click.Path(path_type=Path))
def rollback_command(root: Path) -> None:
    """Return to the previous verified version."""
    s = _open_store(root)
    with _store_errors():
        before = s.current()
        now = s.rollback()
    _out().print(f"[green]rolled back[/green]: {before} -> {now}")


@store.command("gc")
@click.argument("root", type=click.Path(path_type=Path))
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="How many of the newest versions to keep.",
)
def gc_command(root: Path, keep: int) -> None:
    """Remove old versions; never the current or a former current one."""
    s = _open_store(root)
    with _store_errors():
        removed = s.gc(policy=RetentionPolicy(keep_last=keep))
    _out().print(f"removed {len(removed)}: {', '.join(removed) or 'nothing'}")
