"""Activation-aware (whitened) factorisation of Linear/Conv layers into pairs, under a budgeted rank allocator.

Each target layer is a batched matrix product per group, y_g = W_g x_g over its input rows (tokens, or
im2col patches). With M_g = E[x_g x_gᵀ] from calibration data, the rank-r Ŵ_g minimising the output
distortion E‖(W_g − Ŵ_g)x_g‖² is U_r U_rᵀ W_g, U from the SVD of W_g M_g^½ (see :mod:`.whiten`). A layer with
fewer outputs than inputs per group (o < d) needs only W_g M_g W_gᵀ = E[y₀ y₀ᵀ], the Gram of its bias-free
outputs: it is summed from the layer's outputs (o × o) and never from the d × d input moment.
The split emitted is first = U_rᵀ W_g (the k×k conv / first Linear), second = U_r (the 1×1 conv / second
Linear, carrying the original bias). One rank is shared by all groups; ranks come from the same allocators
as the plain-SVD baseline, fed with the whitened spectra. No training step.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from ...core.allocate import KEEP, total_cost
from ...core.attention import Unfused
from ...core.cache import data_key, entry_key, load_entry, model_key, save_entry
from ...core.costs import CostTable
from ...core.data import Dataset
from ...core.errors import CompressionError
from ...core.inputs import Inputs
from ...core.lowrank import grouped_weight, matrix_view
from ...core.lowrank_plan import (
    Target,
    apply_factors,
    factorisable_model,
    fill_report,
    find_targets,
    load_latency_table,
    note_attention,
    plan_ranks,
    predicted_latency_ratio,
    whole_model_total,
)
from ...core.memory import release_freed_memory
from ...core.report import CompressionReport, LayerReport
from ...core.stats import collect_moments
from .config import FactorizeConfig
from .whiten import output_gram_basis, projected_factors, whitened_output_basis

__all__ = ["FactorizePrepared", "LayerBasis", "factorize_compress", "factorize_prepare", "factorize_realise",
           "layer_bases", "statistics_side"]

log = logging.getLogger(__name__)
BASIS_FIELDS = ("basis", "sq_values", "fell_back")
"""What a cached basis entry holds (an entry without them is a miss)."""
STATS_ENTRIES = {"input": ("moments", "moment"), "output": ("output_gram", "gram")}
"""Per side of the statistics (:func:`statistics_side`): the kind of its cache entry (hashed into the key) and the
field the entry holds, so an input moment is never read as an output Gram nor the other way round."""


@dataclass
class LayerBasis:
    """Per-group whitened output bases (groups, o/groups, max_rank) in the layer's own precision (float32 for a
    float32 layer: its factors are rounded to that anyway, and BERT-base's 73 bases take 245 MiB instead of 491 MiB
    for as long as the prepared state lives) and squared singular values (float64)."""

    basis: torch.Tensor
    sq_values: torch.Tensor
    routes: tuple[str, ...]
    eigh_fell_back: bool

    @property
    def spectrum(self) -> np.ndarray:
        """Squared singular values summed over groups (the shared-rank distortion tail), descending."""
        return self.sq_values.sum(0).numpy()


def statistics_side(layer: nn.Module) -> str:
    """"output" when the layer has fewer outputs than inputs per group (its basis needs only the o × o output Gram,
    :func:`~.whiten.output_gram_basis`), else "input" (the d × d input moment,
    :func:`~.whiten.whitened_output_basis`)."""
    v = matrix_view(layer)
    return "output" if v.out_per_group < v.fan_in else "input"


def _decompose(layer: nn.Module, stat: torch.Tensor, threshold: float) -> LayerBasis:
    """Per-group bases of ``layer`` from its statistic, the output Gram or the input moment
    (:func:`statistics_side`)."""
    if statistics_side(layer) == "output":
        parts = [output_gram_basis(stat[g], threshold) for g in range(stat.shape[0])]
    else:
        w = grouped_weight(layer)
        parts = [whitened_output_basis(w[g], stat[g], threshold) for g in range(w.shape[0])]
    keep = layer.weight.dtype if layer.weight.dtype in (torch.float32, torch.float64) else torch.float64
    return LayerBasis(torch.stack([p.basis.to(keep) for p in parts]), torch.stack([p.sq_values for p in parts]),
                      tuple(sorted({p.route for p in parts})), any(p.eigh_fell_back for p in parts))


def _keys(model: nn.Module, data: Dataset, targets: list[Target], cfg: FactorizeConfig
          ) -> tuple[dict[str, str], dict[str, str]]:
    mk, dk = model_key(model), data_key(data.x)
    stats = {t.name: entry_key(STATS_ENTRIES[statistics_side(t.layer)][0], mk, dk, t.name, cfg.stats_dtype)
             for t in targets}
    bases = {t.name: entry_key("basis", stats[t.name], cfg.eig_threshold) for t in targets}
    return stats, bases


def layer_bases(model: nn.Module, data: Dataset, targets: list[Target], cfg: FactorizeConfig,
                report: CompressionReport) -> dict[str, LayerBasis]:
    """Whitened bases of every target, from the cache where possible; timings and cache use go to ``report``."""
    t0 = time.perf_counter()
    stats_keys, basis_keys = _keys(model, data, targets, cfg) if cfg.cache_dir else ({}, {})
    report.timings_s["cache_keys"] = time.perf_counter() - t0
    out: dict[str, LayerBasis] = {}
    for t in targets:
        hit = load_entry(cfg.cache_dir, basis_keys[t.name], BASIS_FIELDS) if cfg.cache_dir else None
        if hit is not None:
            out[t.name] = LayerBasis(hit["basis"], hit["sq_values"], ("cached",), bool(hit["fell_back"]))
    missing = [t for t in targets if t.name not in out]
    report.predicted.cache_hits = len(out)
    moments = _moments(model, data, missing, cfg, stats_keys, report)
    release_freed_memory()  # the statistics pass's activations and unfolded rows, freed on its return
    t0 = time.perf_counter()
    for t in missing:  # each statistic is dropped once decomposed: never all statistics and all bases at once
        lb = _decompose(t.layer, moments.pop(t.name), cfg.eig_threshold)
        out[t.name] = lb
        if cfg.cache_dir:
            save_entry(cfg.cache_dir, basis_keys[t.name], dict(zip(BASIS_FIELDS, (
                lb.basis, lb.sq_values, torch.tensor(lb.eigh_fell_back)))))
    release_freed_memory()  # the statistics and the decompositions' workspaces, before the bases are used
    report.timings_s["decompose"] = time.perf_counter() - t0
    return out


def _moments(model: nn.Module, data: Dataset, targets: list[Target], cfg: FactorizeConfig,
             keys: dict[str, str], report: CompressionReport) -> dict[str, torch.Tensor]:
    """Each target's statistic (:func:`statistics_side`: output Gram or input moment), cached or from one pass."""
    t0 = time.perf_counter()
    found, fields = {}, {t.name: STATS_ENTRIES[statistics_side(t.layer)][1] for t in targets}
    for t in targets:
        hit = load_entry(cfg.cache_dir, keys[t.name], (fields[t.name],)) if cfg.cache_dir else None
        if hit is not None:
            found[t.name] = hit[fields[t.name]]
    todo = {t.name: t.layer for t in targets if t.name not in found}
    if todo:
        outputs = [n for n, layer in todo.items() if statistics_side(layer) == "output"]
        stats = collect_moments(model, todo, data, cfg.calib_batch_size, cfg.memory_cap_bytes, cfg.stats_dtype,
                                output_side=outputs)
        over = sorted(n for n, s in stats.items() if s.over_cap)
        if over:
            report.notes.append(f"one sample's rows (unfolded inputs or outputs) exceeded the memory cap in: "
                                f"{', '.join(over)}")
        for name, s in stats.items():
            if s.rows == 0:
                raise CompressionError(f"layer {name!r} was not reached by the calibration data; "
                                       "exclude it with `exclude`", fields=("exclude",))
            found[name] = s.moment
            if cfg.cache_dir:
                save_entry(cfg.cache_dir, keys[name], {fields[name]: found[name]})
    report.timings_s["statistics"] = time.perf_counter() - t0
    return found


def _factors(targets: list[Target], bases: dict[str, LayerBasis], ranks: dict[str, int]
             ) -> Iterator[tuple[str, tuple[torch.Tensor, torch.Tensor]]]:
    """``(name, (first, second))`` of each factorised target, computed when asked for (float64), so that
    :func:`~minreal.compress.core.lowrank_plan.apply_factors` holds one layer's factors at a time."""
    for t in targets:
        r = ranks[t.name]
        if r == KEEP:
            continue
        w, u = grouped_weight(t.layer), bases[t.name].basis
        pairs = [projected_factors(w[g], u[g], r) for g in range(w.shape[0])]
        yield t.name, (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))


def _annotate(report: CompressionReport, bases: dict[str, LayerBasis], ranks: dict[str, int],
              cfg: FactorizeConfig) -> None:
    """Predicted activation distortion per layer (absolute and relative) and the whitening routes."""
    for lr in report.layers:
        lb = bases.get(lr.name)
        if lb is None:
            continue
        sq = lb.spectrum
        r = ranks[lr.name]
        tail = 0.0 if r == KEEP else float(np.clip(sq[r:], 0, None).sum())
        lr.details.update({"predicted_distortion": tail,
                           "predicted_relative_distortion": tail / max(float(sq.sum()), 1e-300),
                           "whitening": "+".join(lb.routes), "eigh_fell_back_to_svd": lb.eigh_fell_back})
    fell = [n for n, b in bases.items() if b.eigh_fell_back]
    if fell:
        report.notes.append(f"eigh failed and an SVD route was used for: {', '.join(fell)}")
    report.notes.append(f"eigenvalues below {cfg.eig_threshold:g} x the largest are treated as zero; "
                        "factors: first = U_r^T W, second = U_r (orthonormal)")


@dataclass
class FactorizePrepared:
    """What ``factorize`` computes once for a model, data and options, whatever the budget: the (unfused) model,
    its factorisation targets and cost table, and every target's whitened basis and spectrum."""

    unfused: Unfused
    example: Inputs
    targets: list[Target]
    skipped: list[LayerReport]
    table: CostTable
    bases: dict[str, LayerBasis]
    report: CompressionReport
    """Timings, notes and cache use of the preparation (copied into every realised report)."""


def factorize_prepare(model: nn.Module, data: Dataset, config: FactorizeConfig) -> FactorizePrepared:
    """The budget-free phase: targets and whitened bases (the statistics pass and the decompositions)."""
    report = CompressionReport("factorize", asdict(config))
    example = data.x[: min(len(data), 8)]
    unfused = factorisable_model(model, example)  # attention projections become plain Linear targets
    targets, skipped, table = find_targets(unfused.model, example, config.exclude, unfused.conv1d_left)
    bases = layer_bases(unfused.model, data, targets, config, report)
    return FactorizePrepared(unfused, example, targets, skipped, table, bases, report)


def factorize_realise(prep: FactorizePrepared, config: FactorizeConfig) -> tuple[nn.Module, CompressionReport]:
    """The per-budget phase: ranks from the allocator, then the factorised copy of the model."""
    budget = config.budget()
    latency = budget.cost_kind == "latency"
    tables, keeps = load_latency_table(config.latency_table) if latency else (None, None)
    report = CompressionReport("factorize", asdict(config), timings_s=dict(prep.report.timings_s),
                               notes=list(prep.report.notes), predicted=copy.deepcopy(prep.report.predicted))
    model, targets, bases = prep.unfused.model, prep.targets, prep.bases
    spectra = {n: b.spectrum for n, b in bases.items()}
    t0 = time.perf_counter()
    whole = whole_model_total(budget, model, prep.example, prep.table, config.latency_table)
    ranks, options = plan_ranks(targets, spectra, budget, tables, keeps, whole)
    new = apply_factors(model, targets, _factors(targets, bases, ranks)).eval()
    report.timings_s["allocate_and_build"] = time.perf_counter() - t0
    fill_report(report, prep.table, targets, copy.deepcopy(prep.skipped), ranks, spectra)
    note_attention(report, prep.unfused)
    _annotate(report, bases, ranks, config)
    if tables is not None:
        report.predicted.factorizable_table_latency_ratio = (total_cost(options, ranks)
                                                                / max(sum(o.keep_cost for o in options), 1e-300))
    if latency and whole is not None:
        report.predicted.whole_model_latency_ratio = predicted_latency_ratio(options, ranks, whole)
    return new, report


def factorize_compress(model: nn.Module, data: Dataset, config: FactorizeConfig
                       ) -> tuple[nn.Module, CompressionReport]:
    """Factorise every Linear/Conv layer on its calibration-whitened spectrum under the configured budget
    (:func:`factorize_prepare`, then :func:`factorize_realise`)."""
    return factorize_realise(factorize_prepare(model, data, config), config)
