PYTHON ?= python3

# `make test` runs the linter and the type checker, then the default test selection (each step stops
# the run when it fails); slow simulations, benchmarks, LXD, the long fault runs, the long live fuzz and the
# container image (podman) are opt-in.
DEFAULT_MARKERS = not lxd and not bench and not slow and not faults_long and not fuzz_long and not container and not lb_long

.PHONY: install test test-all lint demo

install:
	PYTHON=$(PYTHON) bash scripts/install-deps.sh

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy federation suites

# Two workers (pytest-xdist), each test file whole in one of them (its module fixtures start once): most of the
# time real tests wait for brokers and wrappers, so two halve the wall time on two CPUs (README, "Test markers").
WORKERS = -n 2 --dist loadfile

test: lint
	$(PYTHON) -m pytest -q $(WORKERS) --durations=30 -m "$(DEFAULT_MARKERS)"

test-all: lint
	$(PYTHON) -m pytest -q $(WORKERS) -m "not lxd and not bench and not faults_long and not fuzz_long and not container and not lb_long"

demo: install
	$(PYTHON) -m federation.tools.demo
