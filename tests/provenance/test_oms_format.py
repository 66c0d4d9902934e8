"""Properties of the OMS statement and bundle readers: what is written reads
back, and hostile bytes are refused with a typed error, never a crash. The
bundle is written by ``sign_model`` and read by ``verify_model``."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeguard import FormatError
from treeguard.provenance import (
    ModelManifest,
    PrivateKey,
    ProvenanceError,
    SignedDigestError,
    TrustPolicy,
    generate_keys,
    sign_model,
    verify_model,
)

_PART = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_characters="/"),
    min_size=1,
    max_size=8,
).filter(lambda p: p not in (".", ".."))
_NAME = st.lists(_PART, min_size=1, max_size=3).map("/".join)
_DIGEST = st.binary(min_size=32, max_size=32).map(bytes.hex)


@settings(max_examples=60, deadline=None)
@given(
    digests=st.dictionaries(_NAME, _DIGEST, min_size=1, max_size=6),
    algorithm=st.sampled_from(["sha256", "blake3"]),
)
def test_a_statement_reads_back(digests: dict[str, str], algorithm: str) -> None:
    if any("\x7f" in n for n in digests):  # the one control character _PART draws
        with pytest.raises(FormatError, match="cannot be signed"):
            ModelManifest("model", algorithm, digests)  # type: ignore[arg-type]
        return
    m = ModelManifest("model", algorithm, digests, ("model.sig",))  # type: ignore[arg-type]
    back = ModelManifest.from_statement(m.statement())
    assert back == ModelManifest("model", algorithm, digests, ("model.sig",))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str, Path]:
    """A good signature file's bytes, the public key that checks it, and the
    model directory it signs (one file, ``w.bin``)."""
    root = tmp_path_factory.mktemp("k")
    key, pub = generate_keys(root / "k")
    model = root / "m"
    model.mkdir()
    (model / "w.bin").write_bytes(b"weights")
    sign_model(model, PrivateKey.load(key), signature=root / "good.sig")
    return (root / "good.sig").read_bytes(), pub, model


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_mutated_bundle_is_refused_with_a_typed_error(
    signed: tuple[bytes, str, Path], data: st.DataObject
) -> None:
    good, pub, model = signed
    doc = json.loads(good)
    payload = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    where = data.draw(st.sampled_from(["bytes", "payload", "envelope"]))
    if where == "bytes":
        raw = bytearray(good)
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
        mutated = bytes(raw)
    elif where == "payload":
        field = data.draw(st.sampled_from(["_type", "subject", "predicateType", "predicate"]))
        payload[field] = data.draw(
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.just([]))
        )
        doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
        mutated = json.dumps(doc).encode()
    else:
        field = data.draw(st.sampled_from(["payload", "payloadType", "signatures"]))
        doc["dsseEnvelope"][field] = data.draw(
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.just([{}]))
        )
        mutated = json.dumps(doc).encode()
    policy = TrustPolicy.from_paths(trusted=[pub])
    signature = model.parent / "mutated.sig"
    signature.write_bytes(mutated)
    try:
        checked = verify_model(model, policy=policy, signature=signature)
    except (FormatError, ProvenanceError) as e:
        # refused by its format or its signature, before any file is compared with it
        assert not isinstance(e, SignedDigestError)
        return
    # only a change that means nothing passes
    assert checked.manifest.digests == {"w.bin": hashlib.sha256(b"weights").hexdigest()}
