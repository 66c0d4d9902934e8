"""The one hashing engine: BLAKE3 and sha256, chunked, threaded, overlapped
with the reads and writes that move the bytes.

Every digest treeguard records or checks is computed here. The engine is a
pipeline: the calling thread moves a chunk (``preadv`` into the array's
final buffer, or a ``write`` of the leaf's own buffer) and hands the same
memory to a worker, then moves the next chunk while the worker hashes the
last one. No byte is copied after it is read. The threads are named
``treeguard-hash-N`` and ``treeguard-hash-read_N``; they are joined before
any call here returns or raises, so no hashing thread outlives a failed load.

Its parts:

* ``engine``: the algorithms, ``digest(buf, algorithm)`` of bytes in
  memory, and ``Pipeline(algorithm)``, the streaming form under all the
  rest: ``feed(key, chunk)`` any number of chunks per key, in order, then
  ``digests()``;
* ``sources``: what is read, a descriptor or a ``RangeReader`` (an object in
  a bucket, hashed as it downloads; ``BytesReader``'s bytes in memory),
  ``pread_into``, ``ShortRead``, and ``announce``, which tells a
  ``PlannedReader`` the ranges it will be asked for;
* ``reads``: ``Span(offset, dest, expected)`` and ``read_spans(fd, spans,
  algorithm)``, file ranges read straight into their buffers and hashed in
  one call (``mismatched`` names the spans whose digest is not their
  ``expected``); ``hash_ranges`` and ``hash_file``, keeping none of the bytes;
* ``writes``: ``write_hashed(fd, buffers, algorithm)`` writes buffers while
  hashing them; ``copy_hashed(dest, buffers, algorithm)`` copies them into
  memory instead;
* ``memo``: the digests of the jax arrays a verified load handed back,
  held weakly by identity, so that a dedup store's put need not hash them
  again.
"""

from . import memo as memo
from .engine import ALGORITHMS as ALGORITHMS
from .engine import CHUNK as CHUNK
from .engine import DEFAULT as DEFAULT
from .engine import HEX_LEN as HEX_LEN
from .engine import HEX_RE as HEX_RE
from .engine import THREAD_PREFIX as THREAD_PREFIX
from .engine import Algorithm as Algorithm
from .engine import Pipeline as Pipeline
from .engine import check_algorithm as check_algorithm
from .engine import digest as digest
from .engine import hasher as hasher
from .reads import MAX_READERS as MAX_READERS
from .reads import Span as Span
from .reads import hash_file as hash_file
from .reads import hash_ranges as hash_ranges
from .reads import mismatched as mismatched
from .reads import prefault as prefault
from .reads import read_spans as read_spans
from .reads import small_pages as small_pages
from .sources import BytesReader as BytesReader
from .sources import PlannedReader as PlannedReader
from .sources import RangeReader as RangeReader
from .sources import ShortRead as ShortRead
from .sources import Source as Source
from .sources import announce as announce
from .sources import pread_into as pread_into
from .sources import source_size as source_size
from .writes import WRITE_PIECE as WRITE_PIECE
from .writes import copy_hashed as copy_hashed
from .writes import write_hashed as write_hashed
