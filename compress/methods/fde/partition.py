"""ε-forward-differential-equivalence (ε-FDE) of neurons and partition refinement over a :class:`Chain`.

Reading the network as a (degenerate) polynomial ODE system, a block of neurons can be lumped into one when
its members' dynamics agree (Cardelli et al. 2017, "Maximal aggregation of polynomial dynamical systems",
Def. 3 (FDE); ε-relaxation as in Cardelli et al. 2021, "Approximate reductions of rational dynamical systems").
For fully connected layers the criteria are, with ``v_i = (W_l[i, :], b_l[i])`` the incoming coefficients and
``c_i = W_{l+1}[:, i]`` the outgoing ones:

* **value** (any activation): ``‖v_i − v_r‖_∞ ≤ ε·s_l`` with ``s_l = max |[W_l | b_l]|``; the block keeps
  ``v_r`` and gets the outgoing column ``Σ_i c_i`` (exact at ε = 0).
* **scaled** (ReLU, LeakyReLU, identity: σ(ρz) = ρσ(z), ρ > 0; any sign for identity): the directions
  ``u_i = v_i/‖v_i‖_∞`` agree within ε, ``ρ_i = ‖v_i‖_∞/‖v_r‖_∞``; outgoing column ``Σ_i ρ_i c_i``. Then
  ``‖v_i − ρ_i v_r‖_∞ ≤ ε‖v_i‖_∞ ≤ ε·s_l``, the same scale-aware tolerance.
* **sum** (identity activation, linear dynamics): outgoing directions ``c_i/‖c_i‖_∞`` agree within ε,
  ``c_i ≈ ρ_i c_r``; the block becomes one neuron with incoming ``Σ_i ρ_i v_i`` and outgoing ``c_r``.

Each block has a reference ``r`` (its leader) and every member is within the tolerance of the reference,
never of another member (no chaining). ``ε = 0`` means equal up to the rounding of the model's dtype
(``4·u`` in the unit-scale coordinates above). Merging in layer ``l`` sums columns of ``W_{l+1}`` and can
make rows of layer ``l+1`` equal; sum-merging changes rows too: :func:`refine` sweeps until no block changes
(the coarsest partition the greedy criteria reach; for ε = 0 the value blocks are exact equivalence classes).

References
----------
.. [1] Cardelli et al. 2017, "Maximal aggregation of polynomial dynamical systems", Def. 3: forward differential
       equivalence (FDE).
.. [2] Cardelli et al. 2021, "Approximate reductions of rational dynamical systems": its ε-relaxation.
.. [3] Cardelli, Tribastone, Tschaikowski & Vandin, "Symbolic computation of differential equivalences", POPL 2016:
       partition refinement to the greatest fixpoint (:func:`refine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.chain import Chain, chain_forward
from ...core.linalg import ridge_lstsq
from .bound import Perturbation, step_bound
from .config import REPRESENTATIVES

__all__ = ["leader_clusters", "rounding_tolerance", "input_blocks", "from_input_blocks", "value_merge", "lump",
           "layer_io", "outgoing_weights", "block_representatives", "block_error", "block_positions", "blocks_to_count",
           "merge_to_widths", "sum_merge", "remove_constant", "remove_all_constant", "box_samples", "MergeStep",
           "RefineResult", "refine"]


@dataclass
class MergeStep:
    """One layer's merge (or removal) in one sweep and its contribution to the output bound."""

    kind: str  # "value" | "scaled" | "sum" | "constant"
    layer: int
    width_before: int
    width_after: int
    bound: float | None = None


@dataclass
class RefineResult:
    """The lumped chain, the steps taken, sweeps to the fixpoint and the summed output bound (per output)."""

    chain: Chain
    steps: list[MergeStep] = field(default_factory=list)
    sweeps: int = 0
    bound: torch.Tensor | None = None
    tolerances: list[float] = field(default_factory=list)


def rounding_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance standing for "equal" at ε = 0: four units of roundoff of ``dtype``."""
    return 4.0 * float(torch.finfo(dtype).eps)


def leader_clusters(x: np.ndarray, tol: float, probes: int = 16) -> np.ndarray:
    """Greedy leader clustering in the ∞-norm: ``leader[i]`` is a row with ``‖x_i − x_leader‖_∞ ≤ tol``.

    ``‖x_i − x_j‖_∞ ≤ tol`` needs ``|x_ik − x_jk| ≤ tol`` in every coordinate ``k``: rows are sorted by the
    coordinate of largest spread, each leader scans only the rows within ``tol`` of it there, drops those
    farther than ``tol`` in the next ``probes − 1`` widest coordinates, and checks the rest in full. Cost
    ``O(n log n + n·w·probes + survivors·d)`` for window ``w``: near-linear when rows are spread, instead of
    all pairs.

    Parameters
    ----------
    x : np.ndarray
        Rows to cluster, shape (n, d).
    tol : float
        ∞-norm radius of a cluster around its leader.
    probes : int
        Widest coordinates checked before the full row.

    Returns
    -------
    np.ndarray
        ``leader[i]``, the index of row i's leader (a leader is its own).
    """
    n = len(x)
    p = x[:, np.argsort(-x.std(0), kind="stable")[:probes]] if n else x
    order = np.argsort(p[:, 0], kind="stable")
    ps = p[order, 0]
    ends = np.searchsorted(ps, ps + tol, side="right")
    leader = np.full(n, -1)
    for k in range(n):
        i = order[k]
        if leader[i] >= 0:
            continue
        leader[i] = i
        cand = order[k + 1:ends[k]]
        cand = cand[leader[cand] < 0]
        cand = cand[np.abs(p[cand, 1:] - p[i, 1:]).max(1, initial=0.0) <= tol]
        if len(cand):
            leader[cand[np.abs(x[cand] - x[i]).max(1) <= tol]] = i
    return leader


def input_blocks(w: torch.Tensor, n: int) -> torch.Tensor:
    """The next layer's weight as ``(out, n, block)``: the block of input ``i`` is a Linear column, the ``H·W``
    columns a Linear after Flatten reads from channel ``i``, or a conv's input-channel slice ``[:, i]``."""
    return w.reshape(w.shape[0], n, -1)


def from_input_blocks(c: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`input_blocks` for ``c`` of shape ``(out, n', block)``, in the layout of ``like``."""
    return c.reshape(len(c), -1) if like.dim() == 2 else c.reshape(len(c), c.shape[1], *like.shape[2:])


def _directions(v: torch.Tensor, any_sign: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows scaled to unit ∞-norm (sign-canonical if ``any_sign``) and the signed scales."""
    norms = v.abs().amax(1).clamp_min(1e-300)
    sign = torch.ones_like(norms)
    if any_sign:
        sign = torch.sign(v[torch.arange(len(v)), v.abs().argmax(1)])
    scale = norms * sign
    return v / scale[:, None], scale


def _blocks(coeff: torch.Tensor, tol: float, scaled: bool, any_sign: bool) -> tuple[np.ndarray, torch.Tensor]:
    """Leader per row and ρ with ``coeff_i ≈ ρ_i coeff_leader``. In scaled mode the zero rows (no direction)
    form one block of their own with ρ = 1: equal rows, so merging them is exact at any tolerance."""
    if not scaled:
        leader = leader_clusters(coeff.numpy(), tol * float(coeff.abs().max().clamp_min(1e-300)))
        return leader, torch.ones(len(coeff), dtype=coeff.dtype)
    u, scale = _directions(coeff, any_sign)
    live = (coeff.abs().amax(1) > 0).numpy()
    leader = np.arange(len(coeff))
    idx, zero = np.flatnonzero(live), np.flatnonzero(~live)
    leader[idx] = idx[leader_clusters(u[idx].numpy(), tol)]
    leader[zero] = zero[:1]
    scale[torch.from_numpy(zero)] = 1.0
    return leader, scale / scale[torch.from_numpy(leader)]


def _regroup(groups: list[list[int]], leader: np.ndarray, keep: np.ndarray) -> list[list[int]]:
    merged = {int(k): [] for k in keep}
    for i, r in enumerate(leader):
        merged[int(r)].extend(groups[i])
    return [sorted(merged[int(k)]) for k in keep]


def value_merge(chain: Chain, l: int, eps: float, scaling: bool = True, representative: str = "leader",
                x: torch.Tensor | None = None) -> tuple[Chain, Perturbation | None, str]:
    """Lump hidden layer ``l`` (neurons, or conv channels by whole filter) by value (or scaled-value)
    equivalence of incoming coefficients; the next layer's input blocks of each block are summed.

    Parameters
    ----------
    chain : Chain
        The MLP (or conv chain).
    l : int
        Hidden layer to lump.
    eps : float
        Tolerance relative to the layer's largest coefficient (0: exact up to rounding).
    scaling : bool
        Also merge positive multiples (ReLU, LeakyReLU, identity).
    representative : str
        Incoming row a block keeps (:data:`REPRESENTATIVES`; ``lstsq`` needs ``x``).
    x : torch.Tensor, optional
        Calibration inputs (MLP chains only) for the ``lstsq`` representative.

    Returns
    -------
    chain : Chain
        The chain with layer ``l`` lumped (the input chain when nothing merges).
    perturbation : Perturbation or None
        The change of the lumped layer's coefficients, for :func:`~minreal.compress.methods.fde.bound.step_bound`.
    summary : str
        One line on what merged.
    """
    v, scaled, any_sign = _incoming(chain, l, scaling)
    leader, rho = _blocks(v, max(eps, rounding_tolerance(chain.dtype)), scaled, any_sign)
    return lump(chain, l, leader, rho, representative, x, "scaled" if scaled else "value")


def _incoming(chain: Chain, l: int, scaling: bool) -> tuple[torch.Tensor, bool, bool]:
    """Rows ``[W_l | b_l]`` of layer ``l``, and whether scaled (and any-sign) merges apply."""
    w = chain.weights[l]
    homogeneous, any_sign = chain.merge_modes(l)
    return torch.cat([w.reshape(len(w), -1), chain.biases[l][:, None]], 1), scaling and homogeneous, any_sign


def lump(chain: Chain, l: int, leader: np.ndarray, rho: torch.Tensor, representative: str = "leader",
         x: torch.Tensor | None = None, kind: str = "value") -> tuple[Chain, Perturbation | None, str]:
    """Lump hidden layer ``l`` by the partition ``leader`` (member ``i`` ≈ ``rho[i]`` × its block's
    representative): the block keeps one incoming row (:func:`block_representatives`) and the sum of its
    members' outgoing blocks scaled by ``rho``. The perturbation ``v_i − ρ_i r`` describes the change exactly,
    whatever the representative ``r``, so the output bound holds for every representative."""
    keep, pos = block_positions(leader)
    if len(keep) == len(leader):
        return chain, None, ""
    v, _, _ = _incoming(chain, l, False)
    w, c = chain.weights[l], input_blocks(chain.weights[l + 1], len(leader))
    h_in = z = None
    if representative == "lstsq":
        if x is None:
            raise ValueError("the lstsq representative needs calibration inputs x")
        h_in, z = layer_io(chain, l, x)
    rep = block_representatives(v, leader, rho, representative, h_in, z, outgoing_weights(c),
                                rounding_tolerance(chain.dtype))
    new = chain.copy()
    new.weights[l], new.biases[l] = rep[:, :-1].reshape(len(keep), *w.shape[1:]), rep[:, -1].clone()
    cols = torch.zeros(len(c), len(keep), c.shape[2], dtype=torch.float64)
    new.weights[l + 1] = from_input_blocks(cols.index_add_(1, pos, c * rho[None, :, None]), chain.weights[l + 1])
    new.groups[l] = _regroup(chain.groups[l], leader, keep)
    delta = v - rho[:, None] * rep[pos]
    return new, Perturbation(l, delta[:, :-1], delta[:, -1]), kind


def layer_io(chain: Chain, l: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ``h_{l−1}`` (n, d) and pre-activation ``z_l`` (n, width) of hidden layer ``l`` on ``x`` (float64)."""
    h = x.reshape(len(x), -1).double() if l == 0 else chain_forward(chain, x, hidden=True)[l - 1]
    return h, h @ chain.weights[l].T + chain.biases[l]


def outgoing_weights(c: torch.Tensor) -> torch.Tensor:
    """Weight of each neuron in the block error: ``‖c_i‖²`` of its outgoing block ``c`` (out, n, block), plus
    ``1e-12`` of the largest so that a block of silent neurons still has a defined weighted mean."""
    w = c.pow(2).sum((0, 2))
    return w + 1e-12 * float(w.max().clamp_min(1e-300))


def block_positions(leader: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    """The leaders in index order and each member's block position among them."""
    keep = np.unique(leader)
    return keep, torch.from_numpy(np.searchsorted(keep, leader))


def block_representatives(v: torch.Tensor, leader: np.ndarray, rho: torch.Tensor, kind: str,
                          h_in: torch.Tensor | None = None, z: torch.Tensor | None = None,
                          weights: torch.Tensor | None = None, exact_tol: float = 0.0) -> torch.Tensor:
    """The incoming row ``[w | b]`` each block keeps.

    * ``leader``: the row of the block's leader (the member with ``ρ = 1``; ε-FDE as in Cardelli et al.).
    * ``mean``: ``mean_i v_i/ρ_i``, which minimises ``Σ_i ‖[H, 1](ρ_i r − v_i)‖²/ρ_i²`` for any inputs ``H``.
    * ``lstsq``: a minimiser of the data-weighted block error :func:`block_error`, i.e. of ``‖A r − t‖²`` with
      ``A = [H, 1]`` and ``t = Σ_i w_i ρ_i z_i / Σ_i w_i ρ_i²`` (normal equations of ``Σ_i w_i ‖ρ_i A r − z_i‖²``),
      taken relative to the leader: ``r = v_lead + A⁺(t − A v_lead)``. ``A⁺`` changes ``v_lead`` only inside
      the row space of ``A``, so directions the calibration data does not see (fewer samples than inputs) keep
      the leader's weights instead of being zeroed. Singleton blocks and blocks whose members agree with the
      leader within ``exact_tol`` (relative to the largest ``|v|``) keep the leader row: merging them is exact.

    Parameters
    ----------
    v : torch.Tensor
        Member rows ``[W_l | b_l]``, shape (n, d + 1).
    leader : np.ndarray
        Leader of each member, shape (n,).
    rho : torch.Tensor
        Member scale relative to its block's leader, shape (n,).
    kind : str
        One of :data:`REPRESENTATIVES`.
    h_in, z, weights : torch.Tensor, optional
        For ``lstsq``: layer inputs (N, d), member pre-activations (N, n) and member weights (n,).
    exact_tol : float
        For ``lstsq``: relative spread within which a block counts as exact (the dtype's rounding).

    Returns
    -------
    torch.Tensor
        Representative rows, one per block in leader order, shape (blocks, d + 1).
    """
    keep, pos = block_positions(leader)
    blocks = len(keep)
    lead = v[torch.from_numpy(keep)].clone()
    if kind == "leader":
        return lead
    count = torch.zeros(blocks, dtype=torch.float64).index_add_(0, pos, torch.ones(len(pos), dtype=torch.float64))
    if kind == "mean":
        return (torch.zeros(blocks, v.shape[1], dtype=torch.float64).index_add_(0, pos, v / rho[:, None])
                / count[:, None])
    if kind != "lstsq":
        raise ValueError(f"representative must be one of {REPRESENTATIVES}, got {kind!r}")
    num = torch.zeros(len(z), blocks, dtype=torch.float64).index_add_(1, pos, z * (weights * rho)[None, :])
    den = torch.zeros(blocks, dtype=torch.float64).index_add_(0, pos, weights * rho * rho)
    dw, db = ridge_lstsq(h_in, num / den[None, :] - (h_in @ lead[:, :-1].T + lead[:, -1]), 0.0)
    spread = (v - rho[:, None] * lead[pos]).abs().amax(1)
    worst = torch.zeros(blocks, dtype=torch.float64).scatter_reduce_(0, pos, spread, "amax")
    lossy = (count > 1) & (worst > exact_tol * float(v.abs().max()))
    return lead + lossy.double()[:, None] * torch.cat([dw, db[:, None]], 1)


def block_error(h_in: torch.Tensor, z: torch.Tensor, leader: np.ndarray, rho: torch.Tensor, weights: torch.Tensor,
                rows: torch.Tensor) -> float:
    """Data-weighted block error ``Σ_i w_i ‖ρ_i [H, 1] r_{block(i)} − z_i‖²`` of representative ``rows``: each
    member's pre-activation against its stand-in's, weighted by its outgoing ``‖c_i‖²`` (for 1-Lipschitz
    activations ``|σ(a) − σ(b)| ≤ |a − b|``, so this controls the block's output error)."""
    _, pos = block_positions(leader)
    zr = h_in @ rows[:, :-1].T + rows[:, -1]
    return float((weights * (rho[None, :] * zr[:, pos] - z).pow(2).sum(0)).sum())


def sum_merge(chain: Chain, l: int, eps: float) -> tuple[Chain, Perturbation | None, str]:
    """Lump identity-activation layer ``l`` by sum (forward) equivalence of outgoing coefficients.

    Parameters
    ----------
    chain : Chain
        The MLP; layer ``l`` must have a linear activation.
    l : int
        Hidden layer to lump.
    eps : float
        Tolerance relative to the largest outgoing coefficient.

    Returns
    -------
    chain : Chain
        The chain with layer ``l`` lumped (the input chain when nothing merges).
    perturbation : Perturbation or None
        The change of the lumped layer's coefficients, for :func:`~minreal.compress.methods.fde.bound.step_bound`.
    summary : str
        One line on what merged.
    """
    if not chain.acts[l].linear:
        raise ValueError(f"sum equivalence needs linear dynamics; layer {l} has {chain.acts[l].kind}")
    c = chain.weights[l + 1].T.contiguous()
    leader, rho = _blocks(c, max(eps, rounding_tolerance(chain.dtype)), True, True)
    keep = np.unique(leader)
    if len(keep) == len(leader):
        return chain, None, ""
    pos = torch.from_numpy(np.searchsorted(keep, leader))
    new = chain.copy()
    w, b = chain.weights[l], chain.biases[l]
    new.weights[l] = torch.zeros(len(keep), w.shape[1], dtype=torch.float64).index_add_(0, pos, w * rho[:, None])
    new.biases[l] = torch.zeros(len(keep), dtype=torch.float64).index_add_(0, pos, b * rho)
    new.weights[l + 1] = chain.weights[l + 1][:, keep]
    new.groups[l] = _regroup(chain.groups[l], leader, keep)
    ref = rho[:, None] * c[torch.from_numpy(leader)]
    return new, Perturbation(l + 1, (c - ref).T, torch.zeros(c.shape[1], dtype=torch.float64)), "sum"


def remove_constant(chain: Chain, l: int, x: torch.Tensor, tol: float = 0.0) -> tuple[Chain, Perturbation | None]:
    """Drop neurons of hidden layer ``l`` constant on the data ``x`` (dead ReLUs: always 0), folding their
    value into the next bias. Exact on ``x``; over a box the removed term ``Σ c_i (h_i − μ_i)`` is bounded.

    Parameters
    ----------
    chain : Chain
        The MLP.
    l : int
        Hidden layer.
    x : torch.Tensor
        Calibration inputs.
    tol : float
        Largest spread over ``x`` that still counts as constant.

    Returns
    -------
    chain : Chain
        The chain without the constant neurons.
    perturbation : Perturbation or None
        The removed term, or None when no neuron is constant.
    """
    h = chain_forward(chain, x, hidden=True)[l]
    mu = h.mean(0)
    const = (h.amax(0) - h.amin(0)) <= tol * float(h.abs().max().clamp_min(1e-300))
    const[0] &= not bool(const.all())  # keep one neuron so the layer stays a Linear
    if not bool(const.any()):
        return chain, None
    keep = torch.nonzero(~const).flatten()
    c = chain.weights[l + 1]
    new = chain.copy()
    new.weights[l], new.biases[l] = chain.weights[l][keep], chain.biases[l][keep]
    new.weights[l + 1] = c[:, keep]
    new.biases[l + 1] = chain.biases[l + 1] + c[:, const] @ mu[const]
    new.groups[l] = [chain.groups[l][int(k)] for k in keep]
    centre = torch.where(const, mu, torch.zeros_like(mu))
    return new, Perturbation(l + 1, c * const.double()[None, :], torch.zeros(c.shape[0], dtype=torch.float64), centre)


def _record(result: RefineResult, before: Chain, after: Chain, pert: Perturbation, kind: str, l: int,
            box: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    step = MergeStep(kind, l, before.widths[l], after.widths[l])
    if box is not None:
        d = step_bound(before, pert, *box)
        step.bound = float(d.max())
        result.bound = d if result.bound is None else result.bound + d
    result.steps.append(step)


def refine(chain: Chain, eps: float, *, scaling: bool = True, sums: bool = True, max_sweeps: int = 50,
           box: tuple[torch.Tensor, torch.Tensor] | None = None, representative: str = "leader",
           x: torch.Tensor | None = None) -> RefineResult:
    """Partition refinement to a fixpoint: sweep value merges forward and sum merges backward until a full
    sweep changes nothing (forward differential equivalence of Cardelli, Tribastone, Tschaikowski & Vandin, "Symbolic
    computation of differential equivalences", POPL 2016, relaxed by ε and applied layer by layer to a
    network read as a dynamical system).

    Parameters
    ----------
    chain : Chain
        The MLP as a chain of Linear layers and activations.
    eps : float
        Merge tolerance relative to each layer's largest coefficient, >= 0 (0: exact up to rounding).
    scaling : bool, optional
        Also merge neurons whose coefficients are positive multiples (ReLU/LeakyReLU/identity).
    sums : bool, optional
        Also merge by forward (sum) equivalence on identity layers.
    max_sweeps : int, optional
        Upper bound on the number of sweeps.
    box : tuple of torch.Tensor, optional
        Input box ``(lo, hi)``; when given, every step's output-deviation bound over it is added up.
    representative : str, optional
        Incoming row of a value block (:data:`REPRESENTATIVES`); ``lstsq`` needs ``x``.
    x : torch.Tensor, optional
        Calibration inputs for the ``lstsq`` representative.

    Returns
    -------
    RefineResult
        The merged chain, the merge steps, the number of sweeps and the accumulated bound (with ``box``).
    """
    result = RefineResult(chain)
    for sweep in range(max_sweeps):
        changed = False
        for l in range(len(chain.acts)):
            new, pert, kind = value_merge(chain, l, eps, scaling, representative, x)
            if pert is not None:
                _record(result, chain, new, pert, kind, l, box)
                chain, changed = new, True
        for l in reversed(range(len(chain.acts)) if sums else ()):
            if chain.acts[l].linear:
                new, pert, kind = sum_merge(chain, l, eps)
                if pert is not None:
                    _record(result, chain, new, pert, kind, l, box)
                    chain, changed = new, True
        result.sweeps = sweep + 1
        if not changed:
            break
    result.chain = chain
    return result


def blocks_to_count(v: torch.Tensor, k: int, scaled: bool, any_sign: bool, iters: int = 40
                    ) -> tuple[np.ndarray, torch.Tensor, float]:
    """A partition of the rows ``v`` into exactly ``k`` blocks (two for ``k = 1`` in scaled mode when there are
    zero and nonzero rows: the zero rows form a block of their own), every member within the returned tolerance
    of its leader.

    Greedy leader clustering is not monotone in the tolerance (a larger one can pick other leaders) and its
    block count jumps, so the tolerance is bisected to the smallest one found with at most ``k`` blocks, then
    the members farthest from their leaders (``‖v_i − ρ_i v_r‖_∞``) become leaders of their own until there
    are ``k``.

    Parameters
    ----------
    v : torch.Tensor
        Rows, shape (n, d).
    k : int
        Blocks wanted, ``1 <= k``; ``k >= n`` keeps every row.
    scaled, any_sign : bool
        As in :func:`value_merge` (merge positive, or any-sign, multiples).
    iters : int
        Bisection steps.

    Returns
    -------
    leader : np.ndarray
        Leader of each row.
    rho : torch.Tensor
        Scale of each row relative to its leader.
    tol : float
        The relative tolerance (ε) the partition was cut at.
    """
    n = len(v)
    if k >= n:
        return np.arange(n), torch.ones(n, dtype=torch.float64), 0.0
    lo, hi = 0.0, 2.0  # rows differ by at most 2 in the (relative or unit-direction) ∞-norm
    best = _blocks(v, hi, scaled, any_sign)
    for _ in range(iters):
        mid = (lo + hi) / 2
        leader, rho = _blocks(v, mid, scaled, any_sign)
        if len(np.unique(leader)) <= k:
            hi, best = mid, (leader, rho)
        else:
            lo = mid
    leader, rho = best[0].copy(), best[1].clone()
    spare = k - len(np.unique(leader))
    if spare > 0:
        dist = (v - rho[:, None] * v[torch.from_numpy(leader)]).abs().amax(1).numpy()
        dist[leader == np.arange(n)] = -1.0
        out = np.argsort(-dist, kind="stable")[:spare]
        leader[out], rho[torch.from_numpy(out)] = out, 1.0
    return leader, rho, hi


def merge_to_widths(chain: Chain, widths: list[int], *, scaling: bool = True, representative: str = "leader",
                    x: torch.Tensor | None = None, box: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> RefineResult:
    """Value/scaled merges layer by layer (forward, one pass) to the given hidden widths: each layer is cut at
    its own tolerance by :func:`blocks_to_count` (recorded in ``tolerances``), bounds recorded like
    :func:`refine`. Layers already at most their target width are left as they are.

    Parameters
    ----------
    chain : Chain
        The MLP.
    widths : list of int
        Target hidden widths.
    scaling, representative, x, box
        As in :func:`refine`.

    Returns
    -------
    RefineResult
        The merged chain, its steps, per-layer tolerances and the accumulated bound (with ``box``).
    """
    result = RefineResult(chain, sweeps=1)
    for l, k in enumerate(widths):
        v, scaled, any_sign = _incoming(chain, l, scaling)
        leader, rho, tol = blocks_to_count(v, k, scaled, any_sign)
        new, pert, kind = lump(chain, l, leader, rho, representative, x, "scaled" if scaled else "value")
        result.tolerances.append(tol)
        if pert is not None:
            _record(result, chain, new, pert, kind, l, box)
            chain = new
    result.chain = chain
    return result


def remove_all_constant(chain: Chain, x: torch.Tensor, tol: float = 0.0,
                        box: tuple[torch.Tensor, torch.Tensor] | None = None) -> RefineResult:
    """Apply :func:`remove_constant` to every hidden layer in order, recording bounds like :func:`refine`.

    Parameters
    ----------
    chain : Chain
        The MLP.
    x : torch.Tensor
        Calibration inputs.
    tol : float
        As in :func:`remove_constant`.
    box : (torch.Tensor, torch.Tensor), optional
        Input box over which each step's output change is bounded.

    Returns
    -------
    RefineResult
        The reduced chain and the step records.
    """
    result = RefineResult(chain)
    for l in range(len(chain.acts)):
        new, pert = remove_constant(chain, l, x, tol)
        if pert is not None:
            _record(result, chain, new, pert, "constant", l, box)
            chain = new
    result.chain = chain
    return result


def box_samples(lo: torch.Tensor, hi: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` uniform points in the box plus its two extreme corners (float64).

    Parameters
    ----------
    lo, hi : torch.Tensor
        Ends of the box, shape (d,).
    n : int
        Uniform samples.
    seed : int
        Seed of the samples.

    Returns
    -------
    torch.Tensor
        Points, shape (n + 2, d).
    """
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, len(lo), generator=g, dtype=torch.float64)
    return torch.cat([lo + u * (hi - lo), lo[None], hi[None]])

