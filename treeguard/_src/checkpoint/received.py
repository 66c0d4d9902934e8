"""Gates on a checkpoint directory received from elsewhere, run before any
library reads it (an orbax directory to import, a sharded checkpoint to
load or verify):

- it holds only directories and regular files: tensorstore follows symbolic
  links and blocks forever opening a FIFO;
- its arrays claim no more bytes than its files can hold: tensorstore fills
  missing chunks, so a few bytes of JSON can ask for terabytes, and a failed
  allocation aborts the process.
"""

from __future__ import annotations

from ..atomic import file_kind
from ..dirtree import plain_tree as _plain_tree
from ..errors import FormatError

#: Deflate cannot expand data by more than about this factor.
DEFLATE_MAX_RATIO = 1032
#: Arrays may claim this many bytes however few the files hold.
CLAIM_FLOOR = 1 << 30
#: The most files and directories a received checkpoint directory may hold.
MAX_ENTRIES = 100_000


def plain_tree(name: str, *, hint: str) -> int:
    """The bytes the regular files under ``name`` hold.

    Args:
      name: the directory.
      hint: the fix for a directory that holds something else.

    Raises:
      FormatError: naming the first entry that is not a directory or a
        regular file (a link, a FIFO, a device, a socket), for more than
        ``MAX_ENTRIES`` entries, or for directories nested deeper than
        ``dirtree.MAX_DEPTH``.

    Example:
      >>> import os, tempfile
      >>> d = tempfile.mkdtemp()
      >>> os.mkfifo(os.path.join(d, "pipe"))
      >>> plain_tree(d, hint="copy it again")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ...: 'pipe' is not a regular file but a FIFO; treeguard reads none...
    """

    def refuse(path: str, mode: int) -> FormatError:
        return FormatError(
            f"{path[:200]!r} is not a regular file but {file_kind(mode)}; "
            "treeguard reads none of those",
            context=name,
            hint=hint,
        )

    def too_big(what: str) -> FormatError:
        return FormatError(f"holds {what}", context=name, hint=hint)

    return _plain_tree(name, max_entries=MAX_ENTRIES, refuse=refuse, too_big=too_big)


def refuse_forged_claim(claimed: int, on_disk: int, name: str, *, compressed: bool = True) -> None:
    """Refuses arrays that claim more bytes than their files can hold.

    Args:
      claimed: the bytes the arrays' shapes and dtypes claim.
      on_disk: the bytes the directory's regular files hold.
      name: the directory, for the message.
      compressed: whether the files may hold compressed arrays (an orbax
        checkpoint from elsewhere): then a claim up to ``DEFLATE_MAX_RATIO``
        times the files (or ``CLAIM_FLOOR``) is taken. With False (a
        treeguard sharded checkpoint, written uncompressed, so every array
        byte is a stored byte) a claim beyond the files' bytes is refused
        outright: a few KiB of compressed zeros cannot pass for a GiB array.

    Raises:
      FormatError: naming both numbers.

    Example:
      >>> refuse_forged_claim(16 << 30, 796, "ck")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ck: its arrays claim 17,179,869,184 bytes, its files hold 796; ...
      >>> refuse_forged_claim(1 << 20, 4096, "ck", compressed=False)
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ck: its arrays claim 1,048,576 bytes, its files hold 4,096; ...
    """
    if not compressed:
        if claimed > on_disk:
            raise FormatError(
                f"its arrays claim {claimed:,} bytes, its files hold {on_disk:,}; the data "
                "is truncated or the shapes are forged (treeguard writes sharded arrays "
                "uncompressed: every array byte is a stored byte)",
                context=name,
                hint="get a fresh copy of the checkpoint",
            )
        return
    limit = max(CLAIM_FLOOR, on_disk * DEFLATE_MAX_RATIO)
    if claimed > limit:
        raise FormatError(
            f"its arrays claim {claimed:,} bytes, its files hold {on_disk:,}; "
            f"more than {DEFLATE_MAX_RATIO}x is a forged shape, not compression",
            context=name,
            hint="get a fresh copy of the checkpoint",
        )
