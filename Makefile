PYTHON ?= python3

# `make test` runs the default selection; slow simulations, benchmarks, LXD and the long fault runs are opt-in.
DEFAULT_MARKERS = not lxd and not bench and not slow and not faults_long

.PHONY: install test test-all lint demo

install:
	PYTHON=$(PYTHON) bash scripts/install-deps.sh

test: install
	$(PYTHON) -m pytest -q -m "$(DEFAULT_MARKERS)"

test-all: install
	$(PYTHON) -m pytest -q -m "not lxd and not bench and not faults_long"

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy federation

demo: install
	$(PYTHON) -m federation.tools.demo
