"""Per-layer latency tables for ``factorize --latency``: each factorisable layer and its factorised pair at a
geometric grid of ranks, exported alone to ONNX and timed in isolation on the target provider.

The table is JSON, ``{"provider", "model_hash", "input_shape", "model_ms", "layers": {name: {"keep_ms", "ranks",
"ms"}}}``
(median latencies in milliseconds), and is reused when it already exists for the same model and settings.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from compress.core.cache import model_key
from compress.core.lowrank import build_pair, matrix_view
from compress.core.lowrank_plan import find_targets
from export.atomic import atomic_path
from runtime_bench.config import default_threads
from runtime_bench.providers import provider_name, unavailable_reason
from runtime_bench.sessions import create_session
from runtime_bench.timing import latency_stats, time_interleaved

__all__ = ["TIMING", "rank_grid", "build_latency_table"]

logger = logging.getLogger(__name__)

TIMING: dict[str, float] = {"warmup": 5, "min_runs": 20, "min_seconds": 0.05}
"""Short settings of the shared timing loop: one layer in isolation is fast and steady."""


def rank_grid(max_rank: int, points: int, multiple: int = 1) -> list[int]:
    """Increasing ranks, geometrically spaced from 1 to ``max_rank``, rounded up to ``multiple`` (clipped)."""
    raw = np.geomspace(1, max_rank, max(points, 2))
    ranks = np.minimum(np.ceil(np.round(raw) / multiple) * multiple, max_rank).astype(int)
    return sorted({int(r) for r in ranks if r >= 1})


def _input_shapes(model: nn.Module, example: torch.Tensor, names: list[str]) -> dict[str, tuple[int, ...]]:
    """Input shape of each named layer on ``example`` (captured with forward hooks)."""
    shapes: dict[str, tuple[int, ...]] = {}
    modules = dict(model.named_modules())

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            shapes.setdefault(name, tuple(inputs[0].shape))
        return record

    hooks = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in hooks:
            h.remove()
    return shapes


def _random_pair(layer: nn.Module, rank: int) -> nn.Module:
    v = matrix_view(layer)
    return build_pair(layer, torch.randn(v.groups, rank, v.fan_in), torch.randn(v.groups, v.out_per_group, rank))


def _export(module: nn.Module, shape: tuple[int, ...], path: Path) -> Path:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(shape),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    return path


def _time_layer(layer: nn.Module, shape: tuple[int, ...], ranks: list[int], provider: str, threads: int,
                folder: Path) -> tuple[float, list[float]]:
    """Median latency (ms) of the layer and of its pair at each rank, timed interleaved."""
    modules = [layer] + [_random_pair(layer, r) for r in ranks]
    feed = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    sessions = [create_session(_export(m, shape, folder / f"m{i}.onnx"), provider, threads)
                for i, m in enumerate(modules)]
    runs = time_interleaved([lambda s=s: s.run(None, feed) for s in sessions], int(TIMING["warmup"]),
                            int(TIMING["min_runs"]), TIMING["min_seconds"])
    medians = [latency_stats(ms, shape[0]).p50_ms for ms in runs]
    return medians[0], medians[1:]


def _cached(out_path: Path, header: dict[str, Any]) -> dict[str, Any] | None:
    try:
        table = json.loads(out_path.read_text())
    except (OSError, ValueError):
        return None
    same = all(table.get(k) == v for k, v in header.items()) and "model_ms" in table  # older tables: rebuild
    return table if same else None


def build_latency_table(model: nn.Module, example_input: torch.Tensor, provider: str = "cpu",
                        ranks_per_layer: int = 6, rank_multiple: int = 1, out_path: str | Path = "latency.json",
                        threads: int | None = None) -> dict[str, Any]:
    """Measure (or reuse) the per-layer latency table of ``model`` on ``provider`` and write it to ``out_path``.

    Args:
        model: the torch model; its factorisable layers are those ``factorize`` would target.
        example_input: a batch at the batch size to optimise for (fixes each layer's input shape).
        provider: short provider name (``cpu``, ``cuda``, ``tensorrt``).
        ranks_per_layer: points of the geometric rank grid per layer.
        rank_multiple: round grid ranks up to this multiple.
        out_path: JSON destination; an existing table for the same model and settings is returned as is.
        threads: intra-op threads (default: physical cores).
    """
    out_path = Path(out_path)
    header = {"provider": provider, "model_hash": model_key(model), "input_shape": list(example_input.shape),
              "ranks_per_layer": ranks_per_layer, "rank_multiple": rank_multiple}
    hit = _cached(out_path, header)
    if hit is not None:
        logger.info("reusing latency table %s", out_path)
        return hit
    reason = unavailable_reason(provider)
    if reason:
        raise RuntimeError(reason)
    model = model.eval()
    targets, _, _ = find_targets(model, example_input[:1])
    shapes = _input_shapes(model, example_input, [t.name for t in targets])
    layers = {}
    with tempfile.TemporaryDirectory(prefix="minreal-latency-") as tmp:
        for t in targets:
            ranks = rank_grid(matrix_view(t.layer).max_rank, ranks_per_layer, rank_multiple)
            keep, ms = _time_layer(t.layer, shapes[t.name], ranks, provider_name(provider),
                                   threads or default_threads(), Path(tmp))
            layers[t.name] = {"keep_ms": keep, "ranks": ranks, "ms": ms}
        model_ms, _ = _time_layer(model, tuple(example_input.shape), [], provider_name(provider),
                                  threads or default_threads(), Path(tmp))  # for whole-model --latency-ratio
    table = {**header, "model_ms": model_ms, "layers": layers}
    with atomic_path(out_path) as tmp_file:
        tmp_file.write_text(json.dumps(table, indent=1))
    return table
