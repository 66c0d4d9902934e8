"""``treeguard.provenance``: who signed a model, checked where it is used.

EC keys in PEM (P-256, P-384, P-521; ``generate_keys``, or ``treeguard keys
new NAME``), a ``TrustPolicy`` of trusted and revoked public keys, and
signatures in the OpenSSF Model Signing v1.0 format: ``sign_model`` writes
one that ``model_signing verify key`` accepts, ``verify_model`` checks one
that ``model_signing sign key`` wrote. A store takes its keys from
``$TREEGUARD_SIGNING_KEY_FILE``, ``$TREEGUARD_TRUSTED_KEYS`` and
``$TREEGUARD_REVOKED_KEYS`` (paths joined by ``os.pathsep``); a signature
is written as ``model.sig``. Needs the ``sign`` extra
(``pip install 'treeguard[sign]'``).

The errors and ``Trail`` are imported with the package; every other name
resolves on first use, so an error crosses to a process without the
``sign`` extra (a store's refusal, unpickled on a Ray replica) whole.
"""

import typing as _typing

from .._src import faces as _faces
from .._src.provenance.errors import BadSignatureError as BadSignatureError
from .._src.provenance.errors import KeyFileError as KeyFileError
from .._src.provenance.errors import MissingSignatureError as MissingSignatureError
from .._src.provenance.errors import ProvenanceError as ProvenanceError
from .._src.provenance.errors import RevokedKeyError as RevokedKeyError
from .._src.provenance.errors import SignedDigestError as SignedDigestError
from .._src.provenance.errors import UntrustedKeyError as UntrustedKeyError
from .._src.provenance.trail import Trail as Trail

if _typing.TYPE_CHECKING:
    from .._src.provenance.keys import PrivateKey as PrivateKey
    from .._src.provenance.keys import PublicKey as PublicKey
    from .._src.provenance.keys import generate_keys as generate_keys
    from .._src.provenance.model import SignedModel as SignedModel
    from .._src.provenance.model import sign_model as sign_model
    from .._src.provenance.model import verify_model as verify_model
    from .._src.provenance.oms import ModelManifest as ModelManifest
    from .._src.provenance.trust import TrustPolicy as TrustPolicy

#: Each name that needs ``cryptography``, by the module that defines it.
_LAZY = {
    name: f"treeguard._src.provenance.{module}"
    for module, names in {
        "keys": ("PrivateKey", "PublicKey", "generate_keys"),
        "model": ("SignedModel", "sign_model", "verify_model"),
        "oms": ("ModelManifest",),
        "trust": ("TrustPolicy",),
    }.items()
    for name in names
}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above
    __getattr__, __dir__ = _faces.lazy_face(__name__, _LAZY)

__all__ = [
    "BadSignatureError",
    "KeyFileError",
    "MissingSignatureError",
    "ModelManifest",
    "PrivateKey",
    "ProvenanceError",
    "PublicKey",
    "RevokedKeyError",
    "SignedDigestError",
    "SignedModel",
    "Trail",
    "TrustPolicy",
    "UntrustedKeyError",
    "generate_keys",
    "sign_model",
    "verify_model",
]
