"""The ``depth`` method's two phases: ``depth_prepare`` finds and scores the residual blocks once; ``depth_realise``
removes blocks in that order until the budget holds."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from operator import attrgetter
from pathlib import Path

import torch
from torch import fx, nn

from ...core.cache import model_key
from ...core.costs import model_macs, node_flops
from ...core.data import Dataset
from ...core.errors import CompressionError
from ...core.evaluate import flatten_outputs
from ...core.heldout import resolve_task
from ...core.inputs import Inputs, args_of
from ...core.options import flag_of
from ...core.report import CompressionReport, LayerReport
from ...core.width.tracing import is_exported_program, trace, trace_notes
from .config import DEFAULT_MAC_RATIO, DepthConfig
from .criteria import energy_scores, greedy_order, observability_scores, outputs, removal_scores
from .graph import Block, blocks_named, drop_unused_results, find_blocks, remove_blocks

__all__ = ["DepthPrepared", "depth_prepare", "depth_realise", "depth_compress", "removable_blocks", "traced_blocks",
           "latency_savings"]

log = logging.getLogger(__name__)


@dataclass
class DepthPrepared:
    """What ``depth`` computes once for a model and calibration data, whatever the budget.

    ``model``: the original (a reference); ``example``: two calibration inputs on which ``realise`` traces it again
    (node names are stable across traces); ``blocks``: every residual block found; ``left``: residual sums left
    alone, with the reason; ``removable``: the names of the blocks that may go (identity skip, or a shortcut whose
    branch was exactly zero on the scoring samples; none excluded); ``macs``/``params``: what removing each alone
    saves, of ``total_macs``/``total_params``; ``param_owners``: each parameter's size and the blocks whose branches
    use it (``""``: used outside every branch), so that the parameters a set of removed blocks frees are counted
    exactly (a layer shared by two blocks goes only with both); ``scores``: per criterion computed, each block's score;
    ``order``: the removable blocks in the criterion's removal order; ``divergence``: the greedy divergence on the
    scoring samples after each removal (None where not computed); ``timings_s``: the preparation's timings;
    ``traced_values``: whether the model was traced carrying example values (its plain trace kept whole the modules
    holding every residual block), as ``realise`` traces it again.
    """

    model: nn.Module
    example: Inputs
    criterion: str
    blocks: list[Block]
    left: list[tuple[str, str]]
    removable: list[str]
    macs: dict[str, int]
    params: dict[str, int]
    total_macs: int
    total_params: int
    scores: dict[str, dict[str, float]]
    order: list[str]
    divergence: list[float | None] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    param_owners: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    traced_values: bool = False

    def params_freed(self, removed: Collection[str]) -> int:
        """Parameters that removing the blocks ``removed`` frees: those no remaining node uses."""
        gone = set(removed)
        return sum(size for size, owners in self.param_owners
                   if owners and "" not in owners and gone.issuperset(owners))


def _scoring_samples(data: Dataset, n: int, seed: int) -> tuple[Inputs, torch.Tensor | None]:
    """A seeded subset of ``n`` calibration samples (all of them when fewer)."""
    if len(data) <= n:
        return data.x, data.y
    idx = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return data.x[idx], None if data.y is None else data.y[idx]


def _traced(model: nn.Module, example: Inputs, values: bool = False) -> fx.GraphModule:
    """The model traced for depth (:func:`~minreal.compress.core.width.tracing.trace`, carrying example values with
    ``values``), its unused results dropped."""
    if is_exported_program(model):
        raise CompressionError("depth needs the model's Python modules (an nn.Module built by its code, e.g. "
                               "file.py:factory or a torchvision name): a torch.export program (.pt2) holds ATen "
                               "operations, whose residual blocks cannot be found")
    try:
        gm = trace(model, example, values=values)
    except CompressionError as exc:
        raise CompressionError(str(exc).replace("width surgery needs", "depth needs")) from None
    return drop_unused_results(gm.eval())


def traced_blocks(model: nn.Module, example: Inputs) -> tuple[fx.GraphModule, list[Block], list[tuple[str, str]],
                                                             bool]:
    """The traced model, its residual blocks and the sums left, and whether it was traced carrying example values:
    where the modules plain torch.fx keeps whole (a Hugging Face GPT2Model inside GPT2LMHeadModel: a check on a size
    in Python) hold every residual block, the model is traced again with example values (as width methods do,
    :func:`~minreal.compress.core.width.analysis.analyse`), and that trace is taken if it finds a block."""
    gm = _traced(model, example)
    blocks, left = find_blocks(gm)
    if blocks or not gm.meta.get("opaque"):
        return gm, blocks, left, False
    try:
        again = _traced(model, example, values=True)
    except CompressionError:
        return gm, blocks, left, False
    found, rest = find_blocks(again)
    return (again, found, rest, True) if found else (gm, blocks, left, False)


def no_block_error(model: nn.Module, gm: fx.GraphModule, what: str = "depth",
                   instead: str = "use a width or rank method instead") -> CompressionError:
    """The one line for a model in whose trace ``gm`` no residual block was found, naming the layers traced whole
    that may hold some (``what``: who says it; ``instead``: what to do)."""
    whole = sorted({type(m).__name__ for m in model.modules()
                    if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))}
                   | set(gm.meta.get("opaque", {})))
    inside = (f" ({', '.join(whole)} is traced as one layer, its residual sums inside it: write the layer in "
              "plain modules to cut its sub-blocks)") if whole else ""
    return CompressionError(f"{what}: {type(model).__name__} has no removable residual block (a sum y = x + f(x) "
                            f"whose branch f starts from x and holds a layer with parameters){inside}; {instead}")


def _excluded(blocks: list[Block], exclude: tuple[str, ...]) -> set[str]:
    """Names of the blocks ``exclude`` keeps (a block name, or a layer inside the branch); CompressionError for a
    name that matches no block."""
    kept = set()
    for name in exclude:
        hits = [b.name for b in blocks
                if b.name == name or any(m == name or m.startswith(name + ".") for m in b.modules)]
        if not hits:
            raise CompressionError(f"`exclude`: {flag_of('exclude')} {name}: no residual block has that name or a "
                                   f"layer of that name; blocks: {', '.join(b.name for b in blocks)}",
                                   fields=("exclude",))
        kept.update(hits)
    return kept


def _macs(gm: nn.Module, example: Inputs) -> int:
    """The whole model's MACs as the compression report counts them (:func:`~minreal.compress.core.costs.model_macs`:
    torch's count, SSM layers by their rule)."""
    return model_macs(gm, example)


def _costs(gm: fx.GraphModule, blocks: list[Block], example: Inputs) -> tuple[dict[str, int], int]:
    """MACs each block's removal alone saves, and the whole model's MACs (:func:`_macs`).

    From one counted forward where torch's count is the whole count: a removal leaves every other value's shape as
    it was (the sum becomes its skip), so it saves exactly the MACs of the nodes that die with the block alone
    (:func:`_dies_with`, what :func:`~.graph.remove_blocks` erases). Where rules or ops torch cannot count make up
    part of the whole (SSM layers, an FFT), each removal is counted whole instead: one copy and count per block."""
    total = _macs(gm, example)
    flops = node_flops(gm, example)
    if sum(flops.values()) // 2 != total:
        return {b.name: total - _macs(remove_blocks(gm, [b]), example) for b in blocks}, total
    saved = dict.fromkeys((b.name for b in blocks), 0)
    for node, owners in _dies_with(gm, blocks).items():
        if len(owners) == 1 and (owner := next(iter(owners))) in saved:
            saved[owner] += flops.get(node.name, 0)
    return {name: f // 2 for name, f in saved.items()}, total


def _dies_with(gm: fx.GraphModule, blocks: list[Block]) -> dict[fx.Node, frozenset[str]]:
    """Every node's blocks whose removal its uses die with (``""``: a use that stays otherwise): a node in a block's
    branch dies with it, and a node all of whose users die with blocks dies with those. A node outside every branch
    that nothing uses (an in-place ``g.sigmoid_()`` written as a statement) stays, as :func:`~.graph.remove_blocks`
    leaves it, and so does what it reads."""
    where = {n: b.name for b in blocks for n in b.branch}
    dies_with: dict[fx.Node, frozenset[str]] = {}
    for node in reversed(list(gm.graph.nodes)):
        if node.name in where:
            dies_with[node] = frozenset((where[node.name],))
        elif node.op == "output" or not node.users:
            dies_with[node] = frozenset(("",))
        else:
            dies_with[node] = frozenset().union(*(dies_with[u] for u in node.users))
    return dies_with


def _param_owners(gm: fx.GraphModule, blocks: list[Block]) -> list[tuple[int, tuple[str, ...]]]:
    """Each parameter the graph uses: its size, and the blocks whose removal its uses die with (``""``: a use that
    reaches the output otherwise). A use dies with a block when it is in the block's branch, or when all it feeds
    dies with blocks (a relative-position bias gathered from a table for one attention branch, a layer scale read
    by a get_attr node, which takes no input from the block); a parameter shared by two layers, or a layer called
    twice, has every user's blocks among its owners."""
    dies_with = _dies_with(gm, blocks)
    modules = dict(gm.named_modules())
    owners: dict[int, set[str]] = {}
    sizes: dict[int, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            tensors = list(modules[node.target].parameters())
        elif node.op == "get_attr":
            value = attrgetter(node.target)(gm)
            tensors = [value] if isinstance(value, nn.Parameter) else []
        else:
            continue
        for t in tensors:
            owners.setdefault(id(t), set()).update(dies_with[node])
            sizes[id(t)] = t.numel()
    return [(sizes[i], tuple(sorted(o))) for i, o in owners.items()]  # plain data: the prepared state is cached


def removable_blocks(blocks: list[Block], peaks: dict[str, float], exclude: tuple[str, ...]
                     ) -> tuple[list[str], dict[str, str]]:
    """The blocks that may go, and why each other one stays: excluded, or a shortcut whose branch is not exactly
    zero (removing it would not leave what the block computes)."""
    excluded = _excluded(blocks, exclude)
    names, reasons = [], {}
    for b in blocks:
        if b.name in excluded:
            reasons[b.name] = f"excluded ({flag_of('exclude')})"
        elif not b.identity and peaks[b.name] != 0.0:
            reasons[b.name] = (f"its skip is a shortcut ({b.shortcut}), not the identity, and its branch is not "
                               "exactly zero")
        else:
            names.append(b.name)
    return names, reasons


def _order(names: list[str], scores: dict[str, float], macs: dict[str, int]) -> list[str]:
    """Cheapest first: score per MAC saved, ties by name."""
    return sorted(names, key=lambda n: (scores[n] / max(macs[n], 1), n))


def depth_prepare(model: nn.Module, data: Dataset, config: DepthConfig) -> DepthPrepared:
    """The budget-free phase: trace, find the residual blocks, cost each one's removal, score and order them."""
    t0 = time.perf_counter()
    example = data.x[: min(len(data), 2)]
    gm, blocks, left, values = traced_blocks(model, example)
    opaque = gm.meta.get("opaque", {})  # modules torch.fx could not trace or replay: their residual sums are unseen
    left = [*left, *((name, f"kept whole as one layer, torch.fx cannot trace or replay it ({why}): its own residual "
                             "sums are not seen") for name, why in opaque.items())]
    if not blocks:
        raise no_block_error(model, gm)
    timings = {"trace": time.perf_counter() - t0}
    x, y = _scoring_samples(data, config.score_samples, config.seed)
    t0 = time.perf_counter()
    energy, peaks = energy_scores(gm, blocks, x)
    timings["energy"] = time.perf_counter() - t0
    names, reasons = removable_blocks(blocks, peaks, config.exclude)
    if not names:
        why = "; ".join(f"{n}: {r}" for n, r in reasons.items())
        raise CompressionError(f"depth: no residual block of {type(model).__name__} may be removed ({why[:300]})")
    chosen = blocks_named(blocks, names)
    t0 = time.perf_counter()
    macs, total = _costs(gm, blocks, example)  # every block's, for the report; removable ones are chosen
    owners = _param_owners(gm, blocks)
    timings["costs"] = time.perf_counter() - t0
    scores: dict[str, dict[str, float]] = {"energy": {n: energy[n] for n in names}}
    t0 = time.perf_counter()
    order, divergence = _criterion_order(config, gm, chosen, x, y, macs, total, scores)
    timings["score"] = time.perf_counter() - t0
    prep = DepthPrepared(model, example, config.criterion, blocks, left, names, macs, {}, total,
                         sum(p.numel() for p in gm.parameters()), scores, order, divergence, reasons, timings, owners,
                         values)
    prep.params = {b.name: prep.params_freed([b.name]) for b in blocks}
    return prep


def _criterion_order(config: DepthConfig, gm: fx.GraphModule, blocks: list[Block], x: Inputs,
                     y: torch.Tensor | None, macs: dict[str, int], total: int, scores: dict[str, dict[str, float]]
                     ) -> tuple[list[str], list[float | None]]:
    """The removal order of ``config.criterion`` (its scores added to ``scores``), and the divergence after each
    greedy removal."""
    names = [b.name for b in blocks]
    if config.criterion == "energy":
        return _order(names, scores["energy"], macs), []
    if config.criterion == "observability":
        scores["observability"] = observability_scores(gm, blocks, x, config.observability_probes, config.seed)
        return _order(names, scores["observability"], macs), []
    ref = outputs(gm, x)
    # a KL over softmaxes is for one class-score output; several outputs (concatenated in ref) are compared as values
    with torch.no_grad():
        single = len(flatten_outputs(gm(*args_of(x[:1])))) == 1
    classification = single and resolve_task("auto", y, ref) == "classification"
    scores["removal"] = removal_scores(gm, blocks, x, ref, classification)
    if config.criterion == "removal":
        return _order(names, scores["removal"], macs), []
    return greedy_order(gm, blocks, x, ref, classification, macs, total, scores["removal"],
                                 config.greedy_candidates, progress=log.info)


def _budget(cfg: DepthConfig) -> tuple[str, float]:
    given = cfg.budget_given
    return (given[0], getattr(cfg, given[0])) if given else ("mac_ratio", DEFAULT_MAC_RATIO)


def latency_savings(path: str, prep: DepthPrepared) -> tuple[dict[str, float], float]:
    """Per removable block, the latency its removal alone saved in a depth latency table (``minreal latency-table
    --kind depth``), and the whole model's; CompressionError naming the file when it does not fit the model."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CompressionError(f"`latency_table` {path}: cannot read it ({type(exc).__name__})",
                               fields=("latency_table",)) from None
    if not isinstance(table, dict) or table.get("kind") != "depth":
        raise CompressionError(f"`latency_table` {path} is not a depth table; build one with `minreal "
                               "latency-table MODEL --kind depth --out table.json`", fields=("latency_table",))
    if table.get("model_hash") != model_key(prep.model):
        raise CompressionError(f"`latency_table` {path} was measured on another model (or other weights); build it "
                               "again for this one", fields=("latency_table",))
    blocks = table.get("blocks", {})
    if not isinstance(blocks, dict):
        blocks = {}
    missing = [n for n in prep.removable if n not in blocks]
    if missing:
        raise CompressionError(f"`latency_table` {path} has no latency for the residual blocks "
                               f"{', '.join(missing[:4])}; build it again for this model", fields=("latency_table",))
    savings = {n: _milliseconds(blocks[n].get("saving_ms") if isinstance(blocks[n], dict) else None, path,
                                f"blocks.{n}.saving_ms") for n in prep.removable}
    return {n: max(v, 0.0) for n, v in savings.items()}, _milliseconds(table.get("model_ms"), path, "model_ms")


def _milliseconds(value: object, path: str, key: str) -> float:
    """``value`` as a finite number of milliseconds; CompressionError naming the table and the key otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CompressionError(f"`latency_table` {path}: {key} is {value!r}, not a number of milliseconds; build the "
                               "table again with `minreal latency-table MODEL --kind depth`", fields=("latency_table",))
    return float(value)


def _costs_of(prep: DepthPrepared, kind: str, table: str | None) -> tuple[dict[str, float], float]:
    if kind == "latency_ratio":
        return latency_savings(table or "", prep)
    if kind == "param_ratio":
        return {k: float(v) for k, v in prep.params.items()}, float(prep.total_params)
    return {k: float(v) for k, v in prep.macs.items()}, float(prep.total_macs)


def _prefix(prep: DepthPrepared, kind: str, target: float, table: str | None) -> tuple[list[str], float]:
    """The shortest prefix of the removal order that meets the budget, and the ratio it reaches (for a latency
    budget, predicted from the table: the whole model's latency less each removed block's saving)."""
    cost, total = _costs_of(prep, kind, table)
    order = prep.order
    if kind != "mac_ratio" and prep.criterion in prep.scores:  # scores per unit of the budget's own cost
        scores = prep.scores[prep.criterion]
        order = sorted(prep.order, key=lambda n: (scores[n] / max(cost[n], 1e-12), n))
    left, chosen = total, []
    for name in order:
        if left <= target * total * (1 + 1e-9):
            break
        chosen.append(name)
        # parameters are not additive (a layer shared by blocks goes with the last of them); MACs and latency are
        left = total - prep.params_freed(chosen) if kind == "param_ratio" else left - cost[name]
    ratio = left / max(total, 1e-30)
    if ratio > target * (1 + 1e-9):
        least = math.ceil(ratio * 1000) / 1000
        raise CompressionError(f"depth: `{kind}`: removing all {len(prep.order)} removable residual blocks leaves "
                               f"{flag_of(kind)} {ratio:.4f}, above the requested {target:g}; ask for at least "
                               f"{least:g}, or chain depth with a width method (a plan file's method = [\"depth\", "
                               "\"magnitude\"]; tune searches depth+magnitude by itself)", fields=(kind,))
    return chosen, ratio


def depth_realise(prep: DepthPrepared, config: DepthConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove blocks in the prepared order until the budget holds (see :class:`DepthConfig`)."""
    kind, target = _budget(config)
    chosen, ratio = _prefix(prep, kind, target, config.latency_table)
    gm = _traced(prep.model, prep.example, prep.traced_values)
    new = remove_blocks(gm, blocks_named(prep.blocks, chosen))
    new.train(prep.model.training)
    report = _report(prep, config, chosen, kind, target, ratio)
    report.notes += trace_notes(gm)
    if decisions := gm.meta.get("decisions"):
        report.predicted.traced_decisions = list(decisions)
    return new, report


def _report(prep: DepthPrepared, config: DepthConfig, chosen: list[str], kind: str, target: float, ratio: float
            ) -> CompressionReport:
    report = CompressionReport("depth", {k: getattr(config, k) for k in config.__dataclass_fields__})
    rank = {n: i for i, n in enumerate(prep.order)}
    for b in prep.blocks:
        removed = b.name in chosen
        macs, params = prep.macs.get(b.name, 0), prep.params.get(b.name, 0)
        scores = {c: s[b.name] for c, s in prep.scores.items() if b.name in s}
        report.layers.append(LayerReport(
            b.name, "residual block" if b.identity else f"residual block (shortcut: {b.shortcut})",
            "removed" if removed else "kept", reason=prep.reasons.get(b.name, ""),
            params_before=params, params_after=0 if removed else params,
            macs_before=macs, macs_after=0 if removed else macs,
            details={"scores": scores, "order": rank.get(b.name), "layers": list(b.modules)}))
    step = len(chosen) - 1
    report.predicted = replace(
        report.predicted, criterion=prep.criterion, blocks_found=len(prep.blocks), blocks_removable=len(prep.removable),
        blocks_removed=len(chosen), removed=list(chosen), order=list(prep.order),
        block_budget={"kind": kind, "requested": target, "reached": ratio},
        divergence_on_scoring_samples=prep.divergence[step] if 0 <= step < len(prep.divergence) else None)
    if kind == "latency_ratio":
        report.predicted.whole_model_latency_ratio = ratio
    if prep.left:
        report.notes.append("residual sums left alone: " + "; ".join(f"{a} ({r})" for a, r in prep.left))
    report.timings_s.update({f"prepare:{k}": v for k, v in prep.timings_s.items()})
    return report


def depth_compress(model: nn.Module, data: Dataset, config: DepthConfig) -> tuple[nn.Module, CompressionReport]:
    """:func:`depth_prepare`, then :func:`depth_realise`."""
    return depth_realise(depth_prepare(model, data, config), config)
