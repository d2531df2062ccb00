# gspo-cli: `make run` trains the quickstart, `make test` runs the tests; both set up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast clean

setup: $(STAMP)

# torch first, pinned: this pin resolves to the CPU build here; an unpinned torch would pull
# a multi-GB CUDA build as a dependency of the package.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,math]"
	touch $(STAMP)

run: setup
	$(BIN)/gspo train experiments/quickstart.yaml
	$(BIN)/gspo compare results/quickstart
	$(BIN)/gspo plot results/quickstart

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache
