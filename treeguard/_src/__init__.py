"""treeguard's implementation; the public names are re-exported by ``treeguard``."""

from .jaxversion import check_jax_version, installed_jax

check_jax_version(installed_jax())
