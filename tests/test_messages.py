"""Pinned error text: a message is part of the interface.

A request's refusals are pinned as a client reads them, through the REST app
(tests/serving/test_data_plane.py and test_json_bounds.py) and over gRPC to a live
server (tests/serving/test_transport_bounds.py, slow), and a run against
another backend's references through ``verify.run`` (tests/verify/test_backends.py).
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from corpus import seed_params
from zips import zip64

import treeguard as tg
from treeguard.provenance import PublicKey, generate_keys


def _message(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(tg.TreeguardError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_check_message_for_a_renamed_layer() -> None:
    params = seed_params()
    renamed = {"dense1": params["dense1"], "dense_2": params["dense2"]}
    assert _message(tg.check, renamed, tg.spec_of(params)) == (
        "2 mismatches between the tree and the spec:\n"
        "  ['dense2']: missing: dict of 2 leaves (f32[1], f32[3,1]) in the spec, absent in the tree\n"
        "  ['dense_2']: unexpected: dict of 2 leaves (f32[1], f32[3,1]) in the tree, absent in the spec\n"
        "hint: `['dense_2']` in the tree: did you mean `['dense2']`?"
    )


def test_check_message_for_shape_and_dtype() -> None:
    params = seed_params()
    grads = {
        "dense1": {"w": jnp.ones((2, 3)), "b": jnp.zeros((2, 3))},
        "dense2": {"w": jnp.ones((3, 1), jnp.bfloat16), "b": jnp.zeros(1)},
    }
    assert _message(
        tg.check, grads, params, expected_from="the params", actual_from="the grads"
    ) == (
        "2 mismatches between the grads and the params:\n"
        "  ['dense1']['b']: shape (3,) in the params, (2, 3) in the grads\n"
        "  ['dense2']['w']: dtype float32 in the params, bfloat16 in the grads\n"
        "hint: cast on purpose before comparing, or fix the dtype where the tree is built"
    )


def test_long_lists_are_capped() -> None:
    expected = {f"layer{i:02d}": jnp.ones(2) for i in range(30)}
    actual = {f"layer{i:02d}": jnp.ones(3) for i in range(30)}
    text = _message(tg.check, actual, expected)
    assert text.splitlines()[0] == "30 mismatches between the tree and the spec:"
    assert "  ... and 10 more" in text.splitlines()
    assert "  ['layer19']: shape (2,) in the spec, (3,) in the tree" in text.splitlines()
    assert "layer20" not in text


def test_values_are_never_dumped() -> None:
    big = {"w": jnp.arange(10_000.0)}
    text = _message(tg.check, {"w": jnp.arange(9_999.0)}, big)
    assert text == (
        "1 mismatch between the tree and the spec:\n"
        "  ['w']: shape (10000,) in the spec, (9999,) in the tree\n"
        "hint: an array of another shape would be broadcast or mis-assigned; fix it where it is built"
    )


def test_dim_message() -> None:
    spec = tg.spec_of(
        {"x": tg.LeafSpec(("B", 2), "float32"), "y": tg.LeafSpec(("B", 1), "float32")}
    )
    assert _message(tg.check, {"x": jnp.zeros((4, 2)), "y": jnp.zeros((5, 1))}, spec) == (
        "1 mismatch between the tree and the spec:\n"
        "  ['y']: dim B=4 (bound at ['x']) in the spec, B=5 in the tree\n"
        "hint: every leaf must agree on the size of each symbolic dimension"
    )


def test_tree_map_message() -> None:
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    assert _message(tg.tree_map, lambda p, g: p - g, params, {"w": jnp.ones((2, 3))}) == (
        "1 mismatch between tree 1 and tree 0:\n"
        "  ['b']: missing: f32[3] in tree 0, absent in tree 1\n"
        "hint: the trees hold different keys; pass a tree with the keys of tree 0"
    )


def test_cycle_message() -> None:
    a: list[Any] = [jnp.ones(1)]
    a.append(a)
    assert _message(tg.spec_of, a) == (
        "1 invalid leaf or node in the tree:\n"
        "  [1]: this list contains itself (a cycle back to <root>)\n"
        "hint: a pytree must be a tree; copy the shared container or break the cycle"
    )


def test_non_array_leaf_message() -> None:
    assert _message(tg.spec_of, {"w": jnp.ones(1), "act": "relu"}) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['act']: leaf of type str is not an array\n"
        "hint: keep only arrays in a parameter tree; hold config in static fields"
    )


def test_format_error_message() -> None:
    assert _message(tg.TreeSpec.from_json, '{"format": "treeguard.spec/9", "tree": {}}') == (
        "spec format 'treeguard.spec/9' is newer than this treeguard reads "
        "('treeguard.spec/1'); upgrade treeguard"
    )


def test_apply_updates_dtype_message() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    updates = {**params, "dense2": {**params["dense2"], "w": jnp.ones((3, 1))}}
    assert _message(tg.apply_updates, params, updates) == (
        "1 mismatch between the updates and the params:\n"
        "  ['dense2']['w']: dtype bfloat16 in the params, float32 in the updates\n"
        'hint: pass dtype_policy="cast" to cast on purpose (each cast is reported), '
        "or fix the dtype where updates are built"
    )


def test_updater_shape_message() -> None:
    params = seed_params()
    grads = {**params, "dense1": {**params["dense1"], "b": jnp.ones((2, 3))}}
    assert _message(tg.updater(lambda p, g: p - 0.01 * g), params, grads) == (
        "1 mismatch between the updates and the params:\n"
        "  ['dense1']['b']: shape (3,) in the params, (2, 3) in the updates\n"
        "hint: an update of another shape would broadcast silently; build it with the "
        "params' shape (or reduce it to that shape on purpose)"
    )


def test_nonfinite_message() -> None:
    params = seed_params()
    nan = jax.tree.map(lambda x: x * jnp.nan, params)
    text = _message(tg.updater(lambda p, g: p - 0.1 * g), params, nan)
    assert text.splitlines()[:3] == [
        "4 leaves hold NaN or Inf in the updated params:",
        "  ['dense1']['b']: 3 of 3 values (f32[3])",
        "  ['dense1']['w']: 6 of 6 values (f32[2,3])",
    ]
    assert text.splitlines()[-1].startswith("hint: the step was not applied")


def test_optimizer_state_drift_message() -> None:
    import optax

    step = tg.optax_step(optax.adam(1e-3))
    params = seed_params()
    state = step.init(params)
    drifted = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, state)
    lines = _message(step, params, params, drifted).splitlines()
    assert (
        lines[0] == "8 mismatches between the state passed in and the state optimizer.init makes:"
    )
    assert lines[1] == (
        "  [0].mu['dense1']['b']: dtype float32 in the state optimizer.init makes, "
        "bfloat16 in the state passed in"
    )


# -- hostile trees and checkpoints ---------------------------------------------------


def test_deep_nesting_message() -> None:
    import numpy as np

    tree: Any = np.ones(1)
    for _ in range(129):
        tree = {"a": tree}
    assert _message(tg.spec_of, tree) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['a']['a']['a']['a']['a']['a']...: the tree nests more than 128 containers deep "
        "(a dict at depth 129)\n"
        "hint: a parameter tree nests a few levels deep; store long chains in a list"
    )


def test_namedtuple_cycle_message() -> None:
    import collections

    NT = collections.namedtuple("NT", "a b")
    items: list[Any] = []
    nt = NT(items, 1.0)
    items.append(nt)
    assert _message(tg.spec_of, {"nt": nt}) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['nt'].a[0]: this NT contains itself (a cycle back to ['nt'])\n"
        "hint: a pytree must be a tree; copy the shared container or break the cycle"
    )


def test_unreadable_key_message(tmp_path: Any) -> None:
    import enum

    import numpy as np

    class Color(enum.Enum):
        RED = 1

    tree = {"layer": {Color.RED: np.ones(1)}}
    assert _message(tg.save, tmp_path / "x.safetensors", tree) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['layer']: key <Color.RED: 1> of type Color does not read back\n"
        "hint: use str or int dict keys (not enums, numpy scalars or other objects) and "
        "attribute names that are identifiers, each distinct within its node"
    )


def test_leaf_without_values_message(tmp_path: Any) -> None:
    import numpy as np

    tree = {"w": jax.ShapeDtypeStruct((2,), np.float32)}
    assert _message(tg.save, tmp_path / "x.safetensors", tree) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['w']: a jax.ShapeDtypeStruct (f32[2]) describes an array but holds no values\n"
        "hint: store numeric arrays with values (jax.random.key_data(k) for typed keys, "
        "np.int64 arrays for large ints)"
    )


def test_migration_node_type_message(tmp_path: Any) -> None:
    import numpy as np

    path = tmp_path / "p.safetensors"
    tg.save(path, {"old": [np.ones(1, np.float32)]})
    like = {"new": (np.ones(1, np.float32),)}
    assert _message(tg.load, path, like=like, rename={"['old']": "['new']"}) == (
        f"{path}: 1 mismatch between the checkpoint (after rename) and `like`:\n"
        "  ['new']: node type tuple in `like`, list in the checkpoint (after rename)\n"
        "hint: a container changed kind (e.g. list vs tuple) or its static data changed"
    )


def test_expect_digest_message(tmp_path: Any) -> None:
    import numpy as np

    path = tmp_path / "p.safetensors"
    tg.save(path, {"w": np.ones(1, np.float32)})
    digest = tg.read_header(path).digest
    assert _message(tg.load, path, expect_digest="0" * 64) == (
        f"{path}: the file changed since its digest was recorded: header digest "
        f"{digest[:12]}… in the file, 000000000000… recorded\n"
        "hint: restore the file from a verified copy (ArtifactStore.rollback) or save it again"
    )


def test_header_json_cost_message(tmp_path: Any) -> None:
    path = tmp_path / "h.safetensors"
    header = b'{"x":[' + b"[]," * 1_000_000 + b"[]]}  "
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    assert _message(tg.read_header, path) == (
        f"{path}: the header: its 3,000,012 bytes of JSON would take about 104,000,371 bytes of "
        "objects, over the 13,194,340 its reader allows\n"
        "hint: a reader allows 3 bytes of objects per byte of header past 4 MiB, and no option "
        "raises it; a file an older treeguard.save wrote for a tree of very many leaves or keys "
        "each of its own can be over it: read its tensors unverified with "
        "safetensors.numpy.load_file and save them as fewer leaves; a damaged file: restore the file from a verified copy "
        "(ArtifactStore.rollback) or save it again"
    )


def test_npz_of_too_many_members_message(tmp_path: Any) -> None:
    """Given once for an archive that claims too many members (its end
    records) and for one that holds them (its directory, as zipfile read it):
    the two counts are pinned to this text in tests/checkpoint/test_foreign_counts.py."""
    path = tmp_path / "wide.npz"
    path.write_bytes(zip64([(b"w.npy", b"")], claimed=1_000_001))
    assert _message(tg.read_foreign, path) == (
        f"{path}: holds more than 1,000,000 tensors; no model has that many\n"
        "hint: a file this wide is a decompression bomb or corrupt; get a fresh copy"
    )


def test_non_native_byte_order_message() -> None:
    text = (
        '{"format": "treeguard.spec/1", "tree": {"kind": "dict", "children": '
        '[[["key", "w"], {"kind": "leaf", "shape": [1], "dtype": ">f4"}]]}}'
    )
    assert _message(tg.TreeSpec.from_json, text) == (
        "tree['w']: dtype '>f4' has non-native byte order; a spec names dtypes by name "
        "(float32), stored in native order"
    )


def test_flight_recorder_without_a_batch_choice_message(tmp_path: Any) -> None:
    assert _message(tg.FlightRecorder, tmp_path) == (
        "FlightRecorder needs batch=\n"
        'hint: pass batch="record" to keep the raw batch in the bundle (it can then be '
        'replayed as is), or batch="digest" to keep only its spec and digest (the batch '
        "stays out of the files; replaying then needs the batch itself, checked against the "
        "digest); a batch may hold personal data, so this is a choice written in the code"
    )


def _two_promoted(root: Any) -> tg.ArtifactStore:
    import numpy as np

    store = tg.ArtifactStore(root)
    for i in (1, 2):
        v = store.put({"w": np.full(2, i, np.float32)})
        store.verify(v)
        store.promote(v)
    return store


def test_dangling_pointer_message(tmp_path: Any) -> None:
    store = _two_promoted(tmp_path)
    pointer = json.loads((tmp_path / "CURRENT.json").read_text())
    (tmp_path / "CURRENT.json").write_text(json.dumps({**pointer, "current": "v000009"}))
    assert _message(store.gc) == (
        f"{tmp_path / 'CURRENT.json'}: the pointer names version v000009 as current, and the "
        "store does not hold it; gc deleted nothing\n"
        f"hint: point the store at a version you choose: `treeguard store repair {tmp_path} "
        "VERSION` (ArtifactStore.repair)"
    )


def test_retired_version_message(tmp_path: Any) -> None:
    store = _two_promoted(tmp_path)
    marker = json.loads((tmp_path / "STORE.json").read_text())
    (tmp_path / "STORE.json").write_text(json.dumps({**marker, "retired": ["v000001"]}))
    assert _message(store.promote, "v000001") == (
        f"{tmp_path}: version v000001 was removed by gc\n"
        "hint: `treeguard store gc ROOT` removes what is left of it"
    )


def test_revoked_and_untrusted_verdict_messages(tmp_path: Any) -> None:
    import numpy as np

    key, pub = generate_keys(tmp_path / "ci")
    _, other = generate_keys(tmp_path / "other")
    fp, other_fp = PublicKey.load(pub).fingerprint, PublicKey.load(other).fingerprint
    writer = tg.ArtifactStore(tmp_path / "store", signing_key=key)
    v = writer.put({"w": np.ones(2, np.float32)})
    writer.verify(v)
    revoked = tg.ArtifactStore(tmp_path / "store", trusted_keys=[pub], revoked_keys=[pub])
    assert _message(revoked.promote, v) == (
        f"version v000001's verdict is refused: signed by key {fp[:16]}… (sha256 {fp}), which "
        f"is revoked ({pub}): what it signed no longer counts\n"
        "hint: verify the version again with a trusted key that is not revoked"
    )
    untrusting = tg.ArtifactStore(tmp_path / "store", trusted_keys=[other])
    assert _message(untrusting.promote, v) == (
        f"version v000001's verdict is refused: signed by key {fp[:16]}… (sha256 {fp}), which "
        f"is not trusted (trusted: {other_fp[:16]}…)\n"
        "hint: trust its public key (--trusted-key KEY.pub, $TREEGUARD_TRUSTED_KEYS) if you "
        "know whose it is"
    )


def test_exported_artifact_refusals_name_both_sides(tmp_path: Any) -> None:
    # an artifact from another jax or platform, as served_from_store meets it: its
    # description is checked before its bytes are read, so these stand in for a function
    from jax import export

    from treeguard.export import Description, served_from_store

    low = export.minimum_supported_calling_convention_version
    high = export.maximum_supported_calling_convention_version
    here = jax.default_backend()  # the CPU box's, or the lent TPU's
    other = "tpu" if here == "cpu" else "cpu"

    def served(name: str, **changes: Any) -> Any:
        spec = tg.spec_of({"w": tg.LeafSpec((2,), "float32")})
        fields = {"model": "m", "params": spec, "serving": {}, "outputs": [], "rtol": 1e-6}
        fields |= {"atol": 1e-6, "platforms": (here,), "jax": "0.9.0", "calling_convention": 10}
        described = Description(**(fields | {"validated": ()} | changes))
        store = tg.ArtifactStore(tmp_path / name)
        store.put({"w": jnp.zeros(2)})  # v000001: the refused one is v000002
        v = store.put({"w": jnp.ones(2)})
        store.attach_exported(v, b"a function", described.to_dict())
        assert store.verify(v).status == "verified"
        store.promote(v)
        return served_from_store(store)

    assert _message(served, "jax", calling_convention=1) == (
        f"version v000002's exported artifact was written by jax 0.9.0 (calling convention 1), "
        f"outside the window of jax {jax.__version__} here (calling conventions {low} to {high})\n"
        f"hint: export the version again with jax {jax.__version__} (treeguard export "
        "MODULE:ATTR --store STORE v000002 on a new version), or serve it with a jax whose "
        "window holds 1"
    )
    assert _message(served, "platform", platforms=(other,)) == (
        f"version v000002's exported artifact was exported for {other}, and this process runs "
        f"on {here}\nhint: export it for {here} too: treeguard export MODULE:ATTR --store STORE "
        f"VERSION --platform {here} (on a new version), or serve it on {other}"
    )


def test_save_over_the_readers_budget_message(tmp_path: Any) -> None:
    import re

    import numpy as np

    path = tmp_path / "c.safetensors"
    message = _message(tg.save, path, {"w": np.zeros(2, np.float32)}, metadata={"x": [[]] * 60_000})
    # the header's bytes and what is left of the budget hold the environment's JSON
    assert re.fullmatch(
        r"1 invalid leaf or node in the tree:\n"
        r"  <root>: the header of [0-9,]+ bytes for 1 leaf in 1 container would be refused by "
        r"read_header and load: reading it would cost more than their [0-9,]+ bytes of objects "
        r"\(3 per byte of header past 4 MiB\); treeguard.metadata: its 240,007 bytes of JSON "
        r"would take about 6,240,267 bytes of objects, over the [0-9,]+ its reader allows\n"
        r"hint: nothing was written; save the tree as several checkpoints \(a part of it in "
        r"each\) or with treeguard.save_sharded, or as fewer leaves and containers \(stack "
        r"leaves of one shape into one array\), and keep large documents out of metadata=",
        message,
    ), message
