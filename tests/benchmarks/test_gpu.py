"""benchmarks/gpu.py on a machine without a GPU: it plans every cell and records each as skipped with its reason,
in seconds (the GPU paths themselves need a GPU machine: benchmarks/gpu.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
MODELS = ("digits-mlp", "digits-cnn", "resnet18", "mobilenet_v2")
PRECISIONS = {"torch-cuda": ("fp32", "fp16"), "ort-cuda": ("fp32", "fp16", "int8"),
              "tensorrt": ("fp32", "fp16", "int8"), "ort-tensorrt": ("fp32", "fp16", "int8")}
VARIANTS = {m: ("original", "factorize-mac0.5", *(("depth-mac0.7",) if m in ("resnet18", "mobilenet_v2") else ()))
            for m in MODELS}
EXPECTED = {(m, v, b, p, n) for m in MODELS for v in VARIANTS[m] for b, ps in PRECISIONS.items()
            for p in ps for n in (1, 32)}


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _keys(doc: dict) -> set[tuple]:
    return {(c["model"], c["variant"], c["backend"], c["precision"], c["batch"]) for c in doc["cells"]}


@pytest.mark.parametrize("mode", ["--dry-run", "no-gpu"])
def test_every_cell_is_listed_and_skipped_with_a_reason(tmp_path: Path, mode: str) -> None:
    # no-gpu: a real run with every GPU hidden, which is what a CPU-only machine sees
    doc = _run(tmp_path, *([mode] if mode == "--dry-run" else []), env={"CUDA_VISIBLE_DEVICES": ""})
    assert _keys(doc) == EXPECTED and len(doc["cells"]) == len(EXPECTED) == 220
    assert all(c["status"] == "skipped" and c["reason"] and c["latency"] is None for c in doc["cells"])
    assert doc["summary"] == {"ok": 0, "skipped": 220, "failed": 0, "pending": 0}
    assert doc["dry_run"] is (mode == "--dry-run") and doc["elapsed_s"] < 60
    for backend, reason in doc["environment"]["unavailable"].items():
        assert reason.startswith("no GPU: CUDA_VISIBLE_DEVICES hides every device")
        assert {c["reason"] for c in doc["cells"] if c["backend"] == backend} == {reason}


def test_a_child_prepares_a_model_without_residual_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a child measures one model; the digits MLP has no residual block, so it gets no depth variant, and its
    # preparation makes the original and the factorised files (the GPU run once failed here, in the child only)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert gpu.variants("digits-mlp") == ("original", "factorize-mac0.5")
    assert gpu.variants("resnet18") == ("original", "factorize-mac0.5", "depth-mac0.7")
    monkeypatch.setattr(gpu, "VARIANTS", gpu.variants("digits-mlp"))  # as child() sets it
    prep = gpu.prepare("digits-mlp", tmp_path)
    assert prep.errors == {} and set(prep.modules) == {"original", "factorize-mac0.5"}
    assert {v for v, _ in prep.files} == {"original", "factorize-mac0.5"}
