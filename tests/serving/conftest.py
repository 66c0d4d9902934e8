"""The serving tests' fixtures; their helpers live in ``serving_support`` (a
name of its own, so it never collides with another directory's conftest)."""

from serving_support import anyio_backend, mlp_server, mlp_store, tiny_store

__all__ = ["anyio_backend", "mlp_server", "mlp_store", "tiny_store"]
