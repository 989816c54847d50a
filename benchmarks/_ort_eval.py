"""Top-1 predictions and accuracy of ONNX classifiers in ONNX Runtime's CPU provider, with numpy and onnxruntime only.

Small enough to run under an emulator (``qemu-x86_64 -cpu Haswell``: ONNX Runtime then dispatches its AVX2 kernels),
where importing torch would take minutes: :mod:`int8_formats` runs it there and imports it to run the same code
natively. The inputs file is an ``.npz`` whose arrays are the graph inputs by name (rows along axis 0) and the
labels as ``y``.

Usage: .venv/bin/python benchmarks/_ort_eval.py --inputs X.npz --models a.onnx b.onnx --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

__all__ = ["LABELS", "load_inputs", "predict", "evaluate"]

#: The key of the labels in an inputs file; every other array is a graph input.
LABELS = "y"


def load_inputs(path: str | Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The graph inputs by name and the labels of an inputs file."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    return {k: v for k, v in arrays.items() if k != LABELS}, arrays[LABELS]


def _session(path: str | Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def predict(path: str | Path, feeds: Mapping[str, np.ndarray], batch: int = 256, threads: int = 0) -> np.ndarray:
    """Argmax of the first output of ``path`` on ``feeds`` (run in chunks of ``batch`` rows; ``threads`` 0: ONNX
    Runtime's default)."""
    session = _session(path, threads)
    rows = len(next(iter(feeds.values())))
    out = []
    for start in range(0, rows, batch):
        chunk = {name: array[start:start + batch] for name, array in feeds.items()}
        out.append(np.asarray(session.run(None, chunk)[0]).argmax(axis=-1))
    return np.concatenate(out).astype(np.int64)


def evaluate(paths: Sequence[str | Path], feeds: Mapping[str, np.ndarray], y: np.ndarray, batch: int = 256,
             threads: int = 0) -> dict[str, dict[str, Any]]:
    """Per model (keyed by its path as given): predictions, top-1 accuracy (%) and the wall time of the pass."""
    results = {}
    for path in paths:
        t0 = time.perf_counter()
        pred = predict(path, feeds, batch, threads)
        results[str(path)] = {"predictions": pred.tolist(), "accuracy": round(100 * float((pred == y).mean()), 2),
                              "seconds": round(time.perf_counter() - t0, 2)}
    return results


def _write(path: Path, document: Any) -> None:
    """Write JSON atomically (a temporary file in the same folder, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=Path, required=True, help=".npz: graph inputs by name, labels as 'y'")
    ap.add_argument("--models", nargs="+", required=True, help="ONNX files")
    ap.add_argument("--out", type=Path, required=True, help="JSON written atomically")
    ap.add_argument("--batch", type=int, default=256, help="rows per ONNX Runtime call")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    args = ap.parse_args()
    feeds, y = load_inputs(args.inputs)
    results = evaluate(args.models, feeds, y, args.batch, args.threads)
    _write(args.out, {"onnxruntime": ort.__version__, "rows": int(len(y)), "models": results})


if __name__ == "__main__":
    main()
