"""C-balanced realisation: read a trained network as a depth-indexed state-space system h_{l+1} = f_l(h_l),
z = g(h_L), rank each state by three empirical Gramian tests, and realise a smaller network with the
balanced (C) ranks as its widths.

Tests per state point (Moore 1981 balanced truncation, applied to empirical Gramians):
A (reachability) energy rank of Gc; B (observability) energy rank of Go; C energy rank of Gc^½ Go Gc^½.
The realised network is trained from scratch or warm-started (neurons kept by balanced leverage, following
Linear layers refitted by least squares), with cross-entropy or distillation; a uniform-width network of the
same parameter count, trained the same way, is the control.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...core.allocate import KEEP, allocate, options_from_spectrum
from ...core.data import Dataset
from ...core.demo_case import DemoCase, DemoRun
from ...core.errors import CompressionError
from ...core.evaluate import compare_outputs, predict
from ...core.options import CostBudget, SeedOption, StateBudgetOption
from ...core.linalg import balanced_basis, balanced_gramian, energy_rank, sym_eig_desc
from ...core.report import CompressionReport, LayerReport
from ...core.spec import MethodSpec
from .smoke import smoke_case
from ...core.train import TrainConfig, train
from .empirical_gramians import StateGramians, collect_gramians, default_state_points
from .realise import (insert_projections, is_basic_resnet, refit_linear_chain, resize_resnet, resize_sequential,
                      resnet_params, sequential_params, stage_producers, top_indices)

__all__ = ["CBalancedConfig", "StateAnalysis", "analyse_states", "budget_ranks", "cbalanced_compress",
           "realise", "demo_case", "INITS", "SELECTIONS", "SPEC"]

log = logging.getLogger(__name__)
INITS = ("scratch", "warm")
SELECTIONS = ("leverage", "magnitude")


@dataclass
class CBalancedConfig(CostBudget, SeedOption, StateBudgetOption):
    """Options of the C-balanced method (no cost budget: the energy tolerance or the state budget sets the widths).

    ``energy_eps``: energy left out by each test's rank (ignored when ``state_budget`` gives the total state order).
    ``init``: ``"scratch"`` or ``"warm"`` (kept neurons copied, then least-squares refit when ``refit``).
    ``distill``: train against the original (``alpha``, ``temperature``) instead of labels alone.
    ``controls``: also train the other inits, the uniform-width control and the projected diagnostic.
    ``go_samples``/``probes``/``max_exact_outputs``: observability Gramian on a subsample, exact Jacobians up to
    that many outputs, else a random-projection estimate.
    """

    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"eps": "energy_eps", "batch_size": "train_batch_size",
                                                    "calib_samples": "gramian_samples"}

    energy_eps: float = field(
        default=1e-4,
        metadata={"help": "Energy left out by each test's rank, in [0, 1); default 1e-4; ignored with --state-budget. "
                          "Deprecated alias: --eps."})
    state_points: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Qualified module name whose output is a state point; default the hidden activations "
                          "(layer1..layer4 of a ResNet)."})
    init: str = field(
        default="warm",
        metadata={"help": "Start of the realised network: warm (kept neurons copied) or scratch; default warm.",
                  "choices": INITS})
    distill: bool = field(
        default=True,
        metadata={"help": "Train against the original's outputs (--alpha, --temperature) instead of labels alone; "
                          "default on."})
    selection: str = field(
        default="leverage",
        metadata={"help": "Which neurons a warm start keeps: by balanced leverage or by weight magnitude; default "
                          "leverage.",
                  "choices": SELECTIONS})
    refit: bool = field(
        default=True,
        metadata={"help": "Least-squares refit after copying the kept neurons of a warm start; default on."})
    ridge: float = field(
        default=1e-6,
        metadata={"help": "Ridge regularisation of the least-squares refit, >= 0; default 1e-6."})
    controls: bool = field(
        default=True,
        metadata={"help": "Also train the other inits, the uniform-width control and the projected diagnostic; "
                          "default on."})
    gramian_samples: int = field(
        default=4000,
        metadata={"help": "Training samples that estimate the Gramians, >= 1; default 4000. Deprecated alias: "
                          "--calib-samples."})
    go_samples: int = field(
        default=2000,
        metadata={"help": "Samples of the observability-Gramian subsample, >= 1; default 2000."})
    max_exact_outputs: int = field(
        default=64,
        metadata={"help": "Exact output Jacobians up to this many outputs, else a random-projection estimate; default "
                          "64."})
    probes: int = field(
        default=16,
        metadata={"help": "Random projections of that estimate when the outputs exceed --max-exact-outputs; default "
                          "16."})
    epochs: int = field(
        default=30,
        metadata={"help": "Maximum training epochs of the realised network, >= 0; default 30."})
    train_batch_size: int = field(
        default=64, metadata={"help": "Training batch size, >= 1; default 64. Deprecated alias: --batch-size."})
    lr: float = field(
        default=3e-3,
        metadata={"help": "Training learning rate (Adam, cosine schedule), > 0; default 3e-3."})
    patience: int = field(
        default=8,
        metadata={"help": "Stop training after this many epochs without validation improvement; default 8."})
    alpha: float = field(
        default=0.7,
        metadata={"help": "Weight of the distillation loss against the label loss, in [0, 1]; default 0.7."})
    temperature: float = field(
        default=4.0,
        metadata={"help": "Softmax temperature of the distillation loss, > 0; default 4."})
    val_fraction: float = field(
        default=0.15,
        metadata={"help": "Fraction of the data held out (seeded) for validation, in (0, 1); default 0.15."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        StateBudgetOption.__post_init__(self)
        if self.init not in INITS:
            raise CompressionError(f"--init must be one of {INITS}, got {self.init!r}")
        if self.selection not in SELECTIONS:
            raise CompressionError(f"--selection must be one of {SELECTIONS}, got {self.selection!r}")
        if not 0.0 <= self.energy_eps < 1.0:
            raise CompressionError(f"--energy-eps must lie in [0, 1), got {self.energy_eps}")
        if not 0.0 < self.val_fraction < 1.0:
            raise CompressionError(f"--val-fraction must lie in (0, 1), got {self.val_fraction}")
        if not 0.0 <= self.alpha <= 1.0:
            raise CompressionError(f"--alpha must lie in [0, 1], got {self.alpha}")
        for flag, value in (("--gramian-samples", self.gramian_samples), ("--go-samples", self.go_samples),
                            ("--train-batch-size", self.train_batch_size), ("--probes", self.probes)):
            if value < 1:
                raise CompressionError(f"{flag} must be >= 1, got {value}")

    def train_config(self) -> TrainConfig:
        return TrainConfig(self.epochs, self.train_batch_size, self.lr, 0.0, self.patience, self.alpha,
                           self.temperature, self.seed)


@dataclass
class StateAnalysis:
    """Ranks of the three tests at one state point, their spectra (descending) and the C-test factors."""

    name: str
    dim: int
    rank_a: int
    rank_b: int
    rank_c: int
    spectra: dict[str, np.ndarray]
    gc_root: torch.Tensor = field(repr=False)
    vb: torch.Tensor = field(repr=False)
    mean: torch.Tensor = field(repr=False)

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
        out[name] = StateAnalysis(name, g.dim, *ranks, spectra, root, vb, g.mean)
    if state_budget is not None:
        for name, r in budget_ranks({n: a.spectra["C"] for n, a in out.items()}, state_budget).items():
            out[name].rank_c = r
    return out


def _scores(model: nn.Sequential, analysis: StateAnalysis, producer: int, width: int, selection: str) -> torch.Tensor:
    """Per-neuron keep score: balanced leverage ‖U_r[i, :]‖² or the L1 norm of the producer's weight row."""
    if selection == "leverage":
        return analysis.basis(width).pow(2).sum(1)
    return model[producer].weight.detach().abs().flatten(1).sum(1).double()


def _realise_sequential(model: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int], init: str,
                        calib: Dataset | None, selection: str, refit: bool, ridge: float, seed: int) -> nn.Module:
    producers = stage_producers(model, list(widths))
    by_index = {producers[p]: w for p, w in widths.items()}
    if init == "scratch":
        torch.manual_seed(seed)
        return resize_sequential(model, by_index).eval()
    keep = {producers[p]: top_indices(_scores(model, analyses[p], producers[p], w, selection), w)
            for p, w in widths.items()}
    new = resize_sequential(model, by_index, keep).eval()
    if refit:
        if calib is None:
            raise CompressionError("the least-squares refit needs calibration data")
        if all(isinstance(model[i], nn.Linear) for i in producers.values()):
            refit_linear_chain(model, new, calib.x, sorted(producers.values()), keep, ridge)
        else:
            log.info("least-squares refit skipped: only Linear stacks are refitted")
    return new


def _resnet_scores(model: nn.Module, analysis: StateAnalysis, stage: str, width: int, selection: str) -> torch.Tensor:
    """Per-channel keep score of a stage: balanced leverage, or the summed L1 norms of its blocks' conv2 rows."""
    if selection == "leverage":
        return analysis.basis(width).pow(2).sum(1)
    return sum(b.conv2.weight.detach().abs().flatten(1).sum(1) for b in model.get_submodule(stage).children()).double()


def _realise_resnet(model: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int], init: str,
                    calib: Dataset | None, selection: str, refit: bool, ridge: float, seed: int) -> nn.Module:
    """Stage widths of a basic-block ResNet; warm start keeps stream channels by ``selection`` and each block's
    inner channels by |BN1 weight| (no least-squares refit)."""
    if init == "scratch":
        torch.manual_seed(seed)
        return resize_resnet(model, widths).eval()
    keep = {p: top_indices(_resnet_scores(model, analyses[p], p, w, selection), w) for p, w in widths.items()}
    keep.update({f"{p}.{j}": top_indices(b.bn1.weight.detach().abs(), w)
                 for p, w in widths.items() for j, b in enumerate(model.get_submodule(p).children())})
    if refit:
        log.info("least-squares refit skipped: only Linear stacks are refitted")
    return resize_resnet(model, widths, keep).eval()


@dataclass(frozen=True)
class _Family:
    """How one model family is realised: ``matches`` picks it; ``params`` counts a realisation without
    building it; ``stage`` gives the module reported for a state point and its producer label."""

    matches: Callable[[nn.Module], bool]
    realise: Callable[..., nn.Module]
    params: Callable[[nn.Module, dict[str, int]], int]
    stage: Callable[[nn.Module, str], tuple[nn.Module, int | str]]


def _sequential_params(model: nn.Module, widths: dict[str, int]) -> int:
    producers = stage_producers(model, list(widths))
    return sequential_params(model, {producers[p]: w for p, w in widths.items()})


def _sequential_stage(model: nn.Module, point: str) -> tuple[nn.Module, int]:
    i = stage_producers(model, [point])[point]
    return model[i], i


_FAMILIES = (
    _Family(is_basic_resnet, _realise_resnet, resnet_params, lambda m, p: (m.get_submodule(p), p)),
    _Family(lambda m: True, _realise_sequential, _sequential_params, _sequential_stage),  # refuses non-Sequential
)


def _family(model: nn.Module) -> _Family:
    return next(f for f in _FAMILIES if f.matches(model))


def realise(model: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int], init: str,
            calib: Dataset | None = None, selection: str = "leverage", refit: bool = True,
            ridge: float = 1e-6, seed: int = 0) -> nn.Module:
    """The same family with width ``widths[p]`` at each state point, freshly initialised or warm-started."""
    return _family(model).realise(model, analyses, widths, init, calib, selection, refit, ridge, seed)


@torch.no_grad()
def _quality(model: nn.Module, data: Dataset) -> dict[str, float]:
    out = predict(model, data)
    res = {"params": sum(p.numel() for p in model.parameters())}
    if data.y is not None and data.y.dtype in (torch.int64, torch.int32):
        res["accuracy"] = float((out.argmax(1) == data.y).double().mean())
        res["cross_entropy"] = float(F.cross_entropy(out.double(), data.y))
    return res


def _trained(model: nn.Module, teacher: nn.Module, train_set: Dataset, val: Dataset, cfg: CBalancedConfig,
             distill: bool) -> tuple[nn.Module, dict]:
    def progress(epoch: int, total: int, metrics: dict) -> None:
        log.info("epoch %d/%d val_loss %.4f", epoch, total, metrics["val_loss"])

    result = train(model, train_set, val, cfg.train_config(), teacher if distill else None, progress=progress)
    return model, {"best_epoch": result.best_epoch, "epochs_run": len(result.history)}


def _variants(model: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int], train_set: Dataset,
              val: Dataset, calib: Dataset, cfg: CBalancedConfig) -> tuple[nn.Module, dict[str, dict]]:
    """Train the configured variant and, with ``controls``, the other inits and the uniform-width control."""
    build = lambda w, init: realise(model, analyses, w, init, calib, cfg.selection, cfg.refit,  # noqa: E731
                                    cfg.ridge, cfg.seed)
    runs = [(cfg.init, cfg.distill)]
    if cfg.controls:
        runs += [(i, d) for i in INITS for d in (False, True) if (i, d) != (cfg.init, cfg.distill)]
    results: dict[str, dict] = {}
    chosen = None
    for init, distill in runs:
        t0 = time.perf_counter()
        net = build(widths, init)
        if init == "warm":
            results["warm_untrained"] = _quality(net, val)
        net, info = _trained(net, model, train_set, val, cfg, distill)
        key = f"{init}{'_distill' if distill else ''}"
        results[key] = {**_quality(net, val), **info, "train_s": time.perf_counter() - t0}
        chosen = net if chosen is None else chosen
    if cfg.controls:
        dims = {p: a.dim for p, a in analyses.items()}
        results.update(_uniform_control(model, widths, dims, train_set, val, cfg, build))
    return chosen, results


def _uniform_control(model: nn.Module, widths: dict[str, int], dims: dict[str, int], train_set: Dataset,
                     val: Dataset, cfg: CBalancedConfig, build: Callable[[dict[str, int], str], nn.Module]
                     ) -> dict[str, dict]:
    """The same family with one width everywhere at the realised parameter count, trained the same way."""
    params = _family(model).params
    target = params(model, widths)
    hi = 4 * max(dims[p] for p in widths) + 1
    w = min(range(1, hi + 1), key=lambda v: abs(params(model, {p: v for p in widths}) - target))
    net, info = _trained(build({p: w for p in widths}, cfg.init), model, train_set, val, cfg, cfg.distill)
    return {"uniform": {**_quality(net, val), **info, "width": w, "init": cfg.init, "distill": cfg.distill}}


def _projected(model: nn.Module, analyses: dict[str, StateAnalysis], val: Dataset) -> dict[str, float] | None:
    """Diagnostic projected model (MLP states only); larger than the original by construction."""
    try:
        proj = insert_projections(model, {p: (a.basis(), a.mean) for p, a in analyses.items()}).eval()
        return _quality(proj, val)
    except (RuntimeError, CompressionError) as err:  # feature-map states cannot be projected as vectors
        log.info("projected model skipped: %s", err)
        return None


def _layer_reports(model: nn.Module, new: nn.Module, analyses: dict[str, StateAnalysis], widths: dict[str, int]
                   ) -> list[LayerReport]:
    family = _family(model)
    rows = []
    for p, a in analyses.items():
        (old_layer, i), (new_layer, _) = family.stage(model, p), family.stage(new, p)
        rows.append(LayerReport(
            p, type(old_layer).__name__, "resized", "width = C rank", sum(t.numel() for t in old_layer.parameters()),
            sum(t.numel() for t in new_layer.parameters()), rank=widths[p], full_rank=a.dim,
            details={"rank_a": a.rank_a, "rank_b": a.rank_b, "rank_c": a.rank_c, "producer": i,
                     "energy_kept_c": a.energy_kept("C", widths[p])}))
    return rows


def cbalanced_compress(model: nn.Module, data: Dataset, config: CBalancedConfig) -> tuple[nn.Module, CompressionReport]:
    """Rank every state point by the A/B/C Gramian tests and realise + train a network with the C widths."""
    cfg = config
    if data.y is None:
        raise CompressionError("cbalanced trains the realised network: give labelled data (targets y)")
    report = CompressionReport("cbalanced", asdict(cfg))
    model.eval()
    train_set, val = data.split(cfg.val_fraction, cfg.seed)
    calib = train_set.take(cfg.gramian_samples)
    points = list(cfg.state_points) or default_state_points(model)
    t0 = time.perf_counter()
    grams = collect_gramians(model, calib, points, cfg.max_exact_outputs, cfg.probes, cfg.go_samples, seed=cfg.seed)
    report.timings_s["gramians"] = time.perf_counter() - t0
    analyses = analyse_states(grams, cfg.energy_eps, cfg.state_budget)
    widths = {p: a.rank_c for p, a in analyses.items()}
    t0 = time.perf_counter()
    new, variants = _variants(model, analyses, widths, train_set, val, calib, cfg)
    report.timings_s["realise_and_train"] = time.perf_counter() - t0
    _fill(report, model, new, analyses, widths, next(iter(grams.values())).go_method)
    report.measured.update(compare_outputs(model, new, val))
    report.measured["original"] = _quality(model, val)
    report.measured["variants"] = variants
    if cfg.controls:
        report.measured["projected"] = _projected(model, analyses, val)
    report.notes.append(f"measured on a seeded {cfg.val_fraction:.0%} validation split of the given data")
    return new, report


def _fill(report: CompressionReport, model: nn.Module, new: nn.Module, analyses: dict[str, StateAnalysis],
          widths: dict[str, int], go_method: str) -> None:
    report.layers = _layer_reports(model, new, analyses, widths)
    report.spectra = {p: {k: v.tolist() for k, v in a.spectra.items()} for p, a in analyses.items()}
    full, order = sum(a.dim for a in analyses.values()), sum(widths.values())
    report.predicted.update({
        "ranks_a": [a.rank_a for a in analyses.values()], "ranks_b": [a.rank_b for a in analyses.values()],
        "ranks_c": [a.rank_c for a in analyses.values()], "state_order": order, "state_order_full": full,
        "state_compression": 1.0 - order / full, "go_method": go_method,
        "energy_kept_c": {p: a.energy_kept("C", widths[p]) for p, a in analyses.items()}})


def demo_case(quick: bool = True) -> DemoCase:
    """The MNIST setting of the C-balanced experiments (4×256 SiLU MLP), on digits: a seeded MLP cut to its
    C-balanced widths."""
    from ...datasets import digits
    from ...models import mlp

    train_set, test = digits(as_images=False)
    torch.manual_seed(0)
    model = mlp(64, [256] * 4, 10, "silu")
    train(model, train_set, None, TrainConfig(epochs=15 if quick else 40, batch_size=64, lr=2e-3, seed=0))
    cfg = CBalancedConfig(epochs=15 if quick else 40, controls=not quick)
    return DemoCase("digits-mlp-4x256-silu", model.eval(), train_set, test,
                    [DemoRun("C-balanced (warm start + distilled)", "cbalanced", cfg)],
                    notes=["widths = C ranks at eps=1e-4; warm start keeps neurons by balanced leverage and "
                           "refits the next layer by least squares"])


SPEC = MethodSpec("cbalanced", "C-balanced realisation: Gramian ranks become the widths of a new network",
                  CBalancedConfig, cbalanced_compress, demo_case=demo_case, report_fields=("spectra",),
                  smoke_case=smoke_case)
