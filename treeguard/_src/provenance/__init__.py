"""Provenance: EC keys, trust policies and OpenSSF Model Signing signatures
(see README.md beside this file)."""

from .errors import BadSignatureError as BadSignatureError
from .errors import KeyFileError as KeyFileError
from .errors import MissingSignatureError as MissingSignatureError
from .errors import ProvenanceError as ProvenanceError
from .errors import RevokedKeyError as RevokedKeyError
from .errors import SignedDigestError as SignedDigestError
from .errors import UntrustedKeyError as UntrustedKeyError
from .keys import CURVES as CURVES
from .keys import PrivateKey as PrivateKey
from .keys import PublicKey as PublicKey
from .keys import generate_keys as generate_keys
from .keys import load_public_key as load_public_key
from .keys import load_signing_key as load_signing_key
from .model import SIGNATURE_NAME as SIGNATURE_NAME
from .model import SignedModel as SignedModel
from .model import sign_model as sign_model
from .model import verify_model as verify_model
from .oms import Manifest as Manifest
from .trust import REVOKED_ENV as REVOKED_ENV
from .trust import TRUSTED_ENV as TRUSTED_ENV
from .trust import TrustPolicy as TrustPolicy
