PYTHON ?= python3

# `make test` runs the linter and the type checker, then the default test selection (each step stops
# the run when it fails); slow simulations, benchmarks, LXD, the long fault runs and the long live fuzz are opt-in.
DEFAULT_MARKERS = not lxd and not bench and not slow and not faults_long and not fuzz_long

.PHONY: install test test-all lint demo

install:
	PYTHON=$(PYTHON) bash scripts/install-deps.sh

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy federation

test: lint
	$(PYTHON) -m pytest -q --durations=30 -m "$(DEFAULT_MARKERS)"

test-all: lint
	$(PYTHON) -m pytest -q -m "not lxd and not bench and not faults_long and not fuzz_long"

demo: install
	$(PYTHON) -m federation.tools.demo
