"""Structured (whole-neuron) pruning of MLP chains: matched parameter counts, keep sets, and the shared driver.

Scoring is apart from surgery: a :data:`Scorer` (owned by each pruning method) maps a
:class:`~minreal.compress.core.chain.Chain` and calibration inputs to one score per hidden neuron; :func:`prune_chain`
keeps the top-scoring neurons of each layer. Removing a neuron deletes a row of ``W_l``/``b_l`` and a column of
``W_{l+1}``, so parameters really drop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .chain import Chain, build_sequential, chain_layer_reports, extract_chain, mlp_params
from .costs import model_macs
from .errors import CompressionError
from .options import IMPORTANCE_WEIGHTING_AUTO, PruneOptions, flag_of
from .report import CompressionReport
from .width import Cut, WidthGraph, analyse, apply_cuts
from .width.allocate import allocate_widths, check_width_table, load_width_latency_table
from .width.tracing import trace_notes

__all__ = ["Scorer", "widths_for_params", "mlp_macs", "CHAIN_COSTS", "prune_chain", "GraphScorer", "PrunePrepared",
           "prune_prepare", "prune_realise"]

Scorer = Callable[[Chain, torch.Tensor], list[torch.Tensor]]
#: Channel importance on a traced graph: (analysis, groups that may shrink, calibration inputs) → per group.
GraphScorer = Callable[[WidthGraph, list, torch.Tensor], "dict[str, torch.Tensor]"]


def mlp_macs(in_features: int, widths: Sequence[int], out_features: int) -> int:
    """Multiply-accumulates per sample of a Linear stack: Σ w_{l−1}·w_l over in → widths → out."""
    dims = [in_features, *widths, out_features]
    return sum(a * b for a, b in zip(dims[:-1], dims[1:]))


#: Whole-model cost of an MLP chain, by budget field.
CHAIN_COSTS: dict[str, Callable[[int, Sequence[int], int], int]] = {"param_ratio": mlp_params, "mac_ratio": mlp_macs}


def widths_for_params(in_features: int, widths: list[int], out_features: int, ratio: float,
                      budget: str = "param_ratio") -> list[int]:
    """Largest uniform keep-fraction widths (≥ 1 each) whose cost (``budget``: parameters or MACs) is at most
    ``ratio`` of the full one, found by bisection on the fraction.

    Raises CompressionError naming the flag and the smallest reachable ratio (one neuron per hidden layer)
    when ``ratio`` is below it.
    """
    if budget not in CHAIN_COSTS:
        raise CompressionError(f"pruning does not support `{budget}`; use `param_ratio` or `mac_ratio`",
                               fields=(budget, "param_ratio", "mac_ratio"))
    cost = CHAIN_COSTS[budget]
    if not 0.0 < ratio <= 1.0:
        raise CompressionError(f"`{budget}` must lie in (0, 1], got {ratio}", fields=(budget,))
    full = cost(in_features, widths, out_features)
    smallest = cost(in_features, [1] * len(widths), out_features) / full
    if ratio < smallest - 1e-12:
        raise CompressionError(f"`{budget}`: {flag_of(budget)} {ratio:g} cannot be reached: the smallest "
                               f"whole-model ratio pruning can reach is {smallest:.4f} (one neuron per hidden layer)",
                               fields=(budget,))
    target = ratio * full
    at = lambda f: [max(1, int(f * w)) for w in widths]  # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(in_features, at(mid), out_features) <= target else (lo, mid)
    return at(1.0) if ratio >= 1.0 else at(lo)


def prune_chain(chain: Chain, scores: list[torch.Tensor], widths: list[int]) -> Chain:
    """Keep the ``widths[l]`` highest-scoring neurons of each hidden layer (original order preserved)."""
    if len(widths) != len(chain.acts) or any(not 1 <= k <= n for k, n in zip(widths, chain.widths)):
        raise CompressionError(f"pruned widths {widths} must give 1..n neurons for hidden widths {chain.widths}")
    new = chain.copy()
    for l, (s, k) in enumerate(zip(scores, widths)):
        keep = torch.sort(torch.topk(s, k).indices).values
        new.weights[l], new.biases[l] = new.weights[l][keep], new.biases[l][keep]
        new.weights[l + 1] = new.weights[l + 1][:, keep]
        new.groups[l] = [new.groups[l][int(i)] for i in keep]
    return new


@dataclass
class PrunePrepared:
    """What a pruning method computes once for a model and calibration inputs, whatever the budget.

    ``name``: the method; ``model``: the original model (a reference, never a copy); ``example``: the first two
    calibration inputs, on which :func:`prune_realise` traces the model again (graph path); ``neuron_scores``: on an
    MLP chain, one score per hidden neuron of each hidden layer (None on the graph path); ``group_scores``: on any
    other model, one importance per atom of each channel group that may shrink (None on an MLP chain);
    ``whole_macs``: on the graph path, the whole model's MACs per sample as the report counts them
    (:func:`~minreal.compress.core.costs.model_macs`: what a ``mac_ratio`` budget is of, whatever the budget);
    ``timings_s``: the preparation's timings.
    """

    name: str
    model: nn.Module
    example: torch.Tensor
    neuron_scores: list[torch.Tensor] | None = None
    group_scores: dict[str, torch.Tensor] | None = None
    whole_macs: float | None = None
    timings_s: dict[str, float] = field(default_factory=dict)


def _refuse_widths(cfg: PruneOptions) -> None:
    if cfg.widths:
        raise CompressionError("`widths` sets the hidden widths of an MLP; for other models give `param_ratio` or "
                               "`mac_ratio`", fields=("widths", "param_ratio", "mac_ratio"))


def _cuttable(name: str, model: nn.Module, example: torch.Tensor) -> tuple[WidthGraph, list]:
    """The channel analysis of ``model`` and its groups that may shrink (CompressionError when none may)."""
    wg = analyse(model, example)
    groups = wg.cuttable()
    if not groups:
        reasons = "; ".join(sorted({g.frozen for g in wg.groups if g.frozen})[:3])
        raise CompressionError(f"{name}: no channel group of {type(model).__name__} can shrink ({reasons})")
    return wg, groups


def prune_prepare(name: str, scorer: Scorer, model: nn.Module, cfg: PruneOptions, calibration: torch.Tensor,
                  graph_scorer: GraphScorer | None = None) -> PrunePrepared:
    """The budget-free phase of a pruning method: ``scorer``'s neuron scores on ``calibration`` when ``model`` is
    an MLP chain, else ``graph_scorer``'s channel importance per group of the traced graph
    (:mod:`minreal.compress.core.width`)."""
    prep = PrunePrepared(name, model, calibration[:2])
    try:
        chain = extract_chain(model)
    except CompressionError:
        if graph_scorer is None:
            raise
        chain = None
    t0 = time.perf_counter()
    if chain is not None:
        prep.neuron_scores = scorer(chain, calibration)
        prep.timings_s["scores"] = time.perf_counter() - t0
        return prep
    _refuse_widths(cfg)
    wg, groups = _cuttable(name, model, prep.example)
    prep.timings_s["analyse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prep.group_scores = graph_scorer(wg, groups, calibration)
    prep.whole_macs = float(model_macs(model, prep.example))
    prep.timings_s["scores"] = time.perf_counter() - t0
    return prep


def _prune_graph(prep: PrunePrepared, cfg: PruneOptions, report: CompressionReport) -> nn.Module:
    """Whole channels of any traceable model: the graph traced again, widths on ``cfg.width_multiple`` allocated
    greedily to the whole-model budget from the prepared importances, one cut."""
    _refuse_widths(cfg)
    t0 = time.perf_counter()
    wg, groups = _cuttable(prep.name, prep.model, prep.example)
    scores = prep.group_scores
    if sorted(scores) != sorted(g.name for g in groups) or any(scores[g.name].numel() != g.size for g in groups):
        raise CompressionError(f"{prep.name}: the model's channel groups differ from the prepared ones; prepare again")
    report.timings_s["analyse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    budget, ratio = cfg.target()
    latency = load_width_latency_table(cfg.latency_table) if budget == "latency_ratio" else None
    if latency is not None:
        check_width_table(latency, cfg.latency_table, prep.model, cfg.width_multiple, cfg.width_min)
    allocation: dict = {}
    weighting = cfg.importance_weighting
    if weighting == "auto":
        weighting = IMPORTANCE_WEIGHTING_AUTO.get(prep.name, "cost")
    keep = allocate_widths(wg, scores, budget, ratio, cfg.width_multiple, latency, allocation, weighting,
                           cfg.width_min, _whole_cost(prep, budget))
    report.predicted.importance_weighting = weighting
    setattr(report.predicted, f"allocator_{budget}", allocation["predicted_ratio"])  # a field per BUDGET_FIELDS
    if budget == "latency_ratio":
        report.predicted.whole_model_latency_ratio = allocation["predicted_ratio"]
        report.predicted.latency_table_precision = latency.get("precision", "fp32")  # older tables: fp32
    cuts = {n: Cut(k) for n, k in keep.items() if len(k) < wg.group(n).size}
    new = apply_cuts(wg, cuts)
    report.timings_s["prune"] = time.perf_counter() - t0
    report.predicted.group_widths = {g.name: [g.size, len(keep.get(g.name, g.atoms))] for g in groups}
    kept = {n: set(k) for n, k in keep.items()}
    report.predicted.segment_widths = {  # e.g. the 16/32/64 streams of one option-A ResNet group
        g.name: [[len(seg), len(kept[g.name] & set(seg))] for seg in wg.segments(g)]
        for g in groups if len(wg.segments(g)) > 1}
    frozen = [g for g in wg.groups if g.frozen and g.size > 1]
    report.notes.append(f"{len(groups)} channel groups may shrink, {len(cuts)} cut; widths on multiples of "
                        f"{cfg.width_multiple}" + (f", at least {cfg.width_min}" if cfg.width_min else ""))
    report.notes += [f"left whole: {g.name} ({g.size} channels) — {g.frozen}" for g in frozen]
    if fixed := wg.gm.meta.get("fixed_args"):
        report.notes.append("traced with forward's " + ", ".join(f"{k}={v!r}" for k, v in fixed.items()) + " (the "
                            "data does not give them): the compressed model takes only the inputs the data gives")
    report.notes += trace_notes(wg.gm)
    if decisions := wg.gm.meta.get("decisions"):
        report.predicted.traced_decisions = list(decisions)
    if opaque := wg.gm.meta.get("opaque"):
        report.notes.append("kept whole as single layers, as torch.fx cannot trace or replay them (their channels stay "
                            "as they are; the rest is cut): " + "; ".join(f"{n} ({r})" for n, r in opaque.items()))
    return new


def _whole_cost(prep: PrunePrepared, budget: str) -> float | None:
    """The whole model's cost per sample that a MAC or parameter budget is of (torch's MAC count, prepared once, or
    every parameter); None for a latency budget, which its table prices whole."""
    if budget == "mac_ratio":
        return prep.whole_macs
    if budget == "param_ratio":
        return float(sum(p.numel() for p in prep.model.parameters()))
    return None


def _prune_chain(prep: PrunePrepared, cfg: PruneOptions, report: CompressionReport) -> nn.Module:
    """The MLP chain's hidden neurons with the highest prepared scores, to ``cfg``'s widths."""
    chain = extract_chain(prep.model)
    n_in, n_out = chain.weights[0].shape[1], chain.weights[-1].shape[0]
    widths = list(cfg.widths) or widths_for_params(n_in, chain.widths, n_out, cfg.target()[1], cfg.target()[0])
    t0 = time.perf_counter()
    pruned = prune_chain(chain, prep.neuron_scores, widths)
    report.timings_s["prune"] = time.perf_counter() - t0
    report.layers = chain_layer_reports(chain, pruned, "pruned", [])
    report.predicted.hidden_widths = widths
    off = [w for w in widths if w % cfg.width_multiple or w < min(cfg.width_min, max(chain.widths))]
    if not cfg.widths and off:  # said where it changed something, not on every default run
        report.notes.append(f"an MLP chain is cut neuron by neuron to meet the budget (hidden widths {widths}): the "
                            f"channel multiple {cfg.width_multiple} and floor {cfg.width_min} "
                            f"({flag_of('width_multiple')}, {flag_of('width_min')}) are for traced graphs' convolution "
                            f"kernels and were not applied; give the hidden widths themselves with {flag_of('widths')}")
    return build_sequential(pruned)


def prune_realise(prep: PrunePrepared, cfg: PruneOptions) -> tuple[nn.Module, CompressionReport]:
    """The per-budget phase of a pruning method: widths for ``cfg``'s budget (or its exact ``widths``) from the
    prepared scores, then the pruned model (recovery, if any, runs after:
    :func:`minreal.compress.registry.apply_recovery`)."""
    report = CompressionReport(prep.name, asdict(cfg), timings_s=dict(prep.timings_s))
    build = _prune_chain if prep.neuron_scores is not None else _prune_graph
    return build(prep, cfg, report), report
