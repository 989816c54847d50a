"""How much the output sees of each residual branch: the scores that order blocks for removal.

All run the traced original (:class:`Masked`: an interpreter that can skip branches, so that no copy of the model
is made per candidate) on the scoring samples:

- ``energy``: ``E‖f(x)‖² / E‖s‖²``, the branch's energy relative to the skip's (the plain criterion);
- ``observability``: ``E‖J f(x)‖² / E‖y_out‖²`` with ``J`` the Jacobian of the model output with respect to the
  block output -- the branch's energy weighted by what the output observes of it, as C-balanced's observability
  Gramian ``Go = E[JᵀJ]`` weights states (``tr(Go Gc)`` restricted to the branch); removing the branch changes the
  output by ``-J f`` to first order. Estimated with Hutchinson probes: ``E_v (vᵀ J f)² = ‖J f‖²`` for ``v ~ N(0, I)``;
- ``removal``: the change of the output when the block alone is removed (:func:`divergence`: KL from the original
  for classifiers, relative squared error otherwise);
- ``greedy``: blocks removed one at a time, each step the one whose removal (given those already removed) raises the
  divergence least per MAC, among the ``candidates`` blocks whose removal alone costs least -- at most
  ``candidates`` passes per step.

References
----------
.. [1] Moore (1981), "Principal component analysis in linear systems: controllability, observability, and model
       reduction", IEEE Trans. Automatic Control 26(1): the observability Gramian whose weighting the
       ``observability`` criterion borrows from C-balanced. The code follows no paper on dropping blocks as such.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ...core.evaluate import flatten_outputs
from ...core.inputs import Inputs, args_of
from ...core.width.tracing import activation_batch
from .graph import Block

__all__ = ["Masked", "outputs", "divergence", "energy_scores", "observability_scores", "removal_scores",
           "greedy_order", "GREEDY_FLOOR"]

GREEDY_FLOOR = 0.25
"""The greedy search stops once the removed blocks leave this fraction of the MACs (no budget asks for less); the
remaining blocks follow in the ``removal`` order."""


class Masked(fx.Interpreter):
    """Runs a traced graph with the branches of ``removed`` skipped (each sum returns a copy of its skip, in the
    sum's memory layout, so that an in-place operation after the sum writes into neither the skip nor the inputs, as
    in the model :func:`~.graph.remove_blocks` builds) and records the values of the nodes named in ``record``."""

    def __init__(self, gm: fx.GraphModule, removed: Collection[Block] = (), record: Collection[str] = (),
                 seen: Callable[[str, Any], None] | None = None) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.skipped = {n for b in removed for n in b.branch}
        self.redirect = {b.add: b.skip for b in removed}
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.record = set(record)
        self.values: dict[str, Any] = {}
        self.seen = seen  # called with (name, value) of each recorded node instead of keeping the value

    def run_node(self, n: fx.Node) -> Any:
        if n.name in self.skipped:
            return None
        if n.name in self.redirect:
            skip = self.env[self.nodes[self.redirect[n.name]]]
            if not isinstance(skip, torch.Tensor):
                return skip
            dense = getattr(n.meta.get("tensor_meta"), "memory_format", None)
            return skip.clone(memory_format=dense or torch.preserve_format)
        out = super().run_node(n)
        if n.name in self.record:
            if self.seen is None:
                self.values[n.name] = out
            else:
                self.seen(n.name, out)
        return out


def _flat(out: Any) -> torch.Tensor:
    """A model's output(s) as one (samples, values) tensor."""
    parts = flatten_outputs(out)
    return torch.cat([t.reshape(len(t), -1) for t in parts], 1) if len(parts) > 1 else parts[0]


def _batches(x: Inputs, size: int) -> list[Inputs]:
    return [x[i:i + size] for i in range(0, len(x), size)]


@torch.no_grad()
def outputs(gm: fx.GraphModule, x: Inputs, removed: Collection[Block] = (), batch: int | None = None
            ) -> torch.Tensor:
    """The graph's outputs on ``x`` with the branches of ``removed`` skipped (``batch`` samples at a time, default
    :func:`~minreal.compress.core.width.tracing.activation_batch`'s)."""
    size = batch or activation_batch(gm, 128)
    return torch.cat([_flat(Masked(gm, removed).run(*args_of(xb))) for xb in _batches(x, size)])


def divergence(ref: torch.Tensor, out: torch.Tensor, classification: bool) -> float:
    """Mean KL(original ‖ new) of the softmax outputs for a classifier, else ``‖out − ref‖² / ‖ref‖²``."""
    ref, out = ref.double(), out.double()
    if classification:
        return float(F.kl_div(F.log_softmax(out, 1), F.log_softmax(ref, 1), log_target=True, reduction="batchmean"))
    return float(((out - ref) ** 2).sum() / (ref ** 2).sum().clamp_min(1e-30))


@torch.no_grad()
def energy_scores(gm: fx.GraphModule, blocks: Sequence[Block], x: Inputs, batch: int | None = None
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """``E‖f(x)‖² / E‖s‖²`` of each block (branch output ``f``, skip ``s``), and the largest ``|f|`` seen (0.0:
    the branch was exactly zero on every sample)."""
    num = dict.fromkeys((b.name for b in blocks), 0.0)
    den = dict.fromkeys((b.name for b in blocks), 0.0)
    peak = dict.fromkeys((b.name for b in blocks), 0.0)
    outs, skips = {}, {}  # node name -> the blocks it is the branch output, or the skip, of
    for b in blocks:
        outs.setdefault(b.branch[-1], []).append(b.name)
        skips.setdefault(b.skip, []).append(b.name)

    def seen(name: str, value: torch.Tensor) -> None:  # summed as each value is computed: none is kept to the end
        energy = float(value.double().pow(2).sum())
        for block in outs.get(name, ()):
            num[block] += energy
            peak[block] = max(peak[block], float(value.abs().max()))
        for block in skips.get(name, ()):
            den[block] += energy

    for xb in _batches(x, batch or activation_batch(gm, 128)):
        Masked(gm, record={*outs, *skips}, seen=seen).run(*args_of(xb))
    return {k: num[k] / max(den[k], 1e-30) for k in num}, peak


def observability_scores(gm: fx.GraphModule, blocks: Sequence[Block], x: Inputs, probes: int, seed: int,
                         batch: int | None = None) -> dict[str, float]:
    """``E‖J f‖² / E‖y_out‖²`` of each block, ``J = ∂ output / ∂ block output`` (Hutchinson, ``probes`` directions
    per batch; the gradient is taken at the branch output ``f``, equal to that at the sum)."""
    gen = torch.Generator().manual_seed(seed)
    gm.requires_grad_(True)  # the traced copy's: frozen weights would leave a branch output without a gradient
    record = {b.branch[-1] for b in blocks}
    seen = dict.fromkeys((b.name for b in blocks), 0.0)
    total = 0.0
    for xb in _batches(x, batch or activation_batch(gm, 64, backward=True)):
        runner = Masked(gm, record=record)
        with torch.enable_grad():
            out = _flat(runner.run(*args_of(xb)))
            # ∂out/∂f = ∂out/∂y for y = s + f; f feeds only the sum, so no in-place op after it has changed it
            branches = [runner.values[b.branch[-1]] for b in blocks]
            for _ in range(probes):
                v = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
                grads = torch.autograd.grad((out * v).sum(), branches, retain_graph=True, allow_unused=True)
                for b, g in zip(blocks, grads):
                    if g is not None:
                        f = runner.values[b.branch[-1]].detach()
                        seen[b.name] += float((g.double() * f.double()).flatten(1).sum(1).pow(2).sum()) / probes
        total += float(out.detach().double().pow(2).sum())
    return {k: s / max(total, 1e-30) for k, s in seen.items()}


def removal_scores(gm: fx.GraphModule, blocks: Sequence[Block], x: Inputs, ref: torch.Tensor, classification: bool
                   ) -> dict[str, float]:
    """:func:`divergence` of the outputs with each block alone removed."""
    return {b.name: divergence(ref, outputs(gm, x, [b]), classification) for b in blocks}


def greedy_order(gm: fx.GraphModule, blocks: Sequence[Block], x: Inputs, ref: torch.Tensor, classification: bool,
                 macs: dict[str, int], total_macs: int, alone: dict[str, float], candidates: int,
                 progress: Callable[[str], None] | None = None) -> tuple[list[str], list[float | None]]:
    """Block names in greedy removal order, and the divergence after each removal (see the module docstring; None
    past :data:`GREEDY_FLOOR`, where the order is that of ``alone``).

    ``alone``: :func:`removal_scores` (they choose each step's candidates and order the blocks past
    :data:`GREEDY_FLOOR`); ``macs``: each block's MACs (``total_macs`` the whole model's)."""
    by_name = {b.name: b for b in blocks}
    remaining = sorted(by_name, key=lambda n: (alone[n] / max(macs[n], 1), n))
    order: list[str] = []
    losses: list[float | None] = []
    current, left = 0.0, total_macs
    while remaining and left > GREEDY_FLOOR * total_macs:
        pool = remaining[:candidates]
        tried = {n: alone[n] if not order else  # nothing removed yet: the divergences of removal_scores
                 divergence(ref, outputs(gm, x, [by_name[m] for m in (*order, n)]), classification) for n in pool}
        best = min(pool, key=lambda n: (max(tried[n] - current, 0.0) / max(macs[n], 1), -macs[n], n))
        order.append(best)
        losses.append(tried[best])
        remaining.remove(best)
        current, left = tried[best], left - macs[best]
        if progress is not None:
            progress(f"greedy step {len(order)}: {best} (divergence {current:.4g}, MACs left {left / total_macs:.3f})")
    for n in remaining:
        order.append(n)
        losses.append(None)
    return order, losses
