"""What the store's gates cost: ``load_current`` (verified, digest re-checked,
signature checked) against a plain ``treeguard.load`` of the same file, and
``promote`` (the whole file re-hashed) against ``treeguard.verify_file``.

Both sides run in one process, interleaved, after a warm-up, on a file in the
page cache; the figure is the median of ``--repeats`` runs of each, and the
ratio is against the baseline measured in the same run.

    .venv/bin/python benchmarks/store.py              # 1 GiB in 64 leaves
    .venv/bin/python benchmarks/store.py --mib 128    # a quick run
    .venv/bin/python benchmarks/store.py --sharded    # a sharded version, one device
    .venv/bin/python benchmarks/store.py --ec         # verdicts signed with EC keys

With ``--ec`` the store signs its verdicts with an EC key (P-256, P-384 and
P-521 in turn) instead of HMAC, and each curve's signing and checking of
one verdict is also timed alone, as a fraction of the plain load: the
signature covers the verdict's text, which holds the header digest that
covers every tensor's BLAKE3 digest, so nothing is hashed again.

With ``--sharded`` the version is put with ``put_sharded`` and the baselines
are ``load_sharded`` of its directory (every shard hashed, no gates), for
``load_current`` and for ``promote`` (which re-reads and re-hashes every
shard in one process, a group of arrays at a time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import treeguard as tg


def _tree(total_mib: int, leaves: int) -> dict[str, np.ndarray]:
    n = total_mib * 1024 * 1024 // 4 // leaves
    return {f"layer_{i:02d}": np.full(n, i, np.float32) for i in range(leaves)}


def _median(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--leaves", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sharded", action="store_true", help="a put_sharded version")
    parser.add_argument("--ec", action="store_true", help="verdicts signed with EC keys")
    args = parser.parse_args()
    if args.sharded:
        _sharded(args)
        return
    if args.ec:
        _ec(args)
        return

    tree = _tree(args.mib, args.leaves)
    like = tg.spec_of(tree)
    with tempfile.TemporaryDirectory() as d:
        store = tg.ArtifactStore(os.path.join(d, "store"), key=b"bench-key-0123456789")
        v = store.put(tree)
        store.verify(v, like=like)
        store.promote(v)
        path = store.info(v).path
        del tree

        pairs: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
            (
                "load_current / load",
                lambda: store.load_current(like),
                lambda: tg.load(path, like=like),
            ),
            ("promote / verify_file", lambda: store.promote(v), lambda: tg.verify_file(path)),
        ]
        print(f"{args.mib} MiB in {args.leaves} leaves, median of {args.repeats} (page cache)")
        _compare(pairs, args.repeats)


def _compare(pairs: list[tuple[str, Callable[[], Any], Callable[[], Any]]], repeats: int) -> None:
    for name, gated, base in pairs:
        gated(), base()  # warm-up: page cache, imports
        t_gated, t_base = [], []
        for _ in range(repeats):  # interleaved, so drift hits both sides alike
            t_base.append(_median(base, 1))
            t_gated.append(_median(gated, 1))
        g, b = statistics.median(t_gated), statistics.median(t_base)
        print(f"  {name:28s} {g * 1e3:9.1f} ms / {b * 1e3:9.1f} ms = {g / b:5.3f}x")


def _ec(args: argparse.Namespace) -> None:
    # the sign extra (cryptography), only for this run; the verdict signer and the text
    # it signs on purpose: signing one verdict is what this section times
    from treeguard._src.provenance.verdicts import EcSigner
    from treeguard._src.store.verdicts import message
    from treeguard.provenance import PrivateKey, TrustPolicy, generate_keys

    tree = _tree(args.mib, args.leaves)
    like = tg.spec_of(tree)
    with tempfile.TemporaryDirectory() as d:
        for curve in ("P-256", "P-384", "P-521"):  # treeguard.provenance's curves
            key, pub = generate_keys(os.path.join(d, curve), curve=curve)
            store = tg.ArtifactStore(os.path.join(d, curve + "-store"), signing_key=key)
            v = store.put(tree)
            store.verify(v, like=like)
            store.promote(v)
            path = store.info(v).path
            reader = tg.ArtifactStore(store.root, trusted_keys=[pub])
            print(f"{curve}: {args.mib} MiB in {args.leaves} leaves, median of {args.repeats}")
            _compare(
                [
                    (
                        "load_current (public key) / load",
                        lambda r=reader: r.load_current(like),
                        lambda p=path: tg.load(p, like=like),
                    )
                ],
                args.repeats,
            )
            text = message("store-id", v, store._backend.record(v)[1])
            signer = EcSigner(PrivateKey.load(key), TrustPolicy.from_paths(trusted=[pub]))
            signature = signer.sign(text)
            reps = args.repeats * 20
            sign = _median(lambda s=signer, t=text: s.sign(t), reps)
            check = _median(lambda s=signer, t=text, sig=signature: s.verify(t, sig), reps)
            load = _median(lambda p=path: tg.load(p, like=like), args.repeats)
            print(
                f"  sign {sign * 1e3:.3f} ms + check {check * 1e3:.3f} ms = "
                f"{(sign + check) / load:.4%} of the load ({load * 1e3:.1f} ms)"
            )


def _sharded(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp

    tree = {k: jnp.asarray(v) for k, v in _tree(args.mib, args.leaves).items()}
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    with tempfile.TemporaryDirectory() as d:
        store = tg.ArtifactStore(os.path.join(d, "store"), key=b"bench-key-0123456789")
        v = store.put_sharded(tree)
        store.verify(v, like=like)
        store.promote(v)
        path = store.info(v).path
        del tree

        def load() -> Any:
            return jax.block_until_ready(tg.load_sharded(path, like))

        pairs: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
            (
                "load_current / load_sharded",
                lambda: jax.block_until_ready(store.load_current(like)),
                load,
            ),
            ("promote / load_sharded", lambda: store.promote(v), load),
        ]
        print(
            f"{args.mib} MiB in {args.leaves} leaves, a sharded version on one device, "
            f"median of {args.repeats} (page cache)"
        )
        _compare(pairs, args.repeats)


if __name__ == "__main__":
    main()
