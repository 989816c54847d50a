"""The three Gramian tests of a state point (Moore 1981 balanced truncation, applied to empirical Gramians):
A, the energy rank of Gc; B, that of Go; C, that of Gc^½ Go Gc^½ (the squared Hankel singular values)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.allocate import KEEP, allocate, options_from_spectrum
from ...core.errors import CompressionError
from ...core.linalg import balanced_basis, balanced_gramian, energy_rank, sym_eig_desc
from .empirical_gramians import StateGramians

__all__ = ["StateAnalysis", "analyse_states", "budget_ranks"]


@dataclass
class StateAnalysis:
    """Ranks of the three tests at one state point, their spectra (descending), the C-test factors and the
    state statistics (mean, Gc) the warm start refits from."""

    name: str
    dim: int
    rank_a: int
    rank_b: int
    rank_c: int
    spectra: dict[str, np.ndarray]
    gc_root: torch.Tensor = field(repr=False)
    vb: torch.Tensor = field(repr=False)
    mean: torch.Tensor = field(repr=False)
    gc: torch.Tensor = field(repr=False)

    def basis(self, rank: int | None = None) -> torch.Tensor:
        """U = orth(Gc^½ V_b[:, :r]) (d × r), r defaulting to the C rank."""
        return balanced_basis(self.gc_root, self.vb, self.rank_c if rank is None else rank)

    def energy_kept(self, test: str, rank: int) -> float:
        lam = self.spectra[test]
        return float(lam[:rank].sum() / lam.sum()) if lam.sum() > 0 else 1.0


def budget_ranks(spectra: dict[str, np.ndarray], budget: int) -> dict[str, int]:
    """Ranks with Σ r ≤ ``budget`` keeping the same energy fraction in every layer (largest that fits)."""
    if budget < len(spectra):
        raise CompressionError(f"state_budget {budget} is below one state per layer ({len(spectra)})")
    opts = [options_from_spectrum(n, lam, float, float(len(lam))) for n, lam in spectra.items()]
    ranks = allocate(opts, float(budget), "energy")
    return {n: (len(spectra[n]) if r == KEEP else max(int(r), 1)) for n, r in ranks.items()}


def analyse_states(grams: dict[str, StateGramians], eps: float, state_budget: int | None = None
                   ) -> dict[str, StateAnalysis]:
    """Tests A, B, C at every state point; C ranks from ``eps`` or the total ``state_budget``."""
    out = {}
    for name, g in grams.items():
        lam_a, _ = sym_eig_desc(g.gc)
        lam_b, _ = sym_eig_desc(g.go)
        b, root = balanced_gramian(g.gc, g.go)
        lam_c, vb = sym_eig_desc(b)
        spectra = {"A": lam_a.numpy(), "B": lam_b.numpy(), "C": lam_c.numpy()}
        ranks = [max(energy_rank(lam, eps), 1) for lam in (lam_a, lam_b, lam_c)]
        out[name] = StateAnalysis(name, g.dim, *ranks, spectra, root, vb, g.mean, g.gc)
    if state_budget is not None:
        for name, r in budget_ranks({n: a.spectra["C"] for n, a in out.items()}, state_budget).items():
            out[name].rank_c = r
    return out
