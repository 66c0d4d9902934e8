"""What ``treeguard ckpt inspect DIR`` and ``ckpt verify DIR`` show for a
sharded checkpoint: the spec, each array's saved sharding, and the shards
and bytes each process wrote."""

from __future__ import annotations

import json
import os
from typing import Any

from ..display import fmt_bytes
from ..errors import TreeMismatchError
from ..leaf import dtype_of, summarize
from ..spec import TreeSpec
from .manifest import FORMAT, read, read_with_digest


def summary(directory: str | os.PathLike[str], /) -> dict[str, Any]:
    """The manifest of ``directory`` as a JSON-ready report; reads no array data.

    Raises:
      FormatError: for a directory without a well-formed manifest.
    """
    where = os.path.abspath(os.fspath(directory))
    m, found = read_with_digest(where)
    per_process = [{"process": p, "shards": 0, "nbytes": 0} for p in range(m.process_count)]
    arrays = []
    for a in m.arrays:
        for s in a.shards:
            per_process[s.process]["shards"] += 1
            per_process[s.process]["nbytes"] += s.size * a.dtype.itemsize
        arrays.append(
            {
                "path": a.path,
                "dtype": a.dtype.name,
                "shape": list(a.shape),
                "nbytes": a.nbytes,
                "sharding": a.sharding,
                "shards": len(a.shards),
            }
        )
    return {
        "directory": where,
        "format": FORMAT,
        "data": m.data,
        "hash": m.hash,
        "digest": found,
        "process_count": m.process_count,
        "num_leaves": m.spec.num_leaves,
        "num_params": m.spec.num_params,
        "nbytes": sum(a.nbytes for a in m.arrays),
        "arrays": arrays,
        "processes": per_process,
        "env": m.env,
        "metadata": m.metadata,
        "spec": m.spec.to_dict(),
    }


def render(report: dict[str, Any]) -> str:
    """``summary``'s report as plain text lines for the terminal."""
    lines = [
        f"{report['directory']}  {report['format']}  {report['num_leaves']} arrays  "
        f"{report['num_params']:,} params  {fmt_bytes(report['nbytes'])}  "
        f"{report['process_count']} {'process' if report['process_count'] == 1 else 'processes'}"
        f"  {report['hash']} {report['digest'][:16]}"
    ]
    width = max([len(a["path"] or "<root>") for a in report["arrays"]] + [4])
    for a in report["arrays"]:
        arr = summarize(tuple(a["shape"]), dtype_of(a["dtype"]))
        lines.append(
            f"  {(a['path'] or '<root>').ljust(width)}  {arr:<16} {fmt_bytes(a['nbytes']):>10}  "
            f"{a['shards']} shard{'' if a['shards'] == 1 else 's'}  {a['sharding']}"
        )
    lines.append("processes:")
    for p in report["processes"]:
        n = p["shards"]
        lines.append(
            f"  {p['process']}: {n} shard{'' if n == 1 else 's'}, {fmt_bytes(p['nbytes'])}"
        )
    lines.append("environment: " + ", ".join(f"{k}={v}" for k, v in report["env"].items()))
    meta = report["metadata"]
    lines.append(
        "metadata: " + (json.dumps(meta, sort_keys=True, ensure_ascii=False) if meta else "none")
    )
    return "\n".join(lines)


def verify(directory: str | os.PathLike[str], /, *, like: TreeSpec | None = None) -> dict[str, Any]:
    """Reads every array of a sharded checkpoint in this one process, onto its
    first device, and checks every shard's digest (and, with ``like``, the
    contract first). Needs the memory of the whole checkpoint.

    Returns:
      ``summary``'s report.

    Raises:
      FormatError: for a directory without a well-formed manifest, or one
        whose tree holds custom nodes (load it with ``load_sharded``).
      TreeMismatchError: listing every difference with ``like``.
      IntegrityError: naming every array whose bytes differ.
    """
    import jax  # lazy: reading files never imports jax

    from .load import contract_mismatches, load_sharded

    where = os.path.abspath(os.fspath(directory))
    m = read(where)
    if like is not None:
        found = contract_mismatches(m.spec, like)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=where
            )
    device = jax.sharding.make_single_device_sharding(jax.local_devices()[0])  # type: ignore[no-untyped-call]
    struct: Any = jax.ShapeDtypeStruct
    leaves = [struct(a.shape, a.dtype, sharding=device) for a in m.arrays]
    hint = "verify it with `treeguard.load_sharded(DIR, like)` in Python"
    load_sharded(where, m.tree_of(leaves, str(where), hint=hint))
    return summary(where)
