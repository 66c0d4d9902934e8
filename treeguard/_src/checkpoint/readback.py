"""What ``save`` learns before it writes a byte: whether a reader would take
the header it laid out.

A reader holds a header to one budget of objects (``header.table_budget``),
and some trees ``save`` accepts (containers nested around one leaf each,
under keys found nowhere else; a large document in ``metadata=``) lay out a
header over it. ``check_readable`` reads the laid-out header with the
reader's own steps (``files.header_doc``, ``header.within_budget``), so the
refusal and the reader can never disagree: one cost model, the reader's.
"""

from __future__ import annotations

from ..bounded import Bounded
from ..errors import FormatError, InvalidTreeError
from ..hashing import digest
from ..walk import Node
from .files import header_doc
from .format import TABLE_COST_PER_BYTE, TABLE_FREE_COST
from .header import table_budget, within_budget

#: The digests of the last headers read back within the reader's budget, so
#: that the same tree saved again (same metadata) is not read again.
READ_HEADERS = 16
#: The most bytes of objects a reader builds for one byte of header, with
#: room to spare: the dearest JSON value, an empty list, costs the JSON
#: reader 96 bytes for the 2 of ``[]`` (``strictjson``'s upper bounds), a
#: document inside the header is also a string there (about a byte more),
#: and the spec scanner's records cost less per byte of spec than either.
MAX_COST_PER_BYTE = 64
#: No header of at most this many bytes can be over a reader's budget
#: (``TABLE_COST_PER_BYTE`` per byte past ``TABLE_FREE_COST``), so
#: ``check_readable`` does not read one: 68,759 bytes, a tree of a few
#: hundred leaves (the bundled models' headers are a few KiB).
ALWAYS_READ = TABLE_FREE_COST // (MAX_COST_PER_BYTE - TABLE_COST_PER_BYTE)

_HINT = (
    "nothing was written; save the tree as several checkpoints (a part of it in each) or "
    "with treeguard.save_sharded, or as fewer leaves and containers (stack leaves of one "
    "shape into one array), and keep large documents out of metadata="
)

_read: Bounded[str, bool] = Bounded(READ_HEADERS)


def check_readable(header: bytes, root: Node) -> None:
    """Reads the header laid out for ``root`` as a reader does, in its
    budget (its digests, still blank, have their final length), so that
    ``save`` refuses, before it writes a byte, a tree whose file no reader
    would take. A header read so is remembered by its digest
    (``READ_HEADERS`` of them): saving the same tree again costs a hash.
    A header of at most ``ALWAYS_READ`` bytes is within any reader's
    budget, so it is not read at all.

    Raises:
      InvalidTreeError: naming the header's bytes, how many leaves and
        containers, the reader's budget and the part it refused.

    Example:
      >>> import numpy as np
      >>> from treeguard._src.checkpoint.write import laid_out  # which calls this
      >>> draft = laid_out({"w": np.zeros(2, np.float32)})
      >>> check_readable(draft.draft, draft.spec.structure)  # small: within any budget
      >>> laid_out({"w": np.zeros(2, np.float32)}, metadata={"x": [[]] * 60_000})
      Traceback (most recent call last):
      ...
      treeguard.InvalidTreeError: 1 invalid leaf or node in the tree:
        <root>: the header of ... bytes for 1 leaf in 1 container would be refused by ...
      hint: nothing was written; ...
    """
    if len(header) <= ALWAYS_READ:
        return  # within the budget whatever it holds: read by nothing
    key = digest(header, "blake3")
    if _read.get(key):
        return
    try:
        within_budget(header_doc(header, "the header"), len(header), "the header")
    except FormatError as e:
        problem = (
            f"the header of {len(header):,} bytes for {_many(root.num_leaves, 'leaf', 'leaves')} "
            f"in {_many(_containers(root), 'container', 'containers')} would be refused by "
            "read_header and load: reading it would cost more than their "
            f"{table_budget(len(header)):,} bytes of objects ({TABLE_COST_PER_BYTE} per byte "
            f"of header past {TABLE_FREE_COST >> 20} MiB); {e.message}"
        )
        raise InvalidTreeError([("", problem)], hint=_HINT) from None
    _read.put(key, True)


def _many(n: int, one: str, more: str) -> str:
    """``n`` and its noun: ``1 leaf``, ``2 leaves``."""
    return f"{n:,} {one if n == 1 else more}"


def _containers(root: Node) -> int:
    """How many containers ``root`` holds, itself included, each as often as it is met."""
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        if node.kind != "leaf":
            count += 1
            stack.extend(node.children)
    return count
