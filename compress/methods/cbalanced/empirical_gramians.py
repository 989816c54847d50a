"""Reachability (Gc) and observability (Go) Gramians of a network read as a depth-indexed state-space system.

A state point is a module whose output is the state h_l (hidden activation of an MLP; for CNNs the
stage output, reduced to channels by global average pooling). Statistics are collected through forward
hooks and accumulated batch by batch in float64.

- Gc = centred sample covariance of h_l (unbiased, 1/(N−1)).
- Go = (1/N) Σ_n J_nᵀ J_n with J_n = ∂z/∂h_l at sample n (z = logits). For a feature map the state
  direction c is a channel-uniform shift, so the Jacobian column is the spatial sum of ∂z/∂h[c, ·].
  Exact (one backward per output) when there are few outputs; otherwise the unbiased random-projection
  estimate (1/(N k)) Σ_n Σ_j (J_nᵀ v_j)(J_nᵀ v_j)ᵀ with Rademacher probes v_j (E[v vᵀ] = I).

The estimators themselves (:class:`Moments`, :func:`gram_sum`, :func:`output_directions`) are shared with the
channel-group state points of :mod:`.graph_gramians`.

Under a process group (:mod:`minreal.compress.core.distributed`) each rank runs its shard of the data; Gc's moments are
combined exactly (:meth:`Moments.all_reduce`), Go's sums are all-reduced and divided by the global count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...core.data import Dataset
from ...core.distributed import all_reduce_sum, parallel, rank_seed, shard, sum_count
from ...core.errors import CompressionError, require_finite
from ...core.evaluate import eval_mode
from ...core.inputs import call
from ...core.progress import tracked
from ...models import ACTIVATIONS

__all__ = ["StateGramians", "Moments", "gram_sum", "output_directions", "default_state_points", "collect_states",
           "reachability_gramians", "observability_gramians", "collect_gramians"]

log = logging.getLogger(__name__)

_ACT_TYPES = tuple(ACTIVATIONS.values()) + (nn.ReLU6, nn.ELU, nn.Hardswish, nn.Mish)
_RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
_CHUNK_ROWS = 1 << 16  # rows converted to float64 at a time


@dataclass
class StateGramians:
    """Statistics of one state point: mean, Gc, Go (all float64) and how Go was obtained."""

    name: str
    mean: torch.Tensor
    gc: torch.Tensor
    go: torch.Tensor
    samples_gc: int
    samples_go: int
    go_method: str  # "exact" or "probes:k"

    @property
    def dim(self) -> int:
        return int(self.mean.numel())


def default_state_points(model: nn.Module) -> list[str]:
    """Hidden-activation outputs (MLPs, conv-BN-act stages) or ``layer1…layer4`` of torchvision ResNets.

    Parameters
    ----------
    model : nn.Module
        The network.

    Returns
    -------
    list of str
        Qualified module names whose outputs are the state points.
    """
    names = dict(model.named_children())
    if all(s in names for s in _RESNET_STAGES):
        return list(_RESNET_STAGES)
    points = [n for n, m in model.named_modules() if n and isinstance(m, _ACT_TYPES) and not isinstance(m, nn.Identity)]
    if not points:  # a linear network written with nn.Identity activations
        points = [n for n, m in model.named_modules() if n and isinstance(m, nn.Identity)]
    if not points:
        raise CompressionError("found no hidden activations to use as state points; name them with state_points")
    return points


def _as_state(t: torch.Tensor) -> torch.Tensor:
    """(N, d) state of a hooked output: feature maps are averaged over their spatial axes."""
    if t.dim() == 2:
        return t
    if t.dim() > 2:
        return t.flatten(2).mean(2)
    raise CompressionError(f"state point output has shape {tuple(t.shape)}; expected (N, d) or (N, C, ...)")


def _grad_state(g: torch.Tensor) -> torch.Tensor:
    """Jacobian rows for the state: spatial sum of the gradient (channel-uniform perturbation)."""
    return g if g.dim() == 2 else g.flatten(2).sum(2)


class _Capture:
    """Forward hooks storing the raw outputs of the named modules during one forward pass."""

    def __init__(self, model: nn.Module, points: Sequence[str]) -> None:
        self.out: dict[str, torch.Tensor] = {}
        mods = dict(model.named_modules())
        missing = [p for p in points if p not in mods]
        if missing:
            raise CompressionError(f"state points not found in the model: {missing}")
        self.handles = [mods[p].register_forward_hook(self._hook(p)) for p in points]

    def _hook(self, name: str):
        def hook(_m: nn.Module, _i, out: torch.Tensor) -> None:
            if isinstance(out, torch.Tensor):
                require_finite(out.detach(), name, "output activations")
            self.out[name] = out
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _eval_batches(model: nn.Module, data: Dataset, batch_size: int) -> Iterator[torch.Tensor]:
    with eval_mode(model):
        batches = -(-len(data) // batch_size)
        yield from tracked(data.inputs(batch_size), batches, "Gramian statistics (batches)", log)


@torch.no_grad()
def collect_states(model: nn.Module, data: Dataset, points: Sequence[str], batch_size: int = 256
                   ) -> dict[str, torch.Tensor]:
    """The (N, d) states at each point over ``data`` (eval mode), in the model's dtype.

    Parameters
    ----------
    model : nn.Module
        The network (run in eval mode).
    data : Dataset
        Calibration inputs.
    points : sequence of str
        Qualified names of the modules whose outputs are the states.
    batch_size : int
        Inputs per forward pass.

    Returns
    -------
    dict of str to torch.Tensor
        The (N, d) states of each point.
    """
    cap = _Capture(model, points)
    acc: dict[str, list[torch.Tensor]] = {p: [] for p in points}
    try:
        for xb in _eval_batches(model, data, batch_size):
            call(model, xb)
            for p in points:
                acc[p].append(_as_state(cap.out[p]))
    finally:
        cap.close()
    return {p: torch.cat(v) for p, v in acc.items()}


class Moments:
    """Streaming mean and scatter of row samples in float64, by shifted data (Chan, Golub & LeVeque 1983,
    "Algorithms for computing the sample variance: analysis and recommendations"): rows are centred on the first
    chunk's mean before their products are summed, so a large mean costs no precision; rows are converted to
    float64 in chunks."""

    def __init__(self) -> None:
        self.n = 0
        self.shift: torch.Tensor | None = None
        self.s1: torch.Tensor | None = None
        self.s2: torch.Tensor | None = None

    def update(self, x: torch.Tensor) -> None:
        """Add the rows of ``x`` (samples × d)."""
        for chunk in x.detach().split(_CHUNK_ROWS):
            c = chunk.double()
            if self.shift is None:
                self.shift = c.mean(0)
                self.s1, self.s2 = torch.zeros_like(self.shift), c.new_zeros(c.shape[1], c.shape[1])
            c = c - self.shift
            self.s1 += c.sum(0)
            self.s2 += c.T @ c
            self.n += len(c)

    def all_reduce(self) -> None:
        """Combine the ranks' moments in place (a no-op in one process; collective otherwise), by the pairwise
        update of Chan, Golub & LeVeque (1979) written as sums: ``N = Σ_k n_k``, ``x̄ = Σ_k n_k x̄_k / N``,
        ``scatter = Σ_k [scatter_k + n_k (x̄_k − x̄)(x̄_k − x̄)ᵀ]``. Every rank must hold at least one row."""
        if not parallel():
            return
        if self.shift is None:
            raise CompressionError("a rank saw no state rows; give every process at least one calibration sample")
        n = sum_count(self.n)
        mean = all_reduce_sum(self.n * self.mean) / n
        d = self.mean - mean
        scatter = all_reduce_sum(self.scatter + self.n * torch.outer(d, d))
        self.n, self.shift, self.s1, self.s2 = n, mean, torch.zeros_like(mean), scatter

    @property
    def mean(self) -> torch.Tensor:
        return self.shift + self.s1 / self.n

    @property
    def scatter(self) -> torch.Tensor:
        """Σ_n (x_n − x̄)(x_n − x̄)ᵀ."""
        m = self.s1 / self.n
        return self.s2 - self.n * torch.outer(m, m)


def gram_sum(g: torch.Tensor) -> torch.Tensor:
    """Σ_n g_n g_nᵀ of the rows of ``g`` (samples × d) in float64, converted in chunks."""
    acc = g.new_zeros(g.shape[1], g.shape[1], dtype=torch.float64)
    for chunk in g.detach().split(_CHUNK_ROWS):
        c = chunk.double()
        acc += c.T @ c
    return acc


def output_directions(z: torch.Tensor, max_exact_outputs: int, probes: int, gen: torch.Generator
                      ) -> tuple[list[torch.Tensor], str]:
    """Output-space directions v whose vector-Jacobian products J_nᵀ v_n sum to the Go estimate.

    ``z`` is (N, outputs). Exact: the unit vectors e_j (Σ_j J_nᵀ e_j e_jᵀ J_n = J_nᵀ J_n). Otherwise ``probes``
    Rademacher vectors scaled by 1/√probes, an unbiased estimate since E[v vᵀ] = I/probes per probe.
    Returns the directions (each shaped like ``z``) and ``"exact"`` or ``"probes:k"``.
    """
    if z.shape[1] <= max_exact_outputs:
        eye = torch.eye(z.shape[1], dtype=z.dtype)
        return [eye[j].expand_as(z) for j in range(z.shape[1])], "exact"
    scale = probes ** -0.5
    return [(torch.randint(0, 2, z.shape, generator=gen) * 2 - 1).to(z.dtype) * scale for _ in range(probes)], \
        f"probes:{probes}"


@torch.no_grad()
def reachability_gramians(model: nn.Module, data: Dataset, points: Sequence[str], batch_size: int = 256
                          ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per point ``(mean, Gc)``: streaming centred covariance (1/(N−1)) in float64 (:class:`Moments`).

    The empirical reachability Gramian of a state point is the covariance of its states over the data.

    Parameters
    ----------
    model : nn.Module
        The network (run in eval mode).
    data : Dataset
        Calibration inputs.
    points : sequence of str
        Qualified names of the modules whose outputs are the states.
    batch_size : int
        Inputs per forward pass.

    Returns
    -------
    dict of str to (torch.Tensor, torch.Tensor)
        Per point: the state mean (d,) and Gc (d, d), float64 — of all of ``data`` also under a process group
        (each rank runs its shard; the moments are combined by :meth:`Moments.all_reduce`).
    """
    if len(data) < 2:
        raise CompressionError("the reachability Gramian needs at least 2 calibration samples")
    cap = _Capture(model, points)
    moments = {p: Moments() for p in points}
    try:
        for xb in _eval_batches(model, shard(data), batch_size):
            call(model, xb)
            for p in points:
                moments[p].update(_as_state(cap.out[p]))
    finally:
        cap.close()
    for m in moments.values():
        m.all_reduce()
    return {p: (m.mean, m.scatter / (m.n - 1)) for p, m in moments.items()}


def observability_gramians(model: nn.Module, data: Dataset, points: Sequence[str], max_exact_outputs: int = 64,
                           probes: int = 16, batch_size: int = 256, seed: int = 0
                           ) -> tuple[dict[str, torch.Tensor], str]:
    """Per point Go = mean_n J_nᵀ J_n (float64) and the method used (``"exact"`` or ``"probes:k"``).

    Exact when the model has at most ``max_exact_outputs`` outputs, else ``probes`` Rademacher probes
    (:func:`output_directions`). Assumes samples are independent in eval mode (no batch-coupled layers). J_n is
    the Jacobian of the model's output with respect to the state at the point, for sample n. Under a process
    group each rank runs its shard and the sums Σ_n J_nᵀ J_n are all-reduced before the division by N; the
    probes of each rank are seeded apart (:func:`~minreal.compress.core.distributed.rank_seed`), so a probe estimate
    differs from the single-process one by its sampling error (the exact Go does not).

    Parameters
    ----------
    model : nn.Module
        The network (run in eval mode).
    data : Dataset
        Calibration inputs.
    points : sequence of str
        Qualified names of the modules whose outputs are the states.
    max_exact_outputs : int
        Largest output size for exact Jacobians.
    probes : int
        Rademacher probes per sample beyond that.
    batch_size : int
        Inputs per forward pass.
    seed : int
        Seed of the probes.

    Returns
    -------
    gramians : dict of str to torch.Tensor
        Go (d, d) of each point, float64.
    method : str
        ``"exact"`` or ``"probes:k"``.
    """
    gen = torch.Generator().manual_seed(rank_seed(seed))
    cap = _Capture(model, points)
    acc: dict[str, torch.Tensor] = {}
    method = "exact"
    try:
        for xb in _eval_batches(model, shard(data), batch_size):
            xb = xb.detach().clone().requires_grad_(True)
            z = call(model, xb).reshape(len(xb), -1)
            hs = [cap.out[p] for p in points]
            directions, method = output_directions(z, max_exact_outputs, probes, gen)
            for v in directions:
                grads = torch.autograd.grad(z, hs, grad_outputs=v, retain_graph=True, allow_unused=True)
                for p, g, h in zip(points, grads, hs):
                    acc[p] = acc.get(p, 0) + gram_sum(_grad_state(torch.zeros_like(h) if g is None else g))
    finally:
        cap.close()
    for p in points:
        all_reduce_sum(acc[p])
        require_finite(acc[p], p, "output-gradient products (observability Gramian)")
    return {p: acc[p] / len(data) for p in points}, method


def collect_gramians(model: nn.Module, data: Dataset, points: Sequence[str] | None = None,
                     max_exact_outputs: int = 64, probes: int = 16, go_samples: int | None = None,
                     batch_size: int = 256, seed: int = 0) -> dict[str, StateGramians]:
    """Gc on all of ``data`` and Go on its first ``go_samples`` samples, for every state point.

    Parameters
    ----------
    model : nn.Module
        The network (run in eval mode).
    data : Dataset
        Calibration inputs.
    points : sequence of str, optional
        State points; default :func:`default_state_points`.
    max_exact_outputs, probes : int
        As in :func:`observability_gramians`.
    go_samples : int, optional
        Samples for Go (the costlier Gramian); default all.
    batch_size : int
        Inputs per forward pass.
    seed : int
        Seed of the probes.

    Returns
    -------
    dict of str to StateGramians
        Both Gramians, the mean and the sample counts of each point.
    """
    points = list(points) if points else default_state_points(model)
    gc = reachability_gramians(model, data, points, batch_size)
    go_data = data if go_samples is None else data.take(min(go_samples, len(data)))
    go, method = observability_gramians(model, go_data, points, max_exact_outputs, probes, batch_size, seed)
    return {p: StateGramians(p, gc[p][0], gc[p][1], go[p], len(data), len(go_data), method) for p in points}
