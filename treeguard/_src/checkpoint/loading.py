"""``load``: opens a safetensors file once and dispatches on what it holds,
to the native reader (``read.py``) for a treeguard checkpoint, or to the
foreign reader (``foreign.py``) for a file another tool wrote. (The
module is not named ``load``: the package's ``load`` is the function.)
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any, Literal

from ..errors import ConfigError
from .files import open_checkpoint, read_raw_header
from .foreign import Unverified, check_unverified, load_foreign
from .foreignheader import foreign_header, is_foreign
from .names import NamingRule
from .plan import LoadOptions, SurgeryOptions
from .read import check_expect_digest, checked_header, load_native


def load(
    path: str | os.PathLike[str],
    /,
    *,
    like: Any = None,
    rename: Mapping[str, str] | None = None,
    allow_missing: Collection[str] = (),
    expect_digest: str | None = None,
    names: NamingRule | None = None,
    unverified: Unverified = "refuse",
    subtree: str | None = None,
    ignore: Collection[str] = (),
    missing: Literal["error", "init"] = "error",
    init: Any = None,
    unexpected: Literal["error", "drop"] | Collection[str] = "error",
    report: bool = False,
) -> Any:
    """Reads a checkpoint, verified: header, then contract, then every hash.

    In order: the header is read and validated against the file's size (and
    its digest compared with ``expect_digest`` when given); the stored spec
    is compared with ``like`` and every mismatch is reported before any
    array data is read; every tensor is read and its hash checked; only then
    is the tree built. Leaves are matched by key path, never by position,
    and nothing is cast.

    Each returned leaf takes the kind of ``like``'s leaf at its path: a
    ``jax.Array`` is placed with that leaf's sharding (and weak type); a
    ``jax.ShapeDtypeStruct`` becomes a ``jax.Array`` placed with its sharding
    (on the default device without one); a numpy
    scalar or Python number comes back as one; anything else is a numpy
    array. With ``like=None`` the leaves are numpy arrays, dicts, lists,
    tuples and None are rebuilt as stored, and namedtuples and registered
    classes come back as dicts keyed by attribute name or index: classes
    named in a file are never imported.

    Args:
      path: a file written by ``save``.
      like: the tree (or ``TreeSpec``) whose structure the result takes.
      rename: ``{old path: new path}`` for a deliberate migration; a path
        names a leaf or a whole subtree in ``keystr`` form. Needs ``like``.
      allow_missing: paths (leaves or subtrees) of ``like`` that may be
        absent from the checkpoint; those leaves keep ``like``'s values.
        Neither option relaxes anything else: leaf shapes and dtypes and the
        type of every container on both sides are still compared.
      expect_digest: the header digest recorded when the file was verified
        (``Header.digest``); the file read must carry exactly this digest,
        checked on the same open file before any array is read.
      names: for a safetensors file another tool wrote (a *foreign* file),
        how a key path of ``like`` names its tensor: ``"keypath"`` (the
        default, ``['encoder']['layer'][0]['weight']``), ``"dotted"``
        (``encoder.layer.0.weight``), ``"slashed"``
        (``encoder/layer/0/weight``) or a function from the leaf's keys (a
        tuple of str and int) to the name. With ``like=None`` the tree is
        nested by the names (numeric components become string keys). Not
        used for a treeguard checkpoint, whose names are its key paths.
      unverified: what to do with a foreign file, which holds no hashes:
        ``"refuse"`` (the default) raises ``FormatError``; ``"warn"`` loads it
        and emits ``UnverifiedWeightsWarning`` naming the file; ``"allow"``
        loads it on purpose, silently. The header's structure (offsets,
        sizes, dtypes) and the match of names, shapes and dtypes with
        ``like`` are checked either way, before any tensor is read.
      subtree: the key path (``keystr`` form, ``"['encoder']"``) of the one
        stored subtree to load; ``like`` then describes that subtree alone.
        Only its tensors are read and hashed.
      ignore: key paths of stored subtrees or leaves to leave unread (an
        optimizer state, a head); ``like`` then describes the rest. Both are
        checked like a whole load: every mismatch of the selected part is
        listed, before any tensor is read. The part comes back in
        ``like``'s containers: a part of an nnx State (stored as a dict
        inside it) loads into ``like=state['encoder']``, an nnx State or an
        equinox module with entries ignored into ``like`` without them (an
        equinox field as None).
      missing: ``"error"`` (the default): a leaf of ``like`` the file lacks
        is a mismatch; ``"init"``: it takes its value from ``init``.
      init: with ``missing="init"``, the new leaves' values: a tree matched
        by key path (the new model's params: a dict, an nnx State, an
        equinox module, callable or not) or a function from a leaf's key
        path (``"['head']['w']"``) to its array, told apart by what it is (a
        pytree is values, a lone callable a function). Each must have
        ``like``'s shape and dtype.
      unexpected: ``"error"`` (the default): a stored leaf ``like`` lacks is
        a mismatch; ``"drop"``: it is left unused; a list of stored key
        paths: the leaves under them are left unread (as ``ignore``) and
        reported as dropped, and any other stored leaf ``like`` lacks is
        still a mismatch. A rename may then reuse a dropped path.
      report: return ``(tree, Surgery)``, the report of every path
        initialised, renamed or dropped.

    Returns:
      The tree, or ``(tree, Surgery)`` with ``report=True``.

    Raises:
      FormatError: for a file that is not a treeguard checkpoint (a foreign
        safetensors file unless ``unverified`` lets it through), is a
        symbolic link, truncated, oversized or malformed.
      TreeMismatchError: listing every difference between the checkpoint
        and ``like`` (for a foreign file: every missing and unexpected
        tensor name, shape and dtype), raised before any array data is read.
      IntegrityError: naming every tensor whose bytes do not match its
        hash, or if the header digest is not ``expect_digest``.
      ConfigError: for a ``subtree`` or ``ignore`` path that names nothing
        stored (the hint names the nearest stored path), or either of them on
        a foreign file.
      ConfigError: for ``missing="init"`` without ``init``, or an unknown
        ``missing`` or ``unexpected``; ``init`` lacking a leaf or giving one
        of another shape or dtype is a ``TreeMismatchError`` naming each.
      ValueError: for a ``rename`` or ``allow_missing`` path that names
        nothing, ``rename`` without ``like``, or a malformed ``expect_digest``.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> from treeguard import save
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> params = {"dense2": {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)}}
      >>> save(path, params)
      >>> load(path, like=params)["dense2"]["w"].shape
      (3, 1)
      >>> load(path, like={"dense2": {"w": jnp.ones((3, 2)), "b": jnp.zeros(1)}})
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: ...: 1 mismatch between the checkpoint and `like`:
        ['dense2']['w']: shape (3, 2) in `like`, (3, 1) in the checkpoint
      hint: ...

      A safetensors file another tool wrote, matched by dotted names:

      >>> import numpy as np, safetensors.numpy
      >>> hf = os.path.join(os.path.dirname(path), "hf.safetensors")
      >>> safetensors.numpy.save_file({"dense2.w": np.ones((3, 1), np.float32)}, hf)
      >>> like = {"dense2": {"w": jnp.zeros((3, 1))}}
      >>> load(hf, like=like, names="dotted", unverified="allow")["dense2"]["w"].shape
      (3, 1)

      One subtree, and everything but one subtree:

      >>> load(path, like=params["dense2"], subtree="['dense2']")["w"].shape
      (3, 1)
      >>> load(path, like={"dense2": {"b": jnp.zeros(1)}}, ignore=["['dense2']['w']"])
      {'dense2': {'b': Array([0.], dtype=float32)}}

      A model that gained a head and lost a layer, with the report of each change:

      >>> old = os.path.join(os.path.dirname(path), "old.safetensors")
      >>> save(old, {"body": np.ones(3, np.float32), "old": np.ones(2, np.float32)})
      >>> new = {"body": np.zeros(3, np.float32), "head": np.full(4, 0.5, np.float32)}
      >>> tree, changes = load(
      ...     old, like=new, missing="init", init=new, unexpected="drop", report=True)
      >>> tree["head"]
      array([0.5, 0.5, 0.5, 0.5], dtype=float32)
      >>> print(changes)  # doctest: +ELLIPSIS
      /...old.safetensors: 2 changes
        initialised ['head'] f32[4]
        dropped ['old'] f32[2]
    """
    if (rename or allow_missing) and like is None:
        raise ValueError("rename and allow_missing need `like`, the tree to migrate into")
    check_expect_digest(expect_digest)
    surgery = SurgeryOptions(missing, init, unexpected)
    surgery.check(like)
    fd, name = open_checkpoint(path)
    try:
        doc, header_bytes, size = read_raw_header(fd, name)
        if is_foreign(doc):
            fh = foreign_header(doc, header_bytes, size, name)
            check_unverified(unverified, name, stacklevel=2, expect_digest=expect_digest)
            if subtree is not None or ignore or surgery.active or report:
                raise ConfigError(
                    "subtree, ignore, missing, unexpected and report work on the key paths "
                    "a treeguard checkpoint records; this file was written by another tool",
                    context=name,
                    hint="import it once with `treeguard import SRC DST` and load DST",
                )
            return load_foreign(
                fd, fh, like, names or "keypath", rename or {}, allow_missing, expect_digest
            )
        header = checked_header(doc, header_bytes, size, name, expect_digest)
        options = LoadOptions(rename or {}, tuple(allow_missing), subtree, ignore, surgery)
        tree, changes = load_native(fd, header, like, options)
    finally:
        os.close(fd)
    return (tree, changes) if report else tree
