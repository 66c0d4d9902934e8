"""Signature text made the way the docs state it, from public calls only: a
signature over DSSE v1's pre-authentication encoding of (payload type,
payload), written ``ALGORITHM:FINGERPRINT:BASE64`` (docs/guides/provenance.md).
A policy that accepts it reads the format as documented."""

from __future__ import annotations

import base64

from treeguard.provenance import PrivateKey


def pae(payload_type: str, payload: bytes) -> bytes:
    """``DSSEv1 SP LEN(type) SP type SP LEN(body) SP body``, as the DSSE spec writes it."""
    kind = payload_type.encode("utf-8")
    return b" ".join(
        [b"DSSEv1", str(len(kind)).encode(), kind, str(len(payload)).encode(), payload]
    )


def sign_text(key: PrivateKey, payload_type: str, payload: bytes) -> str:
    raw = base64.b64encode(key.sign(pae(payload_type, payload))).decode()
    return f"{key.public.algorithm}:{key.public.fingerprint}:{raw}"
