"""The whole flow through the Python API (no CLI): train on digits, compress, export, quantise, benchmark.

Run: .venv/bin/python examples/python_api.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import minreal.runtime_bench as rb
from minreal.compress import compress
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.compress.models import small_cnn
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.onnx_export import to_onnx
from minreal.export.simplify import simplify
from minreal.export.verify import verify_parity


def main() -> None:
    train_set, test_set = digits(seed=0)
    fit, val = train_set.split(0.15, seed=1)
    model = small_cnn(1, (32, 64, 64), 10)
    train(model, fit, val, TrainConfig(epochs=10))

    small, report = compress(model, train_set, "factorize", FactorizeConfig(layer_mac_ratio=0.5, rank_multiple=16))
    print(f"MACs {report.macs_before} -> {report.macs_after}, measured {report.measured}")

    out = Path(tempfile.mkdtemp(prefix="minreal-example-"))
    x = test_set.x
    for name, module in (("original", model), ("compressed", small)):
        to_onnx(module, x[:2], out / f"{name}.raw.onnx")
        simplify(out / f"{name}.raw.onnx", out / f"{name}.onnx", check_inputs=[x[:4].numpy()])
        verify_parity(module, out / f"{name}.onnx", [x[:1], x[:16]], rtol=1e-3, atol=1e-4)
    quantize_int8(out / "compressed.onnx", out / "compressed.int8.onnx", train_set.x[:256].numpy(),
                  QuantConfig(target="cpu"))

    entries = [rb.ModelEntry(n, out / f"{n}.onnx") for n in ("original", "compressed", "compressed.int8")]
    bench = rb.run_benchmark(entries, rb.BenchConfig(batch_sizes=(1, 32), min_seconds=0.5),
                             x.numpy(), test_set.y.numpy())
    print(rb.format_table(bench))
    gate = rb.check_report(bench, max_accuracy_drop=2.0, min_agreement=0.95)
    print(rb.format_check(gate))


if __name__ == "__main__":
    main()
