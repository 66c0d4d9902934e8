"""treeguard: contracts for JAX parameter trees.

Every mismatch between two pytrees (a renamed layer, a broadcast gradient, a
promoted dtype, a changed checkpoint) becomes one typed error that lists every
difference by key path.

Every public name resolves on first use (PEP 562), so ``import treeguard``
imports neither JAX nor the modules behind names it does not touch: the
command line reads a spec or a checkpoint header with numpy alone.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ._src.checkpoint import Header as Header
    from ._src.checkpoint import SaveHandle as SaveHandle
    from ._src.checkpoint import import_weights as import_weights
    from ._src.checkpoint import load as load
    from ._src.checkpoint import read_foreign as read_foreign
    from ._src.checkpoint import read_header as read_header
    from ._src.checkpoint import save as save
    from ._src.checkpoint import save_async as save_async
    from ._src.checkpoint import verify_file as verify_file
    from ._src.diff import check as check
    from ._src.diff import mismatches as mismatches
    from ._src.diff import unflatten as unflatten
    from ._src.env import environment as environment
    from ._src.errors import ArtifactError as ArtifactError
    from ._src.errors import ConfigError as ConfigError
    from ._src.errors import ConflictError as ConflictError
    from ._src.errors import DanglingPointerError as DanglingPointerError
    from ._src.errors import ExportError as ExportError
    from ._src.errors import ExportValidationError as ExportValidationError
    from ._src.errors import FormatError as FormatError
    from ._src.errors import IntegrityError as IntegrityError
    from ._src.errors import InvalidTreeError as InvalidTreeError
    from ._src.errors import ModelCodeError as ModelCodeError
    from ._src.errors import ModelExitError as ModelExitError
    from ._src.errors import NonFiniteError as NonFiniteError
    from ._src.errors import NotAStoreError as NotAStoreError
    from ._src.errors import RecorderError as RecorderError
    from ._src.errors import RetiredVersionError as RetiredVersionError
    from ._src.errors import RunInterruptedError as RunInterruptedError
    from ._src.errors import SignatureError as SignatureError
    from ._src.errors import StorageError as StorageError
    from ._src.errors import StoreError as StoreError
    from ._src.errors import TracedValueError as TracedValueError
    from ._src.errors import TreeguardError as TreeguardError
    from ._src.errors import TreeMismatchError as TreeMismatchError
    from ._src.errors import UnknownVersionError as UnknownVersionError
    from ._src.errors import UnverifiedWeightsWarning as UnverifiedWeightsWarning
    from ._src.errors import VerificationError as VerificationError
    from ._src.mismatch import Mismatch as Mismatch
    from ._src.nonfinite import count_nonfinite as count_nonfinite
    from ._src.nonfinite import find_nonfinite as find_nonfinite
    from ._src.optimizer import OptaxStep as OptaxStep
    from ._src.optimizer import optax_step as optax_step
    from ._src.optstate import migrate_opt_state as migrate_opt_state
    from ._src.recorder import Bundle as Bundle
    from ._src.recorder import FlightRecorder as FlightRecorder
    from ._src.recorder import RecordedStep as RecordedStep
    from ._src.recorder import read_bundle as read_bundle
    from ._src.sharded.load import load_sharded as load_sharded
    from ._src.sharded.save import save_sharded as save_sharded
    from ._src.spec import LeafSpec as LeafSpec
    from ._src.spec import TreeSpec as TreeSpec
    from ._src.spec import spec_of as spec_of
    from ._src.store import ArtifactStore as ArtifactStore
    from ._src.store import RetentionPolicy as RetentionPolicy
    from ._src.surgery import Surgery as Surgery
    from ._src.updates import Cast as Cast
    from ._src.updates import Updater as Updater
    from ._src.updates import apply_updates as apply_updates
    from ._src.updates import tree_map as tree_map
    from ._src.updates import updater as updater

__version__ = "0.1.0"

#: Each public name and the module that defines it: the one list of the
#: public surface (``__all__`` is its keys; a test holds the imports above to it).
_EXPORTS: dict[str, str] = {
    "ArtifactError": "._src.errors",
    "ArtifactStore": "._src.store",
    "Bundle": "._src.recorder",
    "Cast": "._src.updates",
    "ConfigError": "._src.errors",
    "ConflictError": "._src.errors",
    "DanglingPointerError": "._src.errors",
    "ExportError": "._src.errors",
    "ExportValidationError": "._src.errors",
    "FlightRecorder": "._src.recorder",
    "FormatError": "._src.errors",
    "Header": "._src.checkpoint",
    "IntegrityError": "._src.errors",
    "InvalidTreeError": "._src.errors",
    "LeafSpec": "._src.spec",
    "Mismatch": "._src.mismatch",
    "ModelCodeError": "._src.errors",
    "ModelExitError": "._src.errors",
    "NonFiniteError": "._src.errors",
    "NotAStoreError": "._src.errors",
    "OptaxStep": "._src.optimizer",
    "RecordedStep": "._src.recorder",
    "RecorderError": "._src.errors",
    "RetentionPolicy": "._src.store",
    "RetiredVersionError": "._src.errors",
    "RunInterruptedError": "._src.errors",
    "SaveHandle": "._src.checkpoint",
    "SignatureError": "._src.errors",
    "StorageError": "._src.errors",
    "StoreError": "._src.errors",
    "Surgery": "._src.surgery",
    "TracedValueError": "._src.errors",
    "TreeMismatchError": "._src.errors",
    "TreeSpec": "._src.spec",
    "TreeguardError": "._src.errors",
    "UnknownVersionError": "._src.errors",
    "UnverifiedWeightsWarning": "._src.errors",
    "Updater": "._src.updates",
    "VerificationError": "._src.errors",
    "apply_updates": "._src.updates",
    "check": "._src.diff",
    "count_nonfinite": "._src.nonfinite",
    "environment": "._src.env",
    "find_nonfinite": "._src.nonfinite",
    "import_weights": "._src.checkpoint",
    "load": "._src.checkpoint",
    "load_sharded": "._src.sharded.load",
    "migrate_opt_state": "._src.optstate",
    "mismatches": "._src.diff",
    "optax_step": "._src.optimizer",
    "read_bundle": "._src.recorder",
    "read_foreign": "._src.checkpoint",
    "read_header": "._src.checkpoint",
    "save": "._src.checkpoint",
    "save_async": "._src.checkpoint",
    "save_sharded": "._src.sharded.save",
    "spec_of": "._src.spec",
    "tree_map": "._src.updates",
    "unflatten": "._src.diff",
    "updater": "._src.updates",
    "verify_file": "._src.checkpoint",
}


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and flag a typo

    def __getattr__(name: str) -> object:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'treeguard' has no attribute {name!r}")
        value = getattr(_importlib.import_module(module, __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = list(_EXPORTS)  # the table is kept sorted (a test checks it)
