PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# ONNX Runtime wheel: the CPU one by default; `make install GPU=1` takes onnxruntime-gpu, TRT=1 adds TensorRT
# (and implies GPU=1).
comma := ,
GPU_WHEEL := $(or $(GPU),$(TRT))
EXTRAS := test,$(if $(GPU_WHEEL),gpu,cpu)$(if $(TRT),$(comma)tensorrt,)
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install install-test demo lint test test-all bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	@# the other ONNX Runtime wheel would overwrite this one's module; with both present, their shared files are
	@# already mixed, so both go before the wanted one is installed again
	@if $(BIN)/python -m pip show -q onnxruntime onnxruntime-gpu >/dev/null 2>&1; then \
		$(BIN)/python -m pip uninstall -q -y onnxruntime onnxruntime-gpu; \
	else \
		$(BIN)/python -m pip uninstall -q -y $(if $(GPU_WHEEL),onnxruntime,onnxruntime-gpu) >/dev/null 2>&1 || true; \
	fi
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/minreal demo --overwrite

# Two pytest workers (pytest-xdist), a test file each at a time, so module fixtures are built once: most tests wait on
# Python, exports and fresh processes, not on both cores. `make test WORKERS=0` runs them in this process; test-all
# stays in one (its 2 GiB model and torchrun runs want the machine to themselves).
WORKERS ?= 2
XDIST := $(if $(filter 0,$(WORKERS)),-p no:xdist,-n $(WORKERS) --dist loadfile)

test: install lint
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST) tests

test-all: install lint
	$(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python benchmarks/pipeline.py --out benchmarks/pipeline.json

clean:
	rm -rf runs build *.egg-info .pytest_cache
