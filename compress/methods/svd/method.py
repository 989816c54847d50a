"""Baseline: plain truncated-SVD factorisation of Linear/Conv weights (Eckart–Young per layer).

Not activation-aware; every later method must beat it at the same budget.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from ...core.allocate import KEEP
from ...core.data import Dataset
from ...core.linalg import truncated_svd_factors
from ...core.lowrank import grouped_weight
from ...core.lowrank_plan import (BudgetOptions, apply_factors, factorisable_model, fill_report, find_targets,
                                  load_latency_table, note_attention,
                                  plan_ranks, predicted_latency_ratio, whole_model_total,
                                  rank_multiple_defaults)
from ...core.report import CompressionReport
from ...core.spec import MethodSpec
from .smoke import smoke_case

__all__ = ["SVDConfig", "svd_compress", "svd_spectra", "SPEC"]


@dataclass
class SVDConfig(BudgetOptions):
    """Options of the plain-SVD baseline. Give one whole-model budget (``mac_ratio``/``param_ratio``/
    ``latency_ratio``), one of ``layer_mac_ratio``/``layer_param_ratio`` (cost ratio of the factorisable layers) or
    ``rank_fraction``; with none, ``layer_mac_ratio=0.5``."""


def svd_spectra(layers: dict[str, nn.Module]) -> dict[str, np.ndarray]:
    """Squared singular values of each layer's (grouped) weight, summed over groups, descending."""
    out = {}
    for name, layer in layers.items():
        s = torch.linalg.svdvals(grouped_weight(layer).double())  # (groups, k)
        out[name] = (s ** 2).sum(0).numpy()
    return out


def svd_compress(model: nn.Module, data: Dataset, config: SVDConfig) -> tuple[nn.Module, CompressionReport]:
    """Factorise every Linear/Conv layer by truncated SVD under the configured budget."""
    budget = config.budget()
    report = CompressionReport("svd", asdict(config))
    example = data.x[: min(len(data), 8)]
    t0 = time.perf_counter()
    unfused = factorisable_model(model, example)  # attention projections become plain Linear targets
    model = unfused.model
    targets, skipped, table = find_targets(model, example, config.exclude)
    spectra = svd_spectra({t.name: t.layer for t in targets})
    tables, keeps = load_latency_table(config.latency_table) if budget.cost_kind == "latency" else (None, None)
    whole = whole_model_total(budget, model, example, table, config.latency_table)
    ranks, options = plan_ranks(targets, spectra, budget, tables, keeps, whole)
    factors = {}
    for t in targets:
        if ranks[t.name] == KEEP:
            continue
        w = grouped_weight(t.layer)
        pairs = [truncated_svd_factors(w[g], ranks[t.name])[:2] for g in range(w.shape[0])]
        factors[t.name] = (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))
    new = apply_factors(model, targets, factors).eval()
    report.timings_s["decompose"] = time.perf_counter() - t0
    fill_report(report, table, targets, skipped, ranks, spectra)
    note_attention(report, unfused)
    if budget.cost_kind == "latency" and whole is not None:
        report.predicted["whole_model_latency_ratio"] = predicted_latency_ratio(options, ranks, whole)
    return new, report


SPEC = MethodSpec("svd", "plain truncated SVD into two layers (baseline)", SVDConfig, svd_compress,
                  provider_defaults=rank_multiple_defaults, smoke_case=smoke_case,
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"))
