"""Baseline: plain truncated-SVD factorisation of Linear/Conv weights (Eckart–Young per layer).

Not activation-aware; every later method must beat it at the same budget.

References
----------
.. [1] Eckart & Young (1936): the truncated SVD is the best rank-r approximation of a matrix (named in
       :func:`minreal.compress.core.linalg.truncated_svd_factors`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from ...core.allocate import KEEP
from ...core.costs import CostTable, model_macs
from ...core.data import Dataset
from ...core.inputs import Inputs
from ...core.lowrank import grouped_weight
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
from ...core.options import Budget
from ...core.report import CompressionReport, LayerReport
from .config import SVDConfig

__all__ = ["SVDPrepared", "LayerSVD", "layer_svd", "svd_compress", "svd_prepare", "svd_realise", "svd_spectra"]


def svd_spectra(layers: dict[str, nn.Module]) -> dict[str, np.ndarray]:
    """Squared singular values of each layer's (grouped) weight, summed over groups, descending."""
    out = {}
    for name, layer in layers.items():
        s = torch.linalg.svdvals(grouped_weight(layer).double())  # (groups, k)
        out[name] = (s ** 2).sum(0).numpy()
    return out


@dataclass
class LayerSVD:
    """The thin SVD of one layer's grouped weight, float64: ``u`` (groups, o, k), ``s`` (groups, k), ``vh``
    (groups, k, d), with k = min(o, d)."""

    u: torch.Tensor
    s: torch.Tensor
    vh: torch.Tensor

    def factors(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The balanced rank-``rank`` split of every group, stacked: first √S_r V_rᵀ, second U_r √S_r (the
        split of :func:`~minreal.compress.core.linalg.truncated_svd_factors`, from the stored SVD)."""
        root = self.s[:, :rank].sqrt()
        return root[:, :, None] * self.vh[:, :rank], self.u[:, :, :rank] * root[:, None, :]


@dataclass
class SVDPrepared:
    """What ``svd`` computes once for a model, data and ``exclude``, whatever the budget.

    ``model``: the original model (a reference, never a copy); ``example``: the first inputs (at most 8), on which
    costs are counted and attention is unfused again in :func:`svd_realise`; ``targets``: (name, output positions
    per sample) of every factorisable layer; ``skipped``: the reports of the layers left alone; ``table``: the
    per-layer costs of the (attention-unfused) model; ``spectra``: squared singular values per target, summed over
    groups; ``bases``: each target's thin SVD; ``whole_macs``: the whole model's MACs as the report counts them (what
    a ``mac_ratio`` budget is of); ``timings_s``: the preparation's timings.
    """

    model: nn.Module
    example: Inputs
    targets: list[tuple[str, int]]
    skipped: list[LayerReport]
    table: CostTable
    spectra: dict[str, np.ndarray]
    bases: dict[str, LayerSVD]
    whole_macs: float
    timings_s: dict[str, float] = field(default_factory=dict)


def layer_svd(layer: nn.Module) -> LayerSVD:
    """The thin SVD of ``layer``'s grouped weight (float64)."""
    u, s, vh = torch.linalg.svd(grouped_weight(layer).double(), full_matrices=False)
    return LayerSVD(u, s, vh)


def svd_prepare(model: nn.Module, data: Dataset, config: SVDConfig) -> SVDPrepared:
    """The budget-free phase: the factorisable layers, their costs, spectra and SVDs."""
    example = data.x[: min(len(data), 8)]
    t0 = time.perf_counter()
    unfused = factorisable_model(model, example)  # attention projections become plain Linear targets
    targets, skipped, table = find_targets(unfused.model, example, config.exclude, unfused.conv1d_left)
    layers = {t.name: t.layer for t in targets}
    spectra = svd_spectra(layers)
    bases = {name: layer_svd(layer) for name, layer in layers.items()}
    whole_macs = float(model_macs(unfused.model, example))
    return SVDPrepared(model, example, [(t.name, t.positions) for t in targets], skipped, table, spectra, bases,
                       whole_macs, {"decompose": time.perf_counter() - t0})


def _whole_total(prep: SVDPrepared, budget: Budget, model: nn.Module, latency_table: str | None) -> float | None:
    """:func:`~minreal.compress.core.lowrank_plan.whole_model_total`, with the MACs counted in :func:`svd_prepare`."""
    if budget.scope == "model" and budget.cost_kind == "macs":
        return prep.whole_macs
    return whole_model_total(budget, model, prep.example, prep.table, latency_table)


def svd_realise(prep: SVDPrepared, config: SVDConfig) -> tuple[nn.Module, CompressionReport]:
    """The per-budget phase: ranks from the allocator, then the factorised copy of the model."""
    budget = config.budget()
    report = CompressionReport("svd", asdict(config), timings_s=dict(prep.timings_s))
    t0 = time.perf_counter()
    # the same rewrite as svd_prepare's (the prepared state keeps no model): a copy, and forward passes on the
    # example, only where the model has attention or Conv1D layers
    unfused = factorisable_model(prep.model, prep.example)
    model = unfused.model
    targets = [Target(name, model.get_submodule(name), positions) for name, positions in prep.targets]
    tables, keeps = load_latency_table(config.latency_table) if budget.cost_kind == "latency" else (None, None)
    whole = _whole_total(prep, budget, model, config.latency_table)
    ranks, options = plan_ranks(targets, prep.spectra, budget, tables, keeps, whole)
    factors = {t.name: prep.bases[t.name].factors(ranks[t.name]) for t in targets if ranks[t.name] != KEEP}
    new = apply_factors(model, targets, factors).eval()
    report.timings_s["allocate_and_build"] = time.perf_counter() - t0
    fill_report(report, prep.table, targets, copy.deepcopy(prep.skipped), ranks, prep.spectra)
    note_attention(report, unfused)
    if budget.cost_kind == "latency" and whole is not None:
        report.predicted.whole_model_latency_ratio = predicted_latency_ratio(options, ranks, whole)
    return new, report


def svd_compress(model: nn.Module, data: Dataset, config: SVDConfig) -> tuple[nn.Module, CompressionReport]:
    """Factorise every Linear/Conv layer by truncated SVD under the configured budget (:func:`svd_prepare`,
    then :func:`svd_realise`)."""
    return svd_realise(svd_prepare(model, data, config), config)
