# The README's two commands: `make demo` and `make test`. Both build .venv
# from python3 on first use, so a fresh machine needs nothing installed by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.treeguard-installed
SRC    := treeguard tests benchmarks docs

.PHONY: demo tour test test-accelerator lint typecheck unit docs bench bench-update bench-checkpoint reliability clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/treeguard verify treeguard.examples.mlp:model

tour: $(STAMP)
	$(BIN)/python -m treeguard.examples.tour

test: lint typecheck unit docs

lint: $(STAMP)
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)

typecheck: $(STAMP)
	$(BIN)/mypy

# The default run, then the slow tests, each on two workers (pyproject.toml's
# addopts); a slow test also marked reliability is left to `make reliability`. pytest's exit code 5 (no test ran) fails the target: a selection
# that matches nothing is a broken suite. AFTER_DEFAULT, empty unless given,
# runs between the two: .ci/run starts its next install there, which beside
# the default run (150 s budget) took about 20 s of it.
AFTER_DEFAULT ?=
unit: $(STAMP)
	$(BIN)/python -m pytest -q
	$(AFTER_DEFAULT)
	$(BIN)/python -m pytest -q -m "slow and not reliability"

# The default run on a machine whose default backend is a TPU or a GPU: one
# process (one program at a time holds the chip), the docs' blocks left out;
# scripts/test-accelerator.sh says why. Uses .venv's python when there is one,
# else python3 (the TPU machine has no .venv: see docs/explanation/accelerators.md).
test-accelerator:
	scripts/test-accelerator.sh

# The docs site, offline, into build/site; any warning (a broken link, a
# missing reference) fails it. Not --quiet: it hides the warnings from
# --strict, which then passes.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/tree.py

bench-update: $(STAMP)
	$(BIN)/python benchmarks/update.py

bench-checkpoint: $(STAMP)
	$(BIN)/python benchmarks/checkpoint.py

# The reliability suite: the Ray replica kills alone (.ci/run says why), then
# the rest two tests at a time: its verdicts are states and counts, and its
# time limits safety stops far above what a test needs; the tests that share
# a server carry `xdist_group`, so one worker runs each such group.
reliability: $(STAMP)
	TREEGUARD_RELIABILITY=1 $(BIN)/python -m pytest -q -n 0 -m reliability tests/serving/ray
	TREEGUARD_RELIABILITY=1 $(BIN)/python -m pytest -q -n 2 --dist loadgroup -m reliability \
	  --ignore=tests/serving/ray

clean:
	rm -rf $(VENV) .venv-* build dist *.egg-info
