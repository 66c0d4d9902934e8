"""Provenance: EC keys, trust policies and OpenSSF Model Signing signatures
(see README.md beside this file).

Nothing is imported here: ``errors`` stays importable without the ``sign``
extra (the store catches its classes), and ``treeguard.provenance`` names
the public parts.
"""
