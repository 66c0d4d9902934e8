"""A contract read from a file without loading it: a checkpoint's header,
any safetensors file's tensor table, or a spec JSON.

Kept apart from the loaders so that ``treeguard spec FILE`` imports the
header readers only (see the package's face)."""

from __future__ import annotations

import os

from ..errors import FormatError
from ..hashing import pread_into
from ..spec import TreeSpec
from .files import open_checkpoint, read_raw_header
from .foreignheader import foreign_header
from .format import K_FORMAT, MAX_HEADER_BYTES
from .header import header_from_doc


def spec_reader(path: str | os.PathLike[str], /) -> TreeSpec | None:
    """The spec in a checkpoint or any safetensors file; None for other files.

    Registered with the CLI so that ``treeguard spec`` and ``treeguard diff``
    read checkpoints as well as spec JSON.

    Raises:
      FormatError: for a file that looks like safetensors but is broken.
    """
    try:
        fd, name = open_checkpoint(path)
    except FormatError:
        raise
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        head = bytearray(9)
        if size < 10 or pread_into(fd, memoryview(head), 0) != 9 or head[8:9] != b"{":
            return None
        n = int.from_bytes(head[:8], "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return None
        doc, header_bytes, size = read_raw_header(fd, name)
        meta = doc.get("__metadata__")
        if isinstance(meta, dict) and K_FORMAT in meta:
            return header_from_doc(doc, header_bytes, size, name).spec
        return foreign_header(doc, header_bytes, size, name).spec
    finally:
        os.close(fd)


def spec_from_file(path: str | os.PathLike[str], /) -> TreeSpec:
    """Reads a contract from a spec JSON file, a checkpoint's header or any
    safetensors file (whose tensors become a flat dict keyed by name).

    Args:
      path: the file.

    Returns:
      The ``TreeSpec``.

    Raises:
      FormatError: if the file is none of these.
      OSError: if it cannot be read.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from treeguard import save
      >>> d = tempfile.mkdtemp()
      >>> save(os.path.join(d, "c.safetensors"), {"w": np.ones(2, np.int8)})
      >>> spec_from_file(os.path.join(d, "c.safetensors"))
      TreeSpec({'w': i8[2]})
    """
    spec = spec_reader(path)
    if spec is not None:
        return spec
    if os.path.islink(os.fspath(path)):
        raise FormatError(
            "is a symbolic link; treeguard never follows links",
            context=os.fspath(path),
            hint="pass the link's target path if you trust it",
        )
    return TreeSpec.load(path)
