"""The single-file checkpoint: format, files, write, read, migrate, foreign weights (see
README.md).

The package imports the format and the header readers only; every other
name resolves on first use (``faces.lazy_face``), so reading a contract
from a file (``treeguard spec FILE``) loads neither the loaders, nor the
writers, nor the readers of other tools' files."""

import typing as _typing

from .. import faces as _faces
from .files import open_checkpoint as open_checkpoint
from .format import ALLOWED_DTYPES as ALLOWED_DTYPES
from .format import FORMAT as FORMAT
from .format import FORMAT_VERSION as FORMAT_VERSION
from .format import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from .format import Header as Header
from .format import TensorInfo as TensorInfo
from .format import encode_header as encode_header
from .format import header_digest as header_digest
from .specread import spec_from_file as spec_from_file
from .specread import spec_reader as spec_reader

if _typing.TYPE_CHECKING:
    from ..atomic import remove_stale_temps as remove_stale_temps
    from .asyncsave import SaveHandle as SaveHandle
    from .asyncsave import save_async as save_async
    from .foreignheader import ForeignHeader as ForeignHeader
    from .loading import load as load
    from .read import read_header as read_header
    from .read import verify_file as verify_file
    from .sources import import_weights as import_weights
    from .sources import read_foreign as read_foreign
    from .write import save as save
    from .write import user_metadata_json as user_metadata_json

#: Each name resolved on first use and the module that defines it.
_LAZY = {
    "ForeignHeader": ".foreignheader",
    "SaveHandle": ".asyncsave",
    "import_weights": ".sources",
    "load": ".loading",
    "read_foreign": ".sources",
    "read_header": ".read",
    "remove_stale_temps": "..atomic",
    "save": ".write",
    "save_async": ".asyncsave",
    "user_metadata_json": ".write",
    "verify_file": ".read",
}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above
    __getattr__, __dir__ = _faces.lazy_face(__name__, _LAZY)

__all__ = [
    "ALLOWED_DTYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "ForeignHeader",
    "MAX_HEADER_BYTES",
    "Header",
    "SaveHandle",
    "TensorInfo",
    "encode_header",
    "header_digest",
    "import_weights",
    "load",
    "open_checkpoint",
    "read_foreign",
    "read_header",
    "remove_stale_temps",
    "save",
    "save_async",
    "spec_from_file",
    "spec_reader",
    "user_metadata_json",
    "verify_file",
]
