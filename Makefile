PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install install-test demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/minreal demo --overwrite

test: install
	$(BIN)/python -m pytest -q tests

bench: install
	$(BIN)/python benchmarks/pipeline.py --out benchmarks/pipeline.json

clean:
	rm -rf runs build *.egg-info .pytest_cache
