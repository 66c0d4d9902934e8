#!/usr/bin/env bash
# The default test run on a machine whose default backend is a TPU or a GPU
# (`make test-accelerator`; on the CPU box it runs the same tests on the CPU).
#
# One process: one program at a time may hold the chip, so no pytest-xdist
# workers (children that need no chip run with JAX_PLATFORMS=cpu, through
# tests/subproc.py). Tests that need several devices take them from the CPU
# backend (tests/machine.py). The docs' code blocks are left out (they build
# the site's pages); the slow and reliability suites too, as in `make test`'s
# default run. jax's cloud_tpu_init warns about transparent hugepages, which
# pytest's filterwarnings=error would turn into a collection error.
#
#   scripts/test-accelerator.sh [pytest args...]    # e.g. --junitxml=out.xml
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PYTHON" -c 'import jax; d = jax.devices()[0]; print(f"jax {jax.__version__}, default backend {jax.default_backend()} ({d.device_kind}), {jax.device_count()} device(s)")'
exec "$PYTHON" -m pytest -o addopts="" -p no:cacheprovider -p no:randomly \
  --doctest-modules --ignore=treeguard/_src/serving/ray/replica.py --ignore=tests/docs \
  -m "not slow and not reliability" \
  -W "ignore:Transparent hugepages:UserWarning" -W "ignore:cloud_tpu_init failed:UserWarning" \
  -q -rfE "$@"
