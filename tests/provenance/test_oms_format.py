"""Properties of the OMS statement and bundle readers: what is written reads
back, and hostile bytes are refused with a typed error, never a crash."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeguard import FormatError

# The OMS bundle's reader and writer alone on purpose: hostile bundles and names meet
# them here without a model directory around them.
from treeguard._src.provenance.oms import (  # _src: bundle codec
    read_oms_bundle,
    safe_name,
    write_oms_bundle,
)
from treeguard.provenance import (
    ModelManifest,
    PrivateKey,
    ProvenanceError,
    TrustPolicy,
    generate_keys,
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
    if not all(safe_name(n) for n in digests):  # a name with a control character
        with pytest.raises(FormatError, match="cannot be signed"):
            ModelManifest("model", algorithm, digests)  # type: ignore[arg-type]
        return
    m = ModelManifest("model", algorithm, digests, ("model.sig",))  # type: ignore[arg-type]
    back = ModelManifest.from_statement(m.statement())
    assert back == ModelManifest("model", algorithm, digests, ("model.sig",))  # type: ignore[arg-type]
    assert all(safe_name(n) for n in back.digests)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    """A good signature file, and the public key that checks it."""
    key, pub = generate_keys(tmp_path_factory.mktemp("k") / "k")
    return write_oms_bundle(
        ModelManifest("m", "sha256", {"w.bin": "ab" * 32}), PrivateKey.load(key)
    ), pub


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_mutated_bundle_is_refused_with_a_typed_error(
    signed: tuple[bytes, str], data: st.DataObject
) -> None:
    good, pub = signed
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
    try:
        manifest, _ = read_oms_bundle(mutated, policy)
    except (FormatError, ProvenanceError):
        return
    assert manifest.digests == {"w.bin": "ab" * 32}  # only a change that means nothing passes
