"""Every exception treeguard raises, in one place.

The hierarchy (each class also subclasses the builtin in brackets, so an
existing ``except ValueError`` keeps working)::

    TreeguardError
    ├── TreeMismatchError      [ValueError]        two trees or specs differ
    ├── InvalidTreeError       [TypeError]         a cycle, a non-array leaf, too deep
    ├── FormatError            [ValueError]        a file or JSON that is not ours
    ├── IntegrityError         [ValueError]        bytes that do not match their hash
    ├── VerificationError      [AssertionError]    an acceptance check failed
    ├── NonFiniteError         [FloatingPointError] an update produced NaN or Inf
    ├── RecorderError          [RuntimeError]      a flight-recorder bundle not written
    ├── TracedValueError       [TypeError]         a concrete check under a transform
    ├── ConfigError            [ValueError]        a misconfigured model or command
    ├── ModelCodeError         [RuntimeError]      the model's own code failed to import or build
    │   └── ModelExitError                         the model's code raised SystemExit
    ├── RunInterruptedError    [RuntimeError]      a run stopped by KeyboardInterrupt
    ├── DiagnosisError         [ValueError]        a diagnosis that cannot run as asked
    ├── ServingError           [RuntimeError]      the server refused a swap or rollback
    │   └── NonFiniteVersionError                  a version whose params hold NaN or Inf
    ├── InvalidRequestError    [ValueError]        a request refused before device work
    ├── ExportError            [ValueError]        a model function jax.export cannot export
    │   └── ExportValidationError                  an export that differs from the live model
    ├── ArtifactError          [RuntimeError]      an exported artifact not servable here
    ├── BenchError             [ValueError]        a benchmark that cannot run or compare
    │   └── MachineMismatchError                   results from two different machines
    └── StoreError             [ValueError]        the store refused an operation
        ├── NotAStoreError                         a directory that is not a store
        ├── UnknownVersionError [LookupError]      no such version
        │   └── RetiredVersionError                a name gc retired: never current again
        ├── DanglingPointerError                   the pointer names a version that is gone
        ├── SignatureError                         a verdict unsigned or wrongly signed
        ├── ConflictError                          another process changed it first
        └── StorageError                           the disk or the bucket failed

    UnverifiedWeightsWarning   [UserWarning]       weights loaded that no hash checked

A message is rendered from the error's fields, never edited as a string:
``context`` (where: a file, a version), the message itself, and ``hint`` (the
likely fix), always as a last line ``hint: ...``. Each class carries the exit
code the command line uses for it (``exit_code``): 1 for a check that ran and
failed (a mismatch, a hash that differs, a refused store operation), 2 for
input that could not be used, 4 for a model whose own code failed or exited,
130 for an interrupted run. The command line reads it from the class and
never chooses another.

Each class names the public face that exports it as its ``__module__`` (a
``ServingError`` shows as ``treeguard.serving.ServingError``; ``FACES`` says
which face), and pickles from its fields, never through its ``__init__``, so
an error crosses a process boundary (a Ray replica, a process pool) whole:
its class, every field, its text and its exit code.

Example:
  >>> e = FormatError("header is not JSON", context="model.safetensors", hint="re-save it")
  >>> print(e)
  model.safetensors: header is not JSON
  hint: re-save it
  >>> e.exit_code
  2
"""

from __future__ import annotations

from .base import LISTED as LISTED
from .base import TreeguardError as TreeguardError
from .base import cap_lines as cap_lines
from .base import present_as as present_as
from .data import FormatError as FormatError
from .data import IntegrityError as IntegrityError
from .data import InvalidTreeError as InvalidTreeError
from .data import NonFiniteError as NonFiniteError
from .data import RecorderError as RecorderError
from .data import TracedValueError as TracedValueError
from .data import TreeMismatchError as TreeMismatchError
from .data import VerificationError as VerificationError
from .export import ArtifactError as ArtifactError
from .export import ExportError as ExportError
from .export import ExportValidationError as ExportValidationError
from .run import BenchError as BenchError
from .run import ConfigError as ConfigError
from .run import DiagnosisError as DiagnosisError
from .run import InvalidRequestError as InvalidRequestError
from .run import MachineMismatchError as MachineMismatchError
from .run import ModelCodeError as ModelCodeError
from .run import ModelExitError as ModelExitError
from .run import NonFiniteVersionError as NonFiniteVersionError
from .run import RunInterruptedError as RunInterruptedError
from .run import ServingError as ServingError
from .run import UnverifiedWeightsWarning as UnverifiedWeightsWarning
from .store import ConflictError as ConflictError
from .store import DanglingPointerError as DanglingPointerError
from .store import NotAStoreError as NotAStoreError
from .store import RetiredVersionError as RetiredVersionError
from .store import SignatureError as SignatureError
from .store import StorageError as StorageError
from .store import StoreError as StoreError
from .store import UnknownVersionError as UnknownVersionError

#: Each public face and the classes it exports: each class names its face as
#: its ``__module__`` (``treeguard.serving.ServingError`` in a traceback, and
#: where pickle finds it). The provenance errors, defined beside their code,
#: name theirs there.
FACES: dict[str, tuple[type[BaseException], ...]] = {
    "treeguard": (
        TreeguardError,
        TreeMismatchError,
        InvalidTreeError,
        FormatError,
        IntegrityError,
        VerificationError,
        NonFiniteError,
        RecorderError,
        TracedValueError,
        StoreError,
        NotAStoreError,
        UnknownVersionError,
        RetiredVersionError,
        DanglingPointerError,
        SignatureError,
        ConflictError,
        StorageError,
        ConfigError,
        ModelCodeError,
        ModelExitError,
        RunInterruptedError,
        ExportError,
        ExportValidationError,
        ArtifactError,
        UnverifiedWeightsWarning,
    ),
    "treeguard.serving": (ServingError, NonFiniteVersionError, InvalidRequestError),
    "treeguard.diagnose": (DiagnosisError,),
    "treeguard.bench": (BenchError, MachineMismatchError),
}
for _face, _classes in FACES.items():
    present_as(_face, *_classes)
del _face, _classes

#: Every class of this package, each exported by a face.
CLASSES: tuple[type[BaseException], ...] = tuple(
    cls for classes in FACES.values() for cls in classes
)
