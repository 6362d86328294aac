# cl-bench developer commands. The README's two front-door commands are `make demo` and
# `make test`; both create/update .venv themselves on a machine with only Python 3.11.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# This machine's pip serves torch 2.14.1 / torchvision 0.29.1 from disk; override elsewhere.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
JOBS ?= 2
export MLFLOW_DISABLE_TELEMETRY := true
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: install demo lint test test-fast test-long test-cluster bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: install
	$(BIN)/cl-bench run --protocol depth-sweep-mini --jobs $(JOBS)

# ruff (pinned in the dev extra; rules in pyproject.toml), run first by `make test`.
lint: install
	$(BIN)/ruff check .

test: lint
	@if [ -x scripts/ensure-chromium.sh ]; then scripts/ensure-chromium.sh; fi
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m "not cluster and not long"

# The edit loop: the suite without the tests that train real models (marked slow) or start a cluster.
test-fast: install
	@if [ -x scripts/ensure-chromium.sh ]; then scripts/ensure-chromium.sh; fi
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m "not slow and not cluster and not long"

# The process-lifecycle checks (SIGKILLs with resume, signals, run isolation, import costs in fresh
# processes), marked long: about 5 minutes on 2 cores, outside `make test` to keep it near 10 minutes.
test-long: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m long

# A real two-node Ray cluster on loopback (ray start --head / ray start --address), ~2 min.
test-cluster: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m cluster tests/test_ray_cluster.py

bench: install
	@for b in benchmarks/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf results .pytest_cache
