"""A server whose store holds EC public keys only: it serves and swaps to
what the release key signed, through the store's own gates, and refuses a
version a writer of the store forged or a revoked key signed."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import tinymodel
from serving_support import client, tiny_spec

import treeguard
from treeguard.provenance import PublicKey, generate_keys
from treeguard.serving import Server

pytestmark = pytest.mark.anyio


def _release(root: Path, key: str, eps: float) -> str:
    ci = treeguard.ArtifactStore(root, signing_key=key)
    v = ci.put(tinymodel.params(eps=eps))
    assert ci.verify(v).status == "verified"
    return v


async def _provenance(c: Any, server: Server) -> Any:
    meta = await c.get(f"/v2/models/{server.spec.name}")
    assert meta.status_code == 200, meta.text
    return meta.json()["parameters"]["provenance"]


async def test_a_public_key_host_serves_swaps_and_refuses_forgeries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key, pub = generate_keys(tmp_path / "ci")
    root = tmp_path / "store"
    first = _release(root, key, 1.0)
    treeguard.ArtifactStore(root, signing_key=key).promote(first)
    second = _release(root, key, 2.0)
    forged = treeguard.ArtifactStore(root, signing_key=key).put(tinymodel.params(eps=3.0))
    status = root / "versions" / forged / "status.json"
    record = json.loads(status.read_text())
    signed = json.loads((root / "versions" / second / "status.json").read_text())
    record.update(status="verified", digest=signed["digest"], signature=signed["signature"])
    status.write_text(json.dumps(record))

    host = treeguard.ArtifactStore(root, trusted_keys=[pub])
    server = Server(tinymodel.model, host, spec=tiny_spec())
    fingerprint = PublicKey.load(pub).fingerprint
    caplog.set_level(logging.INFO, logger="treeguard.serving")
    async with client(server) as c:
        assert server.status()["active"] == first
        trail = await _provenance(c, server)
        assert trail["fingerprint"] == fingerprint and trail["algorithm"].startswith("ecdsa-")
        assert trail["digest"] == host.info(first).digest
        r = await c.post("/v2/treeguard/swap", json={"version": forged})
        assert r.status_code >= 400 and "verdict" in r.json()["error"], r.text
        assert server.status()["active"] == first
        r = await c.post("/v2/treeguard/swap", json={"version": second})
        assert r.status_code == 200, r.text
        assert server.status()["active"] == second
        trail = await _provenance(c, server)
        assert trail["digest"] == host.info(second).digest != host.info(first).digest
    # the log names the signer at start and at the swap
    served = [r.getMessage() for r in caplog.records if " is served; " in r.getMessage()]
    assert [m.split()[1] for m in served] == [first, second]
    assert all(f"by key {fingerprint}" in m for m in served), served
    swaps = [e for e in host.history() if e.action.startswith("serve_swap")]
    assert swaps and swaps[-1].version == second
    assert host.info(second).trail().fingerprint == PublicKey.load(pub).fingerprint


def test_a_revoked_release_key_keeps_the_server_from_starting_on_its_versions(
    tmp_path: Path,
) -> None:
    key, pub = generate_keys(tmp_path / "ci")
    root = tmp_path / "store"
    v = _release(root, key, 1.0)
    treeguard.ArtifactStore(root, signing_key=key).promote(v)
    host = treeguard.ArtifactStore(root, trusted_keys=[pub], revoked_keys=[pub])
    server = Server(tinymodel.model, host, spec=tiny_spec())
    with pytest.raises(treeguard.TreeguardError, match=PublicKey.load(pub).fingerprint):
        server.start()
