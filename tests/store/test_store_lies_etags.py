"""ETags in the forms servers and the proxies in front of them answer,
through a lying proxy in front of a real SeaweedFS server: weak
(``W/"..."``, as nginx or a CDN answers when it compresses), without
quotes, a multipart upload's (``"<hex>-N"``), and forms that differ from
one answer to the next. A server compares ``If-Match`` strongly, so a weak
ETag sent back in one is refused (412) whatever the object holds: before,
through a proxy that weakens the ETags of reads, every put failed ("the
marker changed under 64 tries in a row"), every promote, rollback and gc
("writing the pointer failed: the server refused it as a conflict, but
the pointer is unchanged") and every read of a file version past its
first 64 KiB ("its answer was a 412 for the ETag its HEAD gives (on each
of 3 tries)"). A weak ETag still proves nothing of the bytes: a write it
tags is read back; an object replaced while read, or a pointer moved by
another writer, is still told apart."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import obstore
import pytest

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.buckets import raw_store
from treeguard import (
    ArtifactStore,
    ConflictError,
    IntegrityError,
    RetentionPolicy,
    StorageError,
    StoreError,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

#: Two arrays of 128 KiB: the data comes past the first ranged GET (64 KiB).
_TREE = {k: np.arange(128 * 256, dtype=np.float32) + i for i, k in enumerate("az")}

#: How the proxy answers GETs and HEADs: each the form it gives the server's ETag.
_FORMS = {
    "weak": {"GET": "weak", "HEAD": "weak"},  # a proxy that compresses answers
    "weak-get": {"GET": "weak"},  # ... its HEADs left as they are
    "unquoted": {"GET": "unquoted", "HEAD": "unquoted"},
    "mixed": {"GET": "weak", "HEAD": "unquoted"},
}


def _other(shift: float) -> dict[str, Any]:
    return {k: a + shift for k, a in _TREE.items()}


def _promoted(store: ArtifactStore) -> str:
    v = store.put(_TREE)
    assert store.verify(v).status == "verified"
    store.promote(v)
    return v


@contextlib.contextmanager
def _reformed(
    server: S3Server, monkeypatch: pytest.MonkeyPatch, forms: dict[str, str], seen: list[str]
) -> Iterator[None]:
    """Clients made inside reach the server through a proxy that answers
    each ETag of a method in ``forms`` in its form, and records every
    request's method in ``seen``."""

    def tamper(req: Request) -> Lie | None:
        seen.append(req.method)
        kind = forms.get(req.method)
        return None if kind is None else Lie(kind=kind)

    with LyingProxy(server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield


@pytest.mark.parametrize("form", sorted(_FORMS))
def test_reads_through_a_proxy_that_reforms_etags_load_and_verify_with_no_412(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Every read pins its object with ``If-Match`` in the ETag's strong
    form. Before, a weak one was sent back as it came: refused (412), and
    with a weak HEAD too, every try was (a ``StorageError``); with a HEAD
    that answers otherwise, each object cost a 412, a HEAD and a read of its
    first bytes again."""
    honest = ArtifactStore.init(s3_url)
    v = _promoted(honest)
    candidate = honest.put(_other(1.0))
    dedup = ArtifactStore.init(f"{s3_url}-dedup", dedup=True)
    tensors = dedup.put(_other(2.0))
    seen: list[str] = []
    with _reformed(s3_server, monkeypatch, _FORMS[form], seen):
        store = ArtifactStore(s3_url)
        got = [
            store.load_version(v, _TREE)["z"],
            store.load_current(_TREE)["z"],
            store.load_version(v, _TREE["z"], subtree="['z']"),  # a partial load
        ]
        assert "HEAD" not in seen  # no 412 was judged by the object's HEAD
        assert store.verify(candidate).status == "verified"
        loaded = ArtifactStore(f"{s3_url}-dedup").load_version(tensors, _TREE)["z"]
    assert all(np.array_equal(z, _TREE["z"]) for z in got)
    assert np.array_equal(loaded, _other(2.0)["z"])
    assert honest.info(candidate).status == "verified"


@pytest.mark.parametrize("form", sorted(_FORMS))
def test_writes_through_a_proxy_that_reforms_etags_move_the_marker_and_the_pointer(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """The marker and the pointer are replaced by compare-and-swap on the
    tag they were read with, sent in its strong form."""
    honest = ArtifactStore.init(s3_url)
    v1 = _promoted(honest)  # a pointer to replace
    with _reformed(s3_server, monkeypatch, _FORMS[form], []):
        store = ArtifactStore(s3_url)
        v2 = store.put(_other(1.0))  # its name from the marker's counter
        v3 = store.put(_other(2.0), version="release-1")
        assert [store.verify(v).status for v in (v2, v3)] == ["verified"] * 2
        store.promote(v2)
        store.promote(v3)
        assert store.rollback() == v2
        v4 = store.put(_other(3.0))
        # gc removes the verified release-1, then rewrites the pointer as its fence
        assert store.gc(policy=RetentionPolicy(keep_last=1, orphan_grace_s=0)) == [v3]
        ArtifactStore.init(s3_url, dedup=True)  # a flag set on the marker
    assert (honest.current(), honest.previous()) == (v2, v1)
    assert [i.version for i in honest.versions()] == [v1, v2, v4]
    assert honest.info(honest.put(_other(4.0))).kind == "tensors"


@pytest.mark.parametrize("form", ["honest", "weak"])
def test_a_checkpoint_restored_by_a_multipart_upload_verifies_promotes_and_loads(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """The checkpoint object written again with the same bytes in a
    multipart upload (as ``aws s3 cp`` restores a backup): its ETag,
    ``"<hex>-N"``, is no MD5 and pins its reads as any other."""
    honest = ArtifactStore.init(s3_url)
    v = honest.put(_TREE)
    raw, name = raw_store(s3_url), f"versions/{v}/model.safetensors"
    obstore.put(raw, name, bytes(obstore.get(raw, name).bytes()), use_multipart=True)
    assert re.fullmatch(r'"[0-9a-f]{32}-\d+"', obstore.head(raw, name)["e_tag"] or "")
    with _reformed(s3_server, monkeypatch, _FORMS.get(form, {}), []):
        store = ArtifactStore(s3_url)
        assert store.verify(v).status == "verified"
        store.promote(v)
        assert np.array_equal(store.load_current(_TREE)["z"], _TREE["z"])


@pytest.mark.parametrize("cdn", ['W/"3a-18c2e"', 'w/"3a-18c2e"', '"3a-18c2e"'])
def test_a_write_its_answer_and_head_tag_alike_of_a_proxy_s_own_is_never_taken_on_them(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, cdn: str
) -> None:
    """A proxy answers the checkpoint's PUT 200 without passing it on, as
    another writer's object of the same size, one byte apart, lands under
    that name, and tags the PUT and the object's HEAD with the same ETag
    of its own (a CDN's, which names no bytes), weak or strong. A weak ETag
    proves nothing of the bytes, and a strong one only once the server
    vouches for it (a GET carrying it as ``If-Match`` is refused here): the
    bytes are read back, and the put fails. Before, the two weak ETags,
    alike, were taken for the bytes: the put returned ``release-1``,
    recorded over another writer's bytes (every load of it an
    ``IntegrityError``); so were, until now, two strong ones, or weak ones
    written ``w/``, as a proxy may write ``W/``."""
    honest = ArtifactStore.init(s3_url)
    raw = raw_store(s3_url)  # the server's, not the proxy's
    mine = bytearray(obstore.get(raw, f"versions/{honest.put(_TREE)}/model.safetensors").bytes())
    mine[-1] ^= 1  # another writer's bytes: the same size, one bit apart
    taken = "versions/release-1/model.safetensors"

    def tamper(req: Request) -> Lie | None:
        if not req.key.endswith(taken):
            return None
        if req.method == "PUT":
            obstore.put(raw, taken, bytes(mine))  # after the put looked for the name
            return Lie(kind="ack", etag=cdn)
        return Lie(kind="etag", etag=cdn) if req.method == "HEAD" else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StorageError) as e:
            ArtifactStore(s3_url).put(_TREE, version="release-1")
    said = "the server acknowledged it, but reading it back found the object holds other bytes"
    assert said in str(e.value), str(e.value)
    assert bytes(obstore.get(raw, taken).bytes()) == mine
    assert "release-1" not in [i.version for i in honest.versions() if i.status != "writing"]


def test_a_put_whose_answers_are_all_weak_is_confirmed_by_its_bytes_read_back(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's PUT answered, and its HEAD, with its ETag made weak:
    the checkpoint is read back whole (a GET without a range) before the put
    is taken as written. Before, the weak ETags, alike, were taken for the
    bytes."""
    honest = ArtifactStore.init(s3_url)
    read_back: list[str] = []

    def tamper(req: Request) -> Lie | None:
        if not req.key.endswith("model.safetensors"):
            return None
        if req.method == "GET":
            read_back.append(req.header("range") or "whole")
        return Lie(kind="weak")

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        v = ArtifactStore(s3_url).put(_TREE)
    assert read_back == ["whole"]
    assert honest.verify(v).status == "verified"


def test_an_object_replaced_while_read_through_a_weakening_proxy_is_still_replaced(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strong form of a weak ETag still pins the read: the checkpoint
    replaced between its first bytes and its data fails the load as
    replaced, never mixing two objects' bytes."""
    store = ArtifactStore.init(s3_url)
    v = _promoted(store)
    name = f"versions/{v}/model.safetensors"
    raw = raw_store(s3_url)  # the server's, not the proxy's
    other = store.put(_other(1.0))
    data = bytes(obstore.get(raw, f"versions/{other}/model.safetensors").bytes())
    replaced: list[bool] = []

    def tamper(req: Request) -> Lie | None:
        ranged = req.header("range") or ""
        if req.key.endswith(name) and ranged and not ranged.startswith("bytes=0-"):
            if not replaced:
                obstore.put(raw, name, data)  # before the data's GET reaches the server
            replaced.append(True)
        return Lie(kind="weak") if req.method in ("GET", "HEAD") else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(IntegrityError) as e:
            ArtifactStore(s3_url).load_current(_TREE)
    said = f"version {v}: its checkpoint no longer reads: the object was replaced while it was read"
    assert replaced and str(e.value).splitlines()[0].endswith(said), str(e.value)


def test_a_pointer_moved_during_a_promote_through_a_weakening_proxy_is_a_conflict(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strong form of a weak ETag still guards the pointer's
    compare-and-swap: another writer's promote between the read and the
    write wins, and the promote through the proxy is a ``ConflictError``
    naming the winner."""
    honest = ArtifactStore.init(s3_url)
    v1 = _promoted(honest)
    v2, v3 = honest.put(_other(1.0)), honest.put(_other(2.0))
    assert [honest.verify(v).status for v in (v2, v3)] == ["verified"] * 2
    raced: list[bool] = []

    def tamper(req: Request) -> Lie | None:
        if req.method == "PUT" and req.key.endswith("CURRENT.json") and not raced:
            raced.append(True)
            honest.promote(v3)  # before this write reaches the server
        return Lie(kind="weak") if req.method in ("GET", "HEAD") else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(ConflictError) as e:
            ArtifactStore(s3_url).promote(v2)
    assert raced and e.value.version == v3, str(e.value)
    assert (honest.current(), honest.previous()) == (v3, v1)


#: How a proxy answers a GET with no ETag to pin or swap on: blanked to an
#: empty one (``""``, ``W/""``), or removed (nginx before 1.7.3 removed the
#: ETag of an answer it compressed).
_BLANKS = {
    "empty": Lie(kind="etag", etag='""'),
    "empty-weak": Lie(kind="etag", etag='W/""'),
    "removed": Lie(kind="no-etag"),
}


def _refused_for_no_etag(call: Callable[[], object]) -> str | None:
    """What ``call`` raised, or None if it returned."""
    try:
        call()
    except StoreError as e:
        return str(e)
    return None


@pytest.mark.parametrize("blank", sorted(_BLANKS))
def test_a_pointer_read_without_an_etag_is_never_replaced_unconditionally(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """A promote through a proxy that blanks or removes the ETags of GETs
    has no tag to swap the pointer on: it is refused before writing. Before,
    the tag was empty and sent as ``If-Match:`` with no value, which the
    server ignores: the write replaced whatever the pointer held, and
    another writer's promote between the read and the write was undone,
    both promotes reported done (with ``""``, since the ETags were read in
    one form, etags.py; with no ETag, since ever)."""
    honest = ArtifactStore.init(s3_url)
    v1 = _promoted(honest)
    v2, v3 = honest.put(_other(1.0)), honest.put(_other(2.0))
    assert [honest.verify(v).status for v in (v2, v3)] == ["verified"] * 2
    raced: list[bool] = []

    def tamper(req: Request) -> Lie | None:
        if req.method == "PUT" and req.key.endswith("CURRENT.json") and not raced:
            raced.append(True)
            honest.promote(v3)  # between this promote's read and its write
        return _BLANKS[blank] if req.method == "GET" else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        refused = _refused_for_no_etag(lambda: ArtifactStore(s3_url).promote(v2))
    assert honest.current() == (v3 if raced else v1), "the other writer's promote was undone"
    assert refused is not None and "without an ETag" in refused, refused


@pytest.mark.parametrize("blank", sorted(_BLANKS))
def test_a_marker_read_without_an_etag_is_never_replaced_unconditionally(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """A put through a proxy that blanks or removes the ETags of GETs has
    no tag to bump the marker's counter on: it is refused before writing.
    Before, the marker was replaced whatever it held: a signed verdict's
    ``signed`` flag, set by another writer between the read and the write,
    was lost, and the store took verdicts without the key again."""
    key = b"k" * 32
    honest = ArtifactStore.init(s3_url, key=key)
    v, raw = honest.put(_TREE), raw_store(s3_url)  # the server's, not the proxy's
    raced: list[bool] = []

    def tamper(req: Request) -> Lie | None:
        if req.method == "PUT" and req.key.endswith("STORE.json") and not raced:
            raced.append(True)
            assert honest.verify(v).status == "verified"  # marks the store signed
        return _BLANKS[blank] if req.method == "GET" else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        refused = _refused_for_no_etag(lambda: ArtifactStore(s3_url).put(_other(1.0)))
    marker = json.loads(bytes(obstore.get(raw, "STORE.json").bytes()))
    assert marker["signed"] is bool(raced), "the other writer's flag was lost"
    assert refused is not None and "without an ETag" in refused, refused


@pytest.mark.parametrize("heads", ["honest", "blanked"])
@pytest.mark.parametrize("blank", sorted(_BLANKS))
def test_a_read_without_an_etag_is_pinned_by_its_head_s_or_not_made(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, blank: str, heads: str
) -> None:
    """The first answer of a checkpoint through a proxy that blanks or
    removes the ETags of GETs pins nothing: its data is read under the
    HEAD's ETag, once its first bytes read the same under it, so an object
    replaced meanwhile fails the load as replaced; where the HEAD has none
    either, it is not read (a ``StorageError``, as for any answer that
    lied on each try). Before, the data's GETs carried no ``If-Match``
    (with ``""``, since the ETags were read in one form, etags.py; with no
    ETag, since ever): another object's bytes were read after the first's."""
    store = ArtifactStore.init(s3_url)
    v = _promoted(store)
    name = f"versions/{v}/model.safetensors"
    raw = raw_store(s3_url)  # the server's, not the proxy's
    data = bytes(obstore.get(raw, f"versions/{store.put(_other(1.0))}/model.safetensors").bytes())
    unpinned: list[str] = []

    def tamper(req: Request) -> Lie | None:
        ranged = req.header("range") or ""
        if req.key.endswith(name) and ranged and not ranged.startswith("bytes=0-"):
            if not (req.header("if-match") or "").strip().removeprefix("W/").strip('"'):
                unpinned.append(ranged)
            obstore.put(raw, name, data)  # before the data's GET reaches the server
        blanked = req.method == "GET" or (req.method == "HEAD" and heads == "blanked")
        return _BLANKS[blank] if blanked else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises((IntegrityError, StorageError)) as e:
            ArtifactStore(s3_url).load_current(_TREE)
    said = {
        "honest": "no longer reads: the object was replaced while it was read",
        "blanked": "neither its answer nor its HEAD gave an ETag to pin it with",
    }[heads]
    assert unpinned == [], "a GET of the data carried no If-Match"
    assert said in str(e.value).splitlines()[0], str(e.value)


@pytest.mark.parametrize("blank", sorted(_BLANKS))
def test_a_checkpoint_swapped_while_verified_through_a_blanking_proxy_is_never_rejected(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """Another writer swaps the checkpoint object for other bytes as each
    read of its data arrives and back as each read of its first bytes does,
    through a proxy that blanks or removes the ETags of GETs: no read mixes
    the two, so no try reads bytes that hash wrong, and no verdict is
    recorded. Before, each try read the first bytes of one and the data of
    the other, and the version was recorded ``rejected``: its object, once
    the other writer was done, as it was put."""
    honest = ArtifactStore.init(s3_url)
    v = honest.put(_TREE)
    name, raw = f"versions/{v}/model.safetensors", raw_store(s3_url)
    mine = bytes(obstore.get(raw, name).bytes())
    other = bytes(obstore.get(raw, f"versions/{honest.put(_other(1.0))}/model.safetensors").bytes())

    def tamper(req: Request) -> Lie | None:
        ranged = req.header("range") or ""
        if req.method == "GET" and req.key.endswith(name):
            obstore.put(raw, name, other if ranged and not ranged.startswith("bytes=0-") else mine)
        return _BLANKS[blank] if req.method == "GET" else None

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        refused = _refused_for_no_etag(lambda: ArtifactStore(s3_url).verify(v))
    obstore.put(raw, name, mine)  # the other writer done
    assert honest.info(v).status != "rejected", "a verdict on bytes of two objects"
    assert refused is not None and "no verdict was recorded" in refused, refused
    assert honest.verify(v).status == "verified"
