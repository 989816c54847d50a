"""Benchmark 1 (issue 3): test accuracy vs factorisable-MAC ratio, factorize vs plain SVD, three allocators.

Models: the demo CNN (minreal.compress.models.small_cnn) and a CIFAR-style ResNet-20 (He et al. 2016, §4.2), both
trained briefly on the offline digits data (8×8, as is). No fine-tuning after compression.
Writes benchmarks/factorize_accuracy.json and benchmarks/factorize_accuracy.png.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/factorize_accuracy.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from _common import pyplot, save_figure, write_json
from torch import nn

from minreal.compress import compress
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.compress.methods.svd import SVDConfig
from minreal.compress.models import small_cnn

OUT = Path(__file__).with_suffix(".json")
RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
ALLOCATORS = ("lagrangian", "energy", "uniform")


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


def resnet20(in_channels: int = 1, num_classes: int = 10) -> nn.Sequential:
    """CIFAR ResNet-20: 3×3 stem, three stages of three basic blocks (16, 32, 64 channels), pool, linear."""
    layers: list[nn.Module] = [nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for i, w in enumerate((16, 32, 64)):
        for j in range(3):
            layers.append(_Block(cin, w, 2 if i > 0 and j == 0 else 1))
            cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def _accuracy(model: nn.Module, data) -> float:
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).double().mean())


def main() -> None:
    torch.manual_seed(0)
    train_set, test_set = digits()
    results = {"ratios": RATIOS, "models": {}}
    for name, model in (("demo_cnn", small_cnn()), ("resnet20", resnet20())):
        train(model, train_set, test_set, TrainConfig(epochs=15, seed=0))
        entry = {"accuracy_original": _accuracy(model, test_set), "runs": []}
        with tempfile.TemporaryDirectory() as cache:
            for method in ("factorize", "svd"):
                for alloc in ALLOCATORS:
                    for ratio in RATIOS:
                        cfg = (FactorizeConfig(layer_mac_ratio=ratio, allocator=alloc, cache_dir=cache)
                               if method == "factorize"
                               else SVDConfig(layer_mac_ratio=ratio, allocator=alloc))
                        t0 = time.perf_counter()
                        new, rep = compress(model, train_set, method, cfg)
                        entry["runs"].append({
                            "method": method, "allocator": alloc, "flops": ratio,
                            "factorizable_mac_ratio": rep.predicted["factorizable_mac_ratio"],
                            "whole_model_mac_ratio": rep.mac_ratio,
                            "accuracy": _accuracy(new, test_set),
                            "calib_relative_output_error": rep.measured["relative_output_error"],
                            "seconds": time.perf_counter() - t0})
        results["models"][name] = entry
        print(name, entry["accuracy_original"], flush=True)
    write_json(OUT, results)
    _plot(results)


def _plot(results: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(results["models"]), figsize=(11, 4))
    for ax, (name, entry) in zip(axes, results["models"].items()):
        for method, style in (("factorize", "-"), ("svd", "--")):
            for alloc, marker in zip(ALLOCATORS, "osx"):
                pts = [(r["factorizable_mac_ratio"], r["accuracy"]) for r in entry["runs"]
                       if r["method"] == method and r["allocator"] == alloc]
                ax.plot(*zip(*pts), style, marker=marker, label=f"{method}/{alloc}")
        ax.axhline(entry["accuracy_original"], color="k", lw=0.8, label="original")
        ax.set(title=f"{name} on digits (no fine-tuning)", xlabel="factorisable MAC ratio", ylabel="test accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, OUT.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
