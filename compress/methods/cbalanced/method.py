"""C-balanced realisation: read a trained network as a depth-indexed state-space system h_{l+1} = f_l(h_l),
z = g(h_L), rank each state by three empirical Gramian tests, and realise a smaller network with the
balanced (C) ranks as its widths.

Tests per state point (Moore 1981 balanced truncation, applied to empirical Gramians):
A (reachability) energy rank of Gc; B (observability) energy rank of Go; C energy rank of Gc^½ Go Gc^½.
The C rank is the width; on channel groups it is rounded up to the kernels' fast channel multiple
(``width_multiple``, in groups at least twice that wide) and the exact rank is reported next to it.

Two realisations, chosen by the model:

- ``nn.Sequential`` MLPs (Linear + activation stacks): state points are the hidden activations; the warm start
  keeps neurons by balanced leverage and refits each following Linear layer by least squares, layer by layer
  (:mod:`.realise`).
- Any other model torch.fx can trace (CNNs, ResNets with projection or option-A shortcuts, user code): state
  points are the channel groups of the traced graph (:mod:`minreal.compress.core.width`), the state vector of a group
  its channels over every position (:mod:`.graph_gramians`); the warm start keeps channels by balanced leverage
  and refits every consumer of a cut group by least squares (:mod:`.graph_realise`). No family needs
  hand-written surgery. ``torch.export`` programs (.pt2) are refused: their layers cannot be resized.

The realised network starts warm (kept neurons copied and refit) or from scratch; the run's recovery (the shared
``--recover-*`` knobs: distillation from the original mixed with the labels) trains it after the method, as it
trains every method's result. With ``controls`` the other start and a uniform-width network of the same parameter
count are trained here with that same recovery config.

References
----------
.. [1] Moore (1981), "Principal component analysis in linear systems: controllability, observability, and model
       reduction", IEEE Trans. Automatic Control 26(1): balanced truncation, here applied to empirical Gramians.
.. [2] Chan, Golub & LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample variances": the
       pairwise merge of moments (:mod:`.empirical_gramians`, :mod:`.graph_gramians`).
.. [3] Chan, Golub & LeVeque 1983, "Algorithms for computing the sample variance: analysis and recommendations": the
       shifted data of :class:`~.empirical_gramians.Moments`.
.. [4] Hoerl & Kennard 1970, eq. 2.2: the ridge least squares of the refit (:mod:`.graph_realise`).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ...core.costs import model_macs
from ...core.data import Dataset
from ...core.errors import CompressionError
from ...core.options import flag_of
from ...core.recover import held_out_metrics, recover, recovery_split
from ...core.recover_options import RecoveryConfig
from ...core.report import CompressionReport, LayerReport
from ...core.run_case import RunCase, VariantSpec
from ...core.train import TrainConfig, train
from ...core.width import Cut, analyse, apply_cuts
from ...core.width.allocate import allowed_widths
from .analysis import StateAnalysis, analyse_states, budget_ranks
from .config import INITS, CBalancedConfig
from .empirical_gramians import collect_gramians, default_state_points
from .graph_gramians import group_gramians, select_groups
from .graph_realise import count_params, group_keep, group_params, realise_groups, round_width
from .realise import (
    insert_projections,
    is_mlp,
    refit_linear_chain,
    resize_sequential,
    stage_producers,
    top_indices,
)

__all__ = ["cbalanced_compress", "realise", "closest_uniform_width", "demo_case"]



def _mlp_scores(model: nn.Sequential, analysis: StateAnalysis, producer: int, width: int, selection: str
                ) -> torch.Tensor:
    """Per-neuron keep score: balanced leverage ‖U_w[i, :]‖² (see :func:`.graph_realise.balanced_leverage`) or the
    L1 norm of the producer's weight row."""
    if selection == "leverage":
        return analysis.basis(width).pow(2).sum(1)
    return model[producer].weight.detach().abs().flatten(1).sum(1).double()


def realise(model: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int], init: str,
            calib: Dataset | None = None, selection: str = "leverage", refit: bool = True,
            ridge: float = 1e-6, seed: int = 0) -> nn.Module:
    """A Sequential MLP with width ``widths[p]`` at each state point, freshly initialised or warm-started (kept
    neurons copied, then with ``refit`` each following Linear refitted by least squares on ``calib``)."""
    producers = stage_producers(model, list(widths))
    by_index = {producers[p]: w for p, w in widths.items()}
    if init == "scratch":
        torch.manual_seed(seed)
        return resize_sequential(model, by_index).eval()
    keep = {producers[p]: top_indices(_mlp_scores(model, analyses[p], producers[p], w, selection), w)
            for p, w in widths.items()}
    new = resize_sequential(model, by_index, keep).eval()
    if refit:
        if calib is None:
            raise CompressionError("the least-squares refit needs calibration data")
        refit_linear_chain(model, new, calib.x, sorted(producers.values()), keep, ridge)
    return new


@dataclass
class _Plan:
    """What one realisation path provides: the tests per state point, how to build a network of given widths
    (``build(widths, init)``), its architecture alone (``shaped(widths, ranks)``: the network's layers at those
    widths, the atoms the start keeps at those C ranks, default the analyses', weights not fitted: for its costs) and
    its parameter count, the widest uniform width the control may use, and per
    state point the kind, parameter count and label of its producing layers in a given network."""

    kind: str
    analyses: dict[str, StateAnalysis]
    go_method: str
    build: Callable[[dict[str, int], str], nn.Module]
    shaped: Callable[[dict[str, int], dict[str, int] | None], nn.Module]
    max_uniform: int
    layer: Callable[[nn.Module, str], tuple[str, int, Any]]
    notes: list[str] = field(default_factory=list)
    chain: Callable[[dict[str, int], str], float] | None = None
    """The MACs (``"mac_ratio"``) or parameters (``"param_ratio"``) of the network with given widths in closed form,
    where the architecture is a chain of Linears (None: costed by building ``shaped``)."""

    def params(self, widths: dict[str, int]) -> int:
        """Parameters of the network with ``widths``."""
        return count_params(self.shaped(widths, None))


def _mlp_plan(model: nn.Module, calib: Dataset, cfg: CBalancedConfig) -> _Plan:
    points = list(cfg.state_points) or default_state_points(model)
    grams = collect_gramians(model, calib, points, cfg.max_exact_outputs, cfg.probes, cfg.go_samples, seed=cfg.seed)
    analyses = analyse_states(grams, cfg.energy_eps, cfg.state_budget)
    producers = stage_producers(model, points)

    def build(widths: dict[str, int], init: str) -> nn.Module:
        return realise(model, analyses, widths, init, calib, cfg.selection, cfg.refit, cfg.ridge, cfg.seed)

    def shaped(widths: dict[str, int], ranks: dict[str, int] | None = None) -> nn.Module:
        with torch.random.fork_rng():  # fresh layers draw their initial weights: a seeded run stays as it was
            return resize_sequential(model, {producers[p]: w for p, w in widths.items()})

    def layer(net: nn.Module, p: str) -> tuple[str, int, Any]:
        i = producers[p]
        return type(net[i]).__name__, count_params(net[i]), i

    return _Plan("sequential MLP", analyses, next(iter(grams.values())).go_method, build, shaped,
                 4 * max(a.dim for a in analyses.values()) + 1, layer, chain=_linear_chain(model, producers))


def _linear_chain(model: nn.Module, producers: dict[str, int]) -> Callable[[dict[str, int], str], float] | None:
    """The closed-form cost of ``model`` (a Sequential) with its producers at given widths: each Linear's in x out
    MACs (and its weights and bias as parameters), the way :func:`resize_sequential` resizes them; None where a
    layer other than a Linear holds parameters or buffers (a norm's grow with the width)."""
    if any(not isinstance(m, nn.Linear) and next(itertools.chain(m.parameters(), m.buffers()), None) is not None
           for m in model):
        return None

    def cost(widths: dict[str, int], kind: str) -> float:
        at = {producers[p]: w for p, w in widths.items()}
        total, width = 0, None
        for i, m in enumerate(model):
            if isinstance(m, nn.Linear):
                cin, cout = (m.in_features if width is None else width), at.get(i, m.out_features)
                total += cin * cout + (cout if kind == "param_ratio" and m.bias is not None else 0)
                width = cout
        return float(total)

    return cost


def _graph_plan(model: nn.Module, calib: Dataset, cfg: CBalancedConfig) -> _Plan:
    wg = analyse(model, calib.x[:2])
    groups = select_groups(wg, cfg.state_points)
    if not groups:
        raise CompressionError(f"{type(model).__name__} has no channel group that can be resized "
                               f"({len(wg.unsupported)} patterns left whole: "
                               f"{'; '.join(f'{n}: {r}' for n, r in wg.unsupported[:3])})")
    grams = group_gramians(wg, groups, calib, cfg.max_exact_outputs, cfg.probes, cfg.go_samples, seed=cfg.seed)
    analyses = analyse_states(grams, cfg.energy_eps, cfg.state_budget)

    def build(widths: dict[str, int], init: str) -> nn.Module:
        return realise_groups(model, wg, analyses, widths, init, cfg.selection, cfg.refit, cfg.ridge, cfg.seed)

    warm, refits = cfg.init == "warm", cfg.init == "warm" and cfg.refit  # a refit's offsets add consumers' biases

    def shaped(widths: dict[str, int], ranks: dict[str, int] | None = None) -> nn.Module:
        def cut(g: str, w: int) -> Cut:
            a = analyses[g]
            keep = group_keep(wg, a, min(w, a.dim), cfg.selection, (ranks or {}).get(g)) if warm else \
                list(range(min(w, a.dim)))
            return Cut(keep, None, torch.zeros(a.dim) if refits and w < a.dim else None)

        return apply_cuts(wg, {g: cut(g, w) for g, w in widths.items()})

    def layer(net: nn.Module, name: str) -> tuple[str, int, Any]:
        group = wg.group(name)
        producer = next((u.target for u in group.uses if u.role == "producer" and u.target), "")
        kind = type(wg.gm.get_submodule(producer)).__name__ if producer else "channel group"
        return kind, group_params(net, group), producer

    notes = [f"left whole by the width analysis: {n}: {r}" for n, r in wg.unsupported]
    return _Plan("channel groups", analyses, next(iter(grams.values())).go_method, build, shaped,
                 max(a.dim for a in analyses.values()), layer, notes)


def _plan(model: nn.Module, calib: Dataset, cfg: CBalancedConfig) -> _Plan:
    return (_mlp_plan if is_mlp(model) else _graph_plan)(model, calib, cfg)


@torch.no_grad()
def _quality(original: nn.Module, model: nn.Module, data: Dataset) -> dict[str, float]:
    """Parameters and :func:`~minreal.compress.core.recover.held_out_metrics` against ``original`` (accuracy with
    labels, agreement, KL), the measures the run's recovery reports."""
    return {"params": sum(p.numel() for p in model.parameters()), **held_out_metrics(original, model, data)}


def _trained(model: nn.Module, teacher: nn.Module, data: Dataset, recovery: RecoveryConfig) -> dict:
    """Train ``model`` in place with the run's recovery (distillation from ``teacher`` mixed with the labels by
    ``--recover-alpha``), as the run trains the chosen start afterwards; ``interrupted``: a Ctrl-C ended it (the
    best weights so far kept)."""
    result = recover(teacher, model, data, recovery)
    return {"best_epoch": result.best_epoch, "epochs_run": result.epochs, "steps": result.steps,
            "train_s": result.wall_s, "interrupted": bool(result.interrupted)}


def _after(recovery: RecoveryConfig, info: dict) -> RecoveryConfig:
    """The recovery for the next training: after a Ctrl-C ended one, the next Ctrl-C stops the command."""
    return replace(recovery, catch_interrupt=False) if info["interrupted"] else recovery


def _variants(model: nn.Module, plan: _Plan, widths: dict[str, int], data: Dataset, val: Dataset,
              cfg: CBalancedConfig, recovery: RecoveryConfig | None) -> tuple[nn.Module, dict[str, dict]]:
    """The configured start, untrained (the run's recovery trains it); with ``controls``, the other start and the
    uniform-width control trained by that recovery here, all measured on ``val``."""
    chosen = plan.build(widths, cfg.init)
    results: dict[str, dict] = {}
    if cfg.init == "warm":
        results["warm_untrained"] = _quality(model, chosen, val)
    if cfg.controls:
        assert recovery is not None  # checked by cbalanced_compress
        for init in INITS:
            if init != cfg.init:
                net = plan.build(widths, init)
                info = _trained(net, model, data, recovery)
                results[init] = {**_quality(model, net, val), **info}
                recovery = _after(recovery, info)
        results.update(_uniform_control(model, plan, widths, data, val, cfg, recovery))
    return chosen, results


def closest_uniform_width(params: Callable[[int], int], target: int, hi: int) -> int:
    """The width w in [1, hi] whose parameter count ``params(w)`` (non-decreasing in w) is closest to ``target``
    (the smaller on a tie), by bisection."""
    lo, top = 1, hi
    while lo < top:
        mid = (lo + top) // 2
        if params(mid) >= target:
            top = mid
        else:
            lo = mid + 1
    return min(sorted({max(lo - 1, 1), lo}), key=lambda w: abs(params(w) - target))


def _uniform_control(model: nn.Module, plan: _Plan, widths: dict[str, int], data: Dataset, val: Dataset,
                     cfg: CBalancedConfig, recovery: RecoveryConfig) -> dict[str, dict]:
    """One width at every state point (capped at its size) with the realised parameter count, from the same start
    and trained by the same recovery."""
    uniform = lambda w: {p: min(w, plan.analyses[p].dim) if plan.kind == "channel groups" else w  # noqa: E731
                         for p in widths}
    w = closest_uniform_width(lambda v: plan.params(uniform(v)), plan.params(widths), plan.max_uniform)
    net = plan.build(uniform(w), cfg.init)
    info = _trained(net, model, data, recovery)
    return {"uniform": {**_quality(model, net, val), **info, "width": w, "init": cfg.init}}


def _projected(model: nn.Module, analyses: dict[str, StateAnalysis], val: Dataset) -> dict[str, float] | None:
    """Diagnostic projected model (MLP states only); larger than the original by construction."""
    proj = insert_projections(model, {p: (a.basis(), a.mean) for p, a in analyses.items()}).eval()
    return _quality(model, proj, val)


def _rounding(rank: int, width: int, size: int, multiple: int, minimum: int) -> str:
    """How the width left the C rank: unchanged, rounded up to the multiple (what :func:`round_width` gives without
    a minimum), raised further by the width minimum, or widened further by a whole-model budget's fill."""
    if width == rank:
        return ""
    if width == round_width(rank, size, multiple, 0):
        return " rounded up to the width multiple"
    if width == round_width(rank, size, multiple, minimum):
        return f" raised to the width minimum ({minimum})"
    return " widened by the budget left (see the notes)"


def _layer_reports(model: nn.Module, new: nn.Module, plan: _Plan, widths: dict[str, int], multiple: int,
                   minimum: int) -> list[LayerReport]:
    rows = []
    for p, a in plan.analyses.items():
        (kind, before, producer), (_, after, _) = plan.layer(model, p), plan.layer(new, p)
        rows.append(LayerReport(
            p, kind, "resized", "width = C rank" + _rounding(a.rank_c, widths[p], a.dim, multiple, minimum),
            before, after,
            rank=widths[p], full_rank=a.dim,
            details={"rank_a": a.rank_a, "rank_b": a.rank_b, "rank_c": a.rank_c, "producer": producer,
                     "energy_kept_c": a.energy_kept("C", widths[p])}))
    return rows


def cbalanced_compress(model: nn.Module, data: Dataset, config: CBalancedConfig,
                       recovery: RecoveryConfig | None = None) -> tuple[nn.Module, CompressionReport]:
    """Rank every state point by the A/B/C Gramian tests and realise a network with the C widths, warm-started
    (kept neurons copied and refit) or from scratch. ``recovery`` is the run's (None when none follows): it trains
    the result afterwards, and here the controls; a scratch start without it is refused."""
    cfg = config
    if cfg.init == "scratch" and recovery is None:
        raise CompressionError("cbalanced with `CBalancedConfig.init` (--init scratch) builds an untrained network: "
                               "give a recovery budget (`RecoveryConfig.epochs` (--recover-epochs N) or "
                               "`RecoveryConfig.steps` (--recover-steps N)), which trains it (in a plan chain, as its "
                               "last step), or use `CBalancedConfig.init` (--init warm)",
                               fields=("init", "epochs", "steps"))
    if cfg.controls and recovery is None:
        raise CompressionError("cbalanced with `CBalancedConfig.controls` (--controls) trains the other start and "
                               "the uniform-width control with the run's recovery: give a recovery budget "
                               "(`RecoveryConfig.epochs` (--recover-epochs N) or `RecoveryConfig.steps` "
                               "(--recover-steps N); in a plan chain, as its last step)",
                               fields=("controls", "epochs", "steps"))
    report = CompressionReport("cbalanced", asdict(cfg))
    model.eval()
    # the Gramians never see the samples the recovery holds out for its early stopping and metrics
    train_set, val = (data, data) if recovery is None else recovery_split(data, recovery)[:2]
    calib = train_set.take(cfg.gramian_samples)
    t0 = time.perf_counter()
    plan = _plan(model, calib, cfg)
    report.timings_s["gramians"] = time.perf_counter() - t0
    multiple, minimum = (cfg.width_multiple, cfg.width_min) if plan.kind == "channel groups" else (1, 0)
    if cfg.budget_given:
        t0 = time.perf_counter()
        widths = _meet_budget(model, plan, calib, cfg, multiple, minimum, report)
        report.timings_s["budget"] = time.perf_counter() - t0
    else:
        widths = {p: round_width(a.rank_c, a.dim, multiple, minimum) for p, a in plan.analyses.items()}
    t0 = time.perf_counter()
    new, variants = _variants(model, plan, widths, data, val, cfg, recovery)
    report.timings_s["realise" if not cfg.controls else "realise_and_controls"] = time.perf_counter() - t0
    _fill(report, model, new, plan, widths, multiple, minimum)
    if variants:
        report.measured.variants = variants
    if cfg.controls and plan.kind == "sequential MLP":
        report.measured.projected = _projected(model, plan.analyses, val)
    if variants:
        where = "the given data" if val is data else f"the recovery's held-out split ({len(val)} samples)"
        report.notes.append(f"variants measured on {where}; the {cfg.init} start itself is trained afterwards by "
                            "the run's recovery (see the report's recovery)")
        cut = [name for name, v in variants.items() if v.get("interrupted")]
        if cut:
            report.notes.append(f"Ctrl-C ended the training of the control(s) {', '.join(cut)}: measured with the best "
                                "weights so far, not after the whole recovery budget")
    report.notes.extend(plan.notes)
    return new, report


def _meet_budget(model: nn.Module, plan: _Plan, calib: Dataset, cfg: CBalancedConfig, multiple: int, minimum: int,
                 report: CompressionReport) -> dict[str, int]:
    """Widths for ``cfg``'s whole-model MAC or parameter budget: the C ranks of a total state budget shared at equal
    energy (:func:`~.analysis.budget_ranks`), each rounded up as the widths are, bisected to a total whose network
    meets the budget while the next larger one does not (every state point's C rank becomes its budget rank); then
    the budget left filled (:func:`_fill_budget`). Each candidate is costed as the report counts it. A budget that one
    state per point misses is refused, naming the ratio that keeps."""
    kind = cfg.budget_given[0]
    target, flag = getattr(cfg, kind), flag_of(kind)
    cost = _Costed(model, plan, calib.x[:min(len(calib), 8)], kind)
    spectra = {p: a.spectra["C"] for p, a in plan.analyses.items()}
    held = {p: _c_states(lam) for p, lam in spectra.items()}  # past these, equal energy would jump to full width

    def at(total: int) -> tuple[dict[str, int], dict[str, int], float]:
        ranks = {p: min(r, held[p]) for p, r in budget_ranks(spectra, total).items()}
        widths = {p: round_width(r, plan.analyses[p].dim, multiple, minimum) for p, r in ranks.items()}
        return ranks, widths, cost(widths, ranks)

    lo = len(spectra)
    hi = max(lo, sum(held.values()))  # every state with C energy: the rest of a budget goes by the fill
    best = at(lo)
    if best[2] > target:
        least = math.ceil(best[2] * 1000) / 1000
        raise CompressionError(f"`{kind}` {target:g} cannot be met: cbalanced keeping one state per state point "
                               f"({len(spectra)}, widths rounded as they are) reaches {best[2]:.4f}; give `{kind}` >= "
                               f"{least:g}", fields=(kind,))
    while lo < hi:  # a total whose network meets the budget while the next larger one's does not
        mid = (lo + hi + 1) // 2
        trial = at(mid)
        lo, hi, best = (mid, hi, trial) if trial[2] <= target else (lo, mid - 1, best)
    ranks, widths, equal = best
    complete = all(plan.analyses[p].energy_kept("C", w) >= 1.0 - _NO_ENERGY for p, w in widths.items())
    for p, r in ranks.items():
        plan.analyses[p].rank_c = r
    widths, ratio, by = _fill_budget(plan, widths, equal, target, lambda w: cost(w, ranks), multiple, minimum)
    report.predicted.budget_cost_ratio = ratio
    filled = (f"; the budget left filled a width step at a time ({' then '.join(by)} energy per cost): {ratio:.3g}"
              if by else "")
    if complete and by:  # the C ranks held every state with C energy: a budget down to their cost keeps all of it
        filled = f" (every state with C energy: a {flag} down to {equal:.3g} keeps all of it){filled}"
    report.notes.append(f"{flag} {target:g}: C ranks at equal energy holding {sum(ranks.values())} states, widths "
                        f"rounded up: cost ratio {equal:.3g}{filled}; {cost.calls} width sets costed")
    return widths


class _Costed:
    """The cost ratio of the network with given widths and C ranks (:attr:`_Plan.shaped`): whole-model MACs of one
    sample, or parameters, over the original's; each width set costed once (``calls`` counts them)."""

    def __init__(self, model: nn.Module, plan: _Plan, example: Any, kind: str) -> None:
        self.plan, self.example, self.kind = plan, example, kind
        self.full, self.ratios = self._cost(model), {}
        # a chain of Linears in closed form (a 4096-wide MLP's fill costs thousands of width sets), where it gives the
        # whole model's count exactly; otherwise each width set is built and counted
        self.chain = plan.chain if plan.chain is not None and plan.chain({}, kind) == self.full else None

    @property
    def calls(self) -> int:
        return len(self.ratios)

    def _cost(self, net: nn.Module) -> float:
        return float(count_params(net)) if self.kind == "param_ratio" else float(model_macs(net, self.example))

    def __call__(self, widths: dict[str, int], ranks: dict[str, int]) -> float:
        key = (tuple(sorted(widths.items())), tuple(sorted(ranks.items())))
        if key not in self.ratios:
            self.ratios[key] = (self.chain(widths, self.kind) if self.chain is not None else
                                self._cost(self.plan.shaped(widths, ranks))) / self.full
        return self.ratios[key]


_NO_ENERGY = 1e-12
"""An energy fraction at most this is a zero eigenvalue's rounding: a step that adds no more adds no state."""


def _c_states(lam: Any) -> int:
    """How many of a state point's C states carry energy: the smallest rank keeping all but :data:`_NO_ENERGY` of it
    (at least 1). Beyond it the equal-energy allocation has nothing to rank (review: it jumped the point to full
    width, spending the budget on states without energy)."""
    energy = np.clip(np.asarray(lam, dtype=np.float64), 0.0, None)
    total = float(energy.sum())
    if total <= 0.0:
        return 1
    return min(len(energy), max(1, int(np.searchsorted(np.cumsum(energy) / total, 1.0 - _NO_ENERGY)) + 1))


def _fill_budget(plan: _Plan, widths: dict[str, int], ratio: float, target: float,
                 cost: Callable[[dict[str, int]], float], multiple: int, minimum: int
                 ) -> tuple[dict[str, int], float, list[str]]:
    """``widths`` grown one allowed width at a time while the budget holds, and by which energies (``["C"]``,
    ``["C", "A"]``, or none). Equal energy rounded to the kernels' multiples can leave much of a budget unspent, and
    a layer feeding a k-class linear head observes at most k directions (its C energy ends near rank k): the step
    that adds the most C energy (the group's fraction of its own) per cost ratio goes first; where no step adds C
    energy, the one adding the most reachability (A: the states' variance) per cost. Each step taken is costed
    exactly; the other candidates' costs are those measured when they were offered (a width elsewhere changes them a
    little; costs only grow as widths do, so a step refused once is never taken later)."""
    def offer(p: str, width: int, base: float) -> tuple[int, tuple[int, float], float] | None:
        a = plan.analyses[p]
        up = [w for w in allowed_widths(a.dim, multiple, minimum) if w > width]
        if not up:
            return None
        step = min(up)
        c, r = (a.energy_kept(t, step) - a.energy_kept(t, width) for t in ("C", "A"))
        tier = (1, c) if c > _NO_ENERGY else (0, r) if r > _NO_ENERGY else None
        return None if tier is None else (step, tier, cost({**widths, p: step}) - base)

    offers = {p: o for p in widths if (o := offer(p, widths[p], ratio)) is not None}
    by: list[str] = []
    while offers:
        p = max(offers, key=lambda q: (offers[q][1][0], offers[q][1][1] / max(offers[q][2], 1e-12), q))
        step, (tier, _), _ = offers.pop(p)
        trial = {**widths, p: step}
        r = cost(trial)
        if r <= target:
            widths, ratio = trial, r
            if (energy := "C" if tier else "A") not in by:
                by.append(energy)
            if (o := offer(p, step, r)) is not None:
                offers[p] = o
    return widths, ratio, by


def _fill(report: CompressionReport, model: nn.Module, new: nn.Module, plan: _Plan, widths: dict[str, int],
          multiple: int, minimum: int) -> None:
    analyses = plan.analyses
    report.layers = _layer_reports(model, new, plan, widths, multiple, minimum)
    report.spectra = {p: {k: v.tolist() for k, v in a.spectra.items()} for p, a in analyses.items()}
    full, order = sum(a.dim for a in analyses.values()), sum(widths.values())
    report.predicted = replace(
        report.predicted, realisation=plan.kind, ranks_a=[a.rank_a for a in analyses.values()],
        ranks_b=[a.rank_b for a in analyses.values()], ranks_c=[a.rank_c for a in analyses.values()],
        widths=list(widths.values()), width_multiple=multiple, width_min=minimum, state_order=order,
        state_order_full=full, state_compression=1.0 - order / full, go_method=plan.go_method,
        energy_kept_c={p: a.energy_kept("C", widths[p]) for p, a in analyses.items()})


def demo_case(quick: bool = True) -> RunCase:
    """The MNIST setting of the C-balanced experiments (4×256 SiLU MLP), on digits: a seeded MLP cut to its
    C-balanced widths, warm-started and distilled by the run's recovery."""
    from ...datasets import digits
    from ...models import mlp

    train_set, test = digits(as_images=False)
    torch.manual_seed(0)
    model = mlp(64, [256] * 4, 10, "silu")
    train(model, train_set, None, TrainConfig(epochs=15 if quick else 40, batch_size=64, lr=2e-3, seed=0))
    # 400 neurons over the four hidden layers (about 20 % of the parameters): measured on this seed, the distilled
    # network keeps the held-out accuracy; the default energy tolerance (1e-4) keeps 0.4 % and loses 6.5 pp
    cfg = CBalancedConfig(controls=not quick, state_budget=400)
    recovery = RecoveryConfig(epochs=15 if quick else 40)
    return RunCase("digits-mlp-4x256-silu", model.eval(), train_set, test,
                    [VariantSpec("C-balanced + distilled", "cbalanced", cfg, recovery=recovery)],
                    notes=["widths = C ranks sharing 400 neurons; warm start keeps neurons by balanced leverage and "
                           "refits the next layer by least squares, then the recovery distils the original into it"])


# The package exports this module's ``realise`` (the function) lazily; importing the submodule ``realise`` above
# bound the package's name to that submodule, so bind it to the function again.
sys.modules[__package__].realise = realise
