"""treeguard: contracts for JAX parameter trees.

Every mismatch between two pytrees (a renamed layer, a broadcast gradient, a
promoted dtype, a changed checkpoint) becomes one typed error that lists every
difference by key path.
"""

from ._src.checkpoint import ForeignHeader as ForeignHeader
from ._src.checkpoint import Header as Header
from ._src.checkpoint import import_weights as import_weights
from ._src.checkpoint import load as load
from ._src.checkpoint import read_foreign as read_foreign
from ._src.checkpoint import read_header as read_header
from ._src.checkpoint import save as save
from ._src.checkpoint import verify_file as verify_file
from ._src.diff import check as check
from ._src.diff import mismatches as mismatches
from ._src.diff import unflatten as unflatten
from ._src.env import environment as environment
from ._src.errors import ConfigError as ConfigError
from ._src.errors import FormatError as FormatError
from ._src.errors import IntegrityError as IntegrityError
from ._src.errors import InvalidTreeError as InvalidTreeError
from ._src.errors import NonFiniteError as NonFiniteError
from ._src.errors import SignatureError as SignatureError
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
from ._src.sharded.load import load_sharded as load_sharded
from ._src.sharded.save import save_sharded as save_sharded
from ._src.spec import LeafSpec as LeafSpec
from ._src.spec import TreeSpec as TreeSpec
from ._src.spec import spec_of as spec_of
from ._src.step import Cast as Cast
from ._src.store import ArtifactStore as ArtifactStore
from ._src.store import RetentionPolicy as RetentionPolicy
from ._src.update import Updater as Updater
from ._src.update import apply_updates as apply_updates
from ._src.update import tree_map as tree_map
from ._src.update import updater as updater

__version__ = "0.1.0"

__all__ = [
    "ArtifactStore",
    "Cast",
    "ConfigError",
    "ForeignHeader",
    "FormatError",
    "Header",
    "IntegrityError",
    "InvalidTreeError",
    "LeafSpec",
    "Mismatch",
    "NonFiniteError",
    "OptaxStep",
    "RetentionPolicy",
    "SignatureError",
    "StoreError",
    "TracedValueError",
    "TreeMismatchError",
    "TreeSpec",
    "TreeguardError",
    "UnknownVersionError",
    "UnverifiedWeightsWarning",
    "Updater",
    "VerificationError",
    "apply_updates",
    "check",
    "count_nonfinite",
    "environment",
    "find_nonfinite",
    "import_weights",
    "load",
    "load_sharded",
    "mismatches",
    "optax_step",
    "read_foreign",
    "read_header",
    "save",
    "save_sharded",
    "spec_of",
    "tree_map",
    "unflatten",
    "updater",
    "verify_file",
]
