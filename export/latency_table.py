"""Latency tables measured on the target provider, reused when they already exist for the same model and settings.

*Rank* tables (``factorize --latency-ratio``): each factorisable layer and its factorised pair at a geometric grid of
ranks, exported alone to ONNX and timed in isolation. JSON: ``{"provider", "model_hash", "input_shape",
"model_ms", "layers": {name: {"keep_ms", "ranks", "ms"}}}`` (median latencies in milliseconds).

*Width* tables (``--latency-ratio`` of the width methods, read by
:func:`minreal.compress.core.width.allocate.load_width_latency_table`): for each segment of each cuttable channel group
(:meth:`~minreal.compress.core.width.graph.WidthGraph.segments`), the whole model with only that segment narrowed, at
every allowed width on the provider's fast multiple, exported to ONNX and timed interleaved with the full model.
JSON: ``{"kind": "width", "provider", "model_hash", "input_shape" (per sample), "batch", "multiple", "minimum",
"precision",
"model_ms", "segments": {"<group>/<k>": {"size", "widths": [full, ...], "ms": [model_ms, ...]}}}``; ``"precision":
"int8"`` times each variant's INT8 file (static QDQ in this CPU's format, calibrated on the example batch) instead
of its fp32 file: ONNX Runtime's int8 and fp32 kernels favour different widths (on x86 an int8 convolution with
fewer than 16 output channels leaves the fast symmetric kernel and costs about what 16 channels cost). Each group's
variants are timed in one interleaved run with the full model; their medians are scaled by ``model_ms`` over the
full model's median in that same run, so that drift between groups does not show up as a saving. ``"uniform":
{"fractions", "widths": {"<group>/<k>": [...]}, "ms": [...]}`` times every segment cut together at ¾, ½ and ¼ of
its width, which calibrates how single-segment savings add up
(:func:`minreal.compress.core.width.allocate.saving_scale`).
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from minreal.compress.core.cache import model_key
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.lowrank import build_pair, matrix_view
from minreal.compress.core.lowrank_plan import find_targets
from minreal.compress.core.width import Cut, WidthGraph, analyse, apply_cuts
from minreal.compress.core.width.allocate import segment_key, segment_ladders
from minreal.compress.core.width.graph import ChannelGroup
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.config import default_threads
from minreal.runtime_bench.providers import provider_name, unavailable_reason
from minreal.runtime_bench.sessions import create_session
from minreal.runtime_bench.timing import latency_stats, time_interleaved

__all__ = ["TIMING", "WIDTH_PRECISIONS", "rank_grid", "build_latency_table", "build_width_latency_table",
           "build_depth_latency_table"]

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


#: Longer settings for whole models (width tables): single-segment savings are a few per cent of the model.
WHOLE_MODEL_TIMING: dict[str, float] = {"warmup": 10, "min_runs": 60, "min_seconds": 0.4}


def _time_files(paths: list[Path], shape: tuple[int, ...], provider: str, threads: int,
                timing: dict[str, float] = TIMING) -> list[float]:
    """Median latency (ms) of each exported model (input ``x`` of ``shape``), timed interleaved."""
    feed = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    sessions = [create_session(p, provider, threads) for p in paths]
    runs = time_interleaved([lambda s=s: s.run(None, feed) for s in sessions], int(timing["warmup"]),
                            int(timing["min_runs"]), timing["min_seconds"])
    return [latency_stats(ms, shape[0]).p50_ms for ms in runs]


#: Precisions a width table is measured in: the variants' fp32 files, or their INT8 files (static QDQ in this CPU's
#: format, as ``minreal export --int8`` writes them), whose kernels prefer other widths (ONNX Runtime's x86 int8
#: convolution takes its fast path only from 16 output channels up).
WIDTH_PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class _Bench:
    """How a width table's whole-model variants are written and timed: input ``shape``, ONNX Runtime ``provider``
    (full name) and ``threads``, files in ``folder``; ``calib`` (the example batch) for an INT8 table, else ``None``."""

    shape: tuple[int, ...]
    provider: str
    threads: int
    folder: Path
    calib: np.ndarray | None = None

    def file(self, module: nn.Module, stem: str) -> Path:
        """``module`` exported to ``folder/stem.onnx``; for an INT8 table, that file quantised (the file timed)."""
        path = _export(module, self.shape, self.folder / f"{stem}.onnx")
        if self.calib is None:
            return path
        from minreal.export.int8 import quantize_int8  # onnxruntime.quantization: only for INT8 tables

        return Path(quantize_int8(path, path.with_suffix(".int8.onnx"), self.calib).out_path)

    def time(self, paths: list[Path]) -> list[float]:
        """Median ms of each file, timed interleaved with :data:`WHOLE_MODEL_TIMING`."""
        return _time_files(paths, self.shape, self.provider, self.threads, WHOLE_MODEL_TIMING)


def _time_layer(layer: nn.Module, shape: tuple[int, ...], ranks: list[int], provider: str, threads: int,
                folder: Path) -> tuple[float, list[float]]:
    """Median latency (ms) of the layer and of its pair at each rank, timed interleaved."""
    modules = [layer] + [_random_pair(layer, r) for r in ranks]
    medians = _time_files([_export(m, shape, folder / f"m{i}.onnx") for i, m in enumerate(modules)], shape,
                          provider, threads)
    return medians[0], medians[1:]


def _reusable(out_path: Path | None, header: dict[str, Any]) -> dict[str, Any] | None:
    """The table at ``out_path`` when it was built for ``header``; else None once the provider is known to be
    available (RuntimeError naming why not)."""
    hit = _cached(out_path, header) if out_path is not None else None
    if hit is not None:
        logger.info("reusing latency table %s", out_path)
        return hit
    reason = unavailable_reason(header["provider"])
    if reason:
        raise RuntimeError(reason)
    return None


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

    Parameters
    ----------
    model : nn.Module
        the torch model; its factorisable layers are those ``factorize`` would target.
    example_input : torch.Tensor
        a batch at the batch size to optimise for (fixes each layer's input shape).
    provider : str
        short provider name (``cpu``, ``cuda``, ``tensorrt``).
    ranks_per_layer : int
        points of the geometric rank grid per layer.
    rank_multiple : int
        round grid ranks up to this multiple.
    out_path : str | Path
        JSON destination; an existing table for the same model and settings is returned as is.
    threads : int | None
        intra-op threads (default: physical cores).
    """
    out_path = Path(out_path)
    header = {"provider": provider, "model_hash": model_key(model), "input_shape": list(example_input.shape),
              "ranks_per_layer": ranks_per_layer, "rank_multiple": rank_multiple}
    hit = _reusable(out_path, header)
    if hit is not None:
        return hit
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


def _narrowed(wg: WidthGraph, group: ChannelGroup, segment: list[int], width: int) -> nn.Module:
    """The whole model with only ``segment`` of ``group`` cut to ``width`` channels (which ones is irrelevant to
    latency: its last ones are dropped)."""
    drop = set(segment[width:])
    return apply_cuts(wg, {group.name: Cut(keep=[i for i in range(group.size) if i not in drop])})


def _time_group(wg: WidthGraph, group: ChannelGroup, full: Path, multiple: int, minimum: int, bench: _Bench
                ) -> tuple[float, dict[int, tuple[list[int], list[float]]]]:
    """Median ms of the full model and, per segment index, (narrower widths, their median ms), all timed in one
    interleaved run."""
    paths, where = [full], []
    for k, (segment, ladder) in enumerate(zip(wg.segments(group), segment_ladders(wg, group, multiple, minimum))):
        for w in ladder[1:]:
            paths.append(bench.file(_narrowed(wg, group, segment, w), f"{k}-{w}"))
            where.append((k, w))
    medians = bench.time(paths)
    measured: dict[int, tuple[list[int], list[float]]] = {}
    for (k, w), ms in zip(where, medians[1:]):
        widths, times = measured.setdefault(k, ([], []))
        widths.append(w)
        times.append(ms)
    return medians[0], measured


#: Uniform cuts timed to calibrate the sum of single-segment savings against cutting every group at once.
UNIFORM_FRACTIONS = (0.75, 0.5, 0.25)


def _uniform_widths(wg: WidthGraph, groups: list[ChannelGroup], fraction: float, multiple: int, minimum: int
                    ) -> dict[str, int]:
    """Per segment key: the allowed width nearest ``fraction`` of its size."""
    widths = {}
    for g in groups:
        for k, (segment, ladder) in enumerate(zip(wg.segments(g), segment_ladders(wg, g, multiple, minimum))):
            widths[segment_key(g.name, k)] = min(ladder, key=lambda w: abs(w - fraction * len(segment)))
    return widths


def _time_uniform(wg: WidthGraph, groups: list[ChannelGroup], full: Path, multiple: int, minimum: int,
                  bench: _Bench) -> tuple[float, dict[str, Any]]:
    """Median ms of the full model and of the model with every segment at each of :data:`UNIFORM_FRACTIONS`
    (interleaved in one run): ``{"fractions", "widths": {segment key: [width per fraction]}, "ms"}``."""
    paths, per_fraction = [full], []
    for j, f in enumerate(UNIFORM_FRACTIONS):
        widths = _uniform_widths(wg, groups, f, multiple, minimum)
        per_fraction.append(widths)
        cuts = {}
        for g in groups:
            drop = {i for k, seg in enumerate(wg.segments(g)) for i in seg[widths[segment_key(g.name, k)]:]}
            cuts[g.name] = Cut(keep=[i for i in range(g.size) if i not in drop])
        paths.append(bench.file(apply_cuts(wg, cuts), f"uniform-{j}"))
    medians = bench.time(paths)
    keys = list(per_fraction[0])
    return medians[0], {"fractions": list(UNIFORM_FRACTIONS),
                        "widths": {key: [w[key] for w in per_fraction] for key in keys},
                        "ms": list(medians[1:])}


def _cuttable(wg: WidthGraph) -> list[ChannelGroup]:
    groups = wg.cuttable()
    if not groups:
        frozen = "; ".join(f"{g.name} ({g.frozen or f'{g.size} channel'})" for g in wg.groups)
        raise CompressionError(f"the model has no channel group that width cuts can shrink ({frozen or 'no groups'}); "
                               "a width latency table needs at least one")
    return groups


def build_width_latency_table(model: nn.Module, example_input: torch.Tensor, provider: str = "cpu",
                              multiple: int = 8, out_path: str | Path | None = None, threads: int | None = None,
                              progress: Callable[[str], None] | None = None, precision: str = "fp32",
                              minimum: int = 0) -> dict[str, Any]:
    """Measure (or reuse) the width latency table of ``model`` on ``provider`` (format: see the module doc).

    Parameters
    ----------
    model : nn.Module
        the torch model; its cuttable channel groups are found by :func:`minreal.compress.core.width.analyse`.
    example_input : torch.Tensor
        a batch at the batch size to optimise for (its first two samples drive the analysis; an
        INT8 table calibrates every variant on it).
    provider : str
        short provider name (``cpu``, ``cuda``, ``tensorrt``).
    multiple : int
        widths measured per segment: ``segment_ladders(...)`` below the full width. The Python default is
        the GPUs' 8; the CLI takes the provider's
        (:data:`~minreal.compress.core.options.WIDTH_MULTIPLE_BY_PROVIDER`).
    out_path : str | Path | None
        JSON destination, written atomically; an existing table for the same model and settings is
        returned as is. ``None``: measure and return without writing.
    threads : int | None
        intra-op threads (default: physical cores).
    progress : Callable[[str], None] | None
        called with one line per channel group (default: the module's logger).
    precision : str
        one of :data:`WIDTH_PRECISIONS`: time the variants' fp32 files, or their INT8 files (static QDQ
        in this CPU's format; CPU provider only), for a model that will run in INT8.
    minimum : int
        no segment measured narrower than this (``segment_ladders``' minimum); the width methods refuse a
        table whose minimum is above theirs. The CLI takes the provider's
        (:data:`~minreal.compress.core.options.WIDTH_MIN_BY_PROVIDER`: 16 on the CPU).

    Raises
    ------
    CompressionError
        the model has no cuttable channel group.
    ValueError
        an unknown precision, or INT8 on a provider other than ``cpu``.
    """
    if precision not in WIDTH_PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {WIDTH_PRECISIONS}")
    if precision == "int8" and provider != "cpu":
        raise ValueError(f"INT8 width tables are measured on the cpu provider (static QDQ in the CPU's format), "
                         f"not {provider!r}")
    shape = tuple(example_input.shape)
    header = {"kind": "width", "provider": provider, "model_hash": model_key(model), "input_shape": list(shape[1:]),
              "batch": shape[0], "multiple": multiple, "minimum": minimum, "precision": precision}
    hit = _reusable(Path(out_path) if out_path is not None else None, header)
    if hit is not None:
        return hit
    wg = analyse(model.eval(), example_input[:2])  # a batch of 1 is widened by the analysis itself
    groups, say = _cuttable(wg), progress or logger.info
    runs = []
    with tempfile.TemporaryDirectory(prefix="minreal-width-latency-") as tmp:
        calib = example_input.detach().cpu().numpy() if precision == "int8" else None
        bench = _Bench(shape, provider_name(provider), threads or default_threads(), Path(tmp), calib)
        full = bench.file(wg.gm, "full")
        for i, g in enumerate(groups, 1):
            say(f"[{i}/{len(groups)}] channel group {g.name} ({g.size} channels, "
                f"{len(wg.segments(g))} segment(s)): timing narrower widths in {precision}")
            runs.append((g, *_time_group(wg, g, full, multiple, minimum, bench)))
        say(f"timing every group cut together at {', '.join(f'{f:g}' for f in UNIFORM_FRACTIONS)} of its width "
            "(calibrates the sum of single-group savings)")
        uniform_full, uniform = _time_uniform(wg, groups, full, multiple, minimum, bench)
    model_ms = float(np.median([full_ms for _, full_ms, _ in runs]))
    uniform["ms"] = [model_ms * t / uniform_full for t in uniform["ms"]]
    segments = {}
    for g, full_ms, measured in runs:
        for k, segment in enumerate(wg.segments(g)):
            widths, times = measured.get(k, ([], []))
            segments[segment_key(g.name, k)] = {"size": len(segment), "widths": [len(segment)] + widths,
                                                "ms": [model_ms] + [model_ms * t / full_ms for t in times]}
    table = {**header, "model_ms": model_ms, "segments": segments, "uniform": uniform}
    if out_path is not None:
        with atomic_path(Path(out_path)) as tmp_file:
            tmp_file.write_text(json.dumps(table, indent=1))
    return table


def build_depth_latency_table(model: nn.Module, example_input: torch.Tensor, provider: str = "cpu",
                              out_path: str | Path | None = None, threads: int | None = None,
                              progress: Callable[[str], None] | None = None, precision: str = "fp32"
                              ) -> dict[str, Any]:
    """Measure (or reuse) the depth latency table of ``model`` on ``provider``: the whole model with each residual
    block removed alone (:mod:`minreal.compress.methods.depth`), exported (and, for
    ``precision="int8"``, quantised in this CPU's format, calibrated on ``example_input``), all timed in one
    interleaved run with the full model. JSON: ``{"kind": "depth", "provider", "model_hash", "input_shape" (per
    sample), "batch", "precision", "model_ms", "blocks": {name: {"ms": whole model without it, "saving_ms"}}}``.

    Raises
    ------
    CompressionError
        the model has no residual block.
    ValueError
        an unknown precision, or INT8 on a provider other than ``cpu``.
    """
    from minreal.compress.methods.depth.graph import remove_blocks
    from minreal.compress.methods.depth.method import no_block_error, traced_blocks

    if precision not in WIDTH_PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {WIDTH_PRECISIONS}")
    if precision == "int8" and provider != "cpu":
        raise ValueError(f"INT8 depth tables are measured on the cpu provider, not {provider!r}")
    shape = tuple(example_input.shape)
    header = {"kind": "depth", "provider": provider, "model_hash": model_key(model), "input_shape": list(shape[1:]),
              "batch": shape[0], "precision": precision}
    hit = _reusable(Path(out_path) if out_path is not None else None, header)
    if hit is not None:
        return hit
    # traced as depth traces it (carrying example values where plain torch.fx hides every block), so the blocks and
    # their names are depth's; shortcut blocks too: depth removes one whose branch is zero on the data
    gm, blocks, _, _ = traced_blocks(model.eval(), example_input[:2])
    if not blocks:  # depth's own words (which layers traced whole may hold blocks)
        raise no_block_error(model, gm, "a depth latency table",
                             "time widths instead (build_width_latency_table)")
    say = progress or logger.info
    with tempfile.TemporaryDirectory(prefix="minreal-depth-latency-") as tmp:
        calib = example_input.detach().cpu().numpy() if precision == "int8" else None
        bench = _Bench(shape, provider_name(provider), threads or default_threads(), Path(tmp), calib)
        paths = [bench.file(gm, "full")]
        for i, b in enumerate(blocks, 1):
            say(f"[{i}/{len(blocks)}] exporting the model without residual block {b.name} ({precision})")
            paths.append(bench.file(remove_blocks(gm, [b]), f"b{i}"))
        say(f"timing the full model and {len(blocks)} variants interleaved on {provider}")
        medians = bench.time(paths)
    model_ms = medians[0]
    table = {**header, "model_ms": model_ms,
             "blocks": {b.name: {"ms": ms, "saving_ms": model_ms - ms} for b, ms in zip(blocks, medians[1:])}}
    if out_path is not None:
        with atomic_path(Path(out_path)) as tmp_file:
            tmp_file.write_text(json.dumps(table, indent=1))
    return table
