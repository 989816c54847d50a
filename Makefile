PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# ONNX Runtime wheel: the CPU one by default; `make install GPU=1` takes onnxruntime-gpu (+ TensorRT with TRT=1).
comma := ,
EXTRAS := test,$(if $(GPU),gpu,cpu)$(if $(TRT),$(comma)tensorrt,)
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install install-test demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

$(STAMP): pyproject.toml | $(BIN)/python
	@# the other ONNX Runtime wheel would overwrite this one's module
	-$(BIN)/python -m pip uninstall -q -y $(if $(GPU),onnxruntime,onnxruntime-gpu) 2>/dev/null
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/minreal demo --overwrite

test: install
	$(BIN)/python -m pytest -q tests

bench: install
	$(BIN)/python benchmarks/pipeline.py --out benchmarks/pipeline.json

clean:
	rm -rf runs build *.egg-info .pytest_cache
