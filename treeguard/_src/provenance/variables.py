"""The environment variables that name key files, importable without the ``sign`` extra.

A store reads them to tell whether EC keys are asked for before it imports
anything that needs ``cryptography``.
"""

#: The variable naming the private key a store signs verdicts with.
SIGNING_KEY_ENV = "TREEGUARD_SIGNING_KEY_FILE"
#: The variable naming trusted public key files, joined by ``os.pathsep``.
TRUSTED_ENV = "TREEGUARD_TRUSTED_KEYS"
#: The variable naming revoked public key files, joined by ``os.pathsep``.
REVOKED_ENV = "TREEGUARD_REVOKED_KEYS"
#: Every one of them.
KEY_VARIABLES = (SIGNING_KEY_ENV, TRUSTED_ENV, REVOKED_ENV)
