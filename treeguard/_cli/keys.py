"""The ``treeguard keys`` command group: EC key pairs for signing verdicts and models.

Exit codes, as for every treeguard command: 0 done, 2 a key file that
cannot be used (a file already there, an unknown curve, not a PEM EC key).
"""

from __future__ import annotations

from pathlib import Path

import click

from .._src.provenance.keys import CURVES, generate_keys, load_public_key
from .console import console, shown
from .failures import Group


@click.group("keys", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def keys() -> None:
    """Make EC key pairs and show their fingerprints.

    A store opened with --signing-key signs its verdicts with the private
    key; one opened with --trusted-key honours only verdicts its public key
    verifies. The same pair signs and checks OpenSSF Model Signing
    signatures (`model_signing sign key` / `verify key`).
    """


@keys.command("new")
@click.argument("name", type=click.Path(path_type=Path))
@click.option(
    "--curve",
    type=click.Choice(CURVES),
    default="P-256",
    show_default=True,
    help="The curve (those OpenSSF Model Signing accepts).",
)
def new_command(name: Path, curve: str) -> None:
    """Write a new key pair: NAME.key (private, mode 0600) and NAME.pub.

    Neither file may exist; a key is never overwritten.
    """
    key, pub = generate_keys(name, curve=curve)  # type: ignore[arg-type]  # a click choice
    fingerprint = load_public_key(pub).fingerprint
    out = console()
    out.print(f"[green]private key[/green]: {shown(key)} (mode 0600; keep it secret)")
    out.print(f"[green]public key[/green]: {shown(pub)}")
    out.print(f"fingerprint: sha256:{fingerprint}")


@keys.command("fingerprint")
@click.argument("public_key", type=click.Path(path_type=Path))
def fingerprint_command(public_key: Path) -> None:
    """Print PUBLIC_KEY's curve and fingerprint (the sha256 of its PEM, which
    OpenSSF Model Signing bundles carry as their key hint)."""
    key = load_public_key(public_key)
    click.echo(f"{key.curve} sha256:{key.fingerprint}")
