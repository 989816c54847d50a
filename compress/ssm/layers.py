"""SSM layers: the paper's stable rotation-block layer, adapters (dense, S5/S4D diagonal), the modal layer.

All layers map ``u`` (batch, length, h_in) to ``y`` (batch, length, h_out) with
x_{k+1} = A x_k + B u_k, y_k = C x_k + D u_k from zero state. The rotation-block and modal layers run
the recurrence as a causal convolution of ``B u`` with the modal kernel ρ^k R(kα), computed in-graph
from (ρ, α): no per-step unrolling, any sequence length, real dtypes only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .system import StateSpace

__all__ = ["rotation_blocks", "block_diagonal", "modal_state_space", "modal_states",
           "RotationSSM", "ModalSSM", "DiagonalSSM", "DenseSSM", "SchurSSM", "SSM_LAYERS"]

_LOG_TINY = -80.0  # log ρ floor: ρ^k underflows to 0 instead of producing 0·(-inf)


def rotation_blocks(rho: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The 2×2 blocks ρ_i R(α_i) = ρ_i [[cos α_i, −sin α_i], [sin α_i, cos α_i]], shape (..., 2, 2)."""
    c, s = rho * torch.cos(alpha), rho * torch.sin(alpha)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def block_diagonal(rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor | None = None) -> torch.Tensor:
    """Dense A = diag(ρ_1 R(α_1), …, ρ_q R(α_q), λ_1, …, λ_p) (rotation pairs first, then real modes)."""
    blocks = list(rotation_blocks(rho, alpha).unbind(0))
    if lam is not None:
        blocks += [v.reshape(1, 1) for v in lam.unbind(0)]
    return torch.block_diag(*blocks) if blocks else rho.new_zeros(0, 0)


def _powers(rho: torch.Tensor, alpha: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ρ^k cos kα, ρ^k sin kα) for every mode (rows) and power k (columns), via exp(k log ρ)."""
    mag = torch.exp(k[None, :] * torch.log(rho).clamp_min(_LOG_TINY)[:, None])
    ang = k[None, :] * alpha[:, None]
    return mag * torch.cos(ang), mag * torch.sin(ang)


def modal_states(v: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor,
                 use_fft: bool) -> torch.Tensor:
    """States x_t = Σ_{j≥0} A^j v_{t−1−j} of the real modal A for inputs ``v`` (batch, n, length).

    ``use_fft`` picks an FFT convolution (training speed); otherwise a causal grouped ``conv1d`` whose
    kernel ρ^k R(kα) (and |λ|^k cos(kπ[λ<0]) for real modes) is built in-graph for the dynamic length.
    """
    q, length = rho.shape[0], v.shape[-1]
    lam_rho = lam.abs()
    lam_alpha = torch.where(lam < 0, torch.full_like(lam, math.pi), torch.zeros_like(lam))
    if use_fft:
        return _states_fft(v, rho, alpha, lam_rho, lam_alpha)
    # Kernel laid out reversed (k = L−1 … 0) so conv1d's cross-correlation is the causal convolution.
    k = (length - 1) - torch.arange(length, device=v.device, dtype=v.dtype)
    vp = F.pad(v, (length, 0))  # output t of the valid conv sees v_{t−1}, …, v_{t−L}
    parts = []
    if q:
        kc, ks = _powers(rho, alpha, k)
        w = torch.stack([torch.stack([kc, -ks], 1), torch.stack([ks, kc], 1)], 1).reshape(2 * q, 2, length)
        parts.append(F.conv1d(vp[:, : 2 * q], w, groups=q)[..., :length])
    if lam.shape[0]:
        kr, _ = _powers(lam_rho, lam_alpha, k)
        parts.append(F.conv1d(vp[:, 2 * q:], kr[:, None, :], groups=lam.shape[0])[..., :length])
    return torch.cat(parts, 1) if len(parts) > 1 else parts[0]


def _states_fft(v: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, lam_rho: torch.Tensor,
                lam_alpha: torch.Tensor) -> torch.Tensor:
    """FFT version of :func:`modal_states` (same maths, O(L log L))."""
    q, length = rho.shape[0], v.shape[-1]
    k = torch.arange(length, device=v.device, dtype=v.dtype)
    nfft = 2 * length
    conv = lambda kern, sig: torch.fft.irfft(  # noqa: E731
        torch.fft.rfft(kern, nfft) * torch.fft.rfft(sig, nfft), nfft)[..., :length]
    parts = []
    if q:
        kc, ks = _powers(rho, alpha, k)
        v1, v2 = v[:, 0:2 * q:2], v[:, 1:2 * q:2]
        x1, x2 = conv(kc, v1) - conv(ks, v2), conv(ks, v1) + conv(kc, v2)
        parts.append(torch.stack([x1, x2], 2).reshape(v.shape[0], 2 * q, length))
    if lam_rho.shape[0]:
        kr, _ = _powers(lam_rho, lam_alpha, k)
        parts.append(conv(kr, v[:, 2 * q:]))
    z = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
    return F.pad(z[..., :-1], (1, 0))  # x_t uses inputs up to t−1


def _run_modal(u: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor,
               b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, use_fft: bool) -> torch.Tensor:
    """y = C x + D u for the modal system, ``u`` (batch, length, h_in)."""
    v = (u @ b.T).transpose(1, 2)
    x = modal_states(v, rho, alpha, lam, use_fft).transpose(1, 2)
    return x @ c.T + (u * d if d.dim() == 1 else u @ d.T)


def _exporting() -> bool:
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


def modal_state_space(rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor, b: torch.Tensor,
                      c: torch.Tensor, d: torch.Tensor) -> StateSpace:
    """Dense (A, B, C, D) of a real modal system (float64, detached)."""
    f = lambda t: t.detach().double()  # noqa: E731
    return StateSpace(block_diagonal(f(rho), f(alpha), f(lam)), f(b), f(c), f(d))


class _RotationPairs(nn.Module):
    """Rotation pairs ρR(α) only, no real modes; subclasses hold ``rho``, ``alpha``, ``b``, ``c``, ``d``."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        no_real = self.rho.new_zeros(0)
        return _run_modal(u, self.rho, self.alpha, no_real, self.b, self.c, self.d, use_fft=not _exporting())

    def state_space(self) -> StateSpace:
        return modal_state_space(self.rho, self.alpha, self.rho.new_zeros(0), self.b, self.c, self.d)


class RotationSSM(_RotationPairs):
    """The paper's stable layer: A = diag(ρ_i R(α_i)), ρ = (1 + tanh a)/2 ∈ (0,1), α = π(1 + tanh b)/2 ∈ (0,π).

    B (n × h_in) and C (h_out × n) are dense, D is diagonal (h_in = h_out). ``n`` must be even.
    """

    def __init__(self, features: int, state: int, rho_range: tuple[float, float] = (0.7, 0.99),
                 alpha_max: float = math.pi / 2) -> None:
        super().__init__()
        if state % 2:
            raise ValueError(f"RotationSSM needs an even state size (2×2 blocks), got {state}")
        q = state // 2
        rho = torch.empty(q).uniform_(*rho_range)
        alpha = torch.empty(q).uniform_(1e-3, alpha_max)
        self.rho_raw = nn.Parameter(torch.atanh(2 * rho - 1))
        self.alpha_raw = nn.Parameter(torch.atanh(2 * alpha / math.pi - 1))
        scale = torch.sqrt(1 - rho ** 2).repeat_interleave(2)[:, None]  # unit state variance per block
        self.b = nn.Parameter(torch.randn(state, features) * scale / math.sqrt(features))
        self.c = nn.Parameter(torch.randn(features, state) / math.sqrt(state))
        self.d = nn.Parameter(torch.ones(features))

    @property
    def rho(self) -> torch.Tensor:
        return 0.5 * (1 + torch.tanh(self.rho_raw))

    @property
    def alpha(self) -> torch.Tensor:
        return 0.5 * math.pi * (1 + torch.tanh(self.alpha_raw))


class ModalSSM(nn.Module):
    """Real modal layer emitted by the reduction: q rotation pairs ρR(α) then p real modes λ.

    Only real parameters and plain ops (exp, cos, sin, grouped conv1d); cost scales with r = 2q + p.
    """

    def __init__(self, rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor, b: torch.Tensor,
                 c: torch.Tensor, d: torch.Tensor) -> None:
        super().__init__()
        if b.shape[0] != 2 * rho.shape[0] + lam.shape[0]:
            raise ValueError(f"B has {b.shape[0]} rows for {rho.shape[0]} pairs and {lam.shape[0]} real modes")
        self.rho, self.alpha, self.lam = nn.Parameter(rho), nn.Parameter(alpha), nn.Parameter(lam)
        self.b, self.c, self.d = nn.Parameter(b), nn.Parameter(c), nn.Parameter(d)

    @property
    def order(self) -> int:
        return self.b.shape[0]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return _run_modal(u, self.rho, self.alpha, self.lam, self.b, self.c, self.d, use_fft=False)

    def state_space(self) -> StateSpace:
        return modal_state_space(self.rho, self.alpha, self.lam, self.b, self.c, self.d)


class DiagonalSSM(_RotationPairs):
    """Adapter for S5/S4D-style diagonal complex layers (already discretised): x̃' = Λx̃ + B̃u, y = s·Re(C̃x̃) + Du.

    ``s`` = 2 for S5's conjugate-symmetric half spectrum, 1 for a plain real part. Held as the equivalent
    real system: each λ = ρe^{iα} acts on (Re x̃, Im x̃) as ρR(α), so B = [Re B̃; Im B̃], C = s[Re C̃, −Im C̃].
    """

    def __init__(self, lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
                 output_scale: float = 2.0) -> None:
        super().__init__()
        dtype = lam.real.dtype if lam.is_complex() else lam.dtype  # keep the caller's precision
        lam, b, c = lam.to(torch.complex128), b.to(torch.complex128), c.to(torch.complex128)
        if (lam.abs() >= 1).any():
            raise ValueError("DiagonalSSM needs a discretised stable spectrum |λ| < 1 (apply ZOH first)")
        rb = torch.stack([b.real, b.imag], 1).reshape(-1, b.shape[1])
        rc = output_scale * torch.stack([c.real, -c.imag], 2).reshape(c.shape[0], -1)
        self.rho = nn.Parameter(lam.abs().to(dtype))
        self.alpha = nn.Parameter(lam.angle().to(dtype))
        self.b, self.c = nn.Parameter(rb.to(dtype)), nn.Parameter(rc.to(dtype))
        self.d = nn.Parameter(d.to(dtype))


class DenseSSM(nn.Module):
    """Adapter for a layer given as dense (A, B, C, D); runs the plain recurrence (reduce it before export)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Parameter(t.detach().clone()) for t in (a, b, c, d))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        from .system import simulate

        return simulate(StateSpace(self.a, self.b, self.c, self.d), u)

    def state_space(self) -> StateSpace:
        return StateSpace(*(t.detach().double() for t in (self.a, self.b, self.c, self.d)))



class SchurSSM(nn.Module):
    """Fallback layer in real Schur coordinates (orthogonal basis) when the eigenvector basis is ill-conditioned.

    The kernel C S^j (j < ``max_len``) is built in-graph by ⌈log₂ max_len⌉ doublings, then sliced to the
    sequence length (longer sequences see a memory of ``max_len`` steps); the states are then a causal
    conv1d of ``B u``. Graph size depends on ``max_len`` only; cost scales with the order r.
    """

    def __init__(self, s: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
                 max_len: int = 4096) -> None:
        super().__init__()
        self.s, self.b, self.c, self.d = (nn.Parameter(t) for t in (s, b, c, d))
        self.doublings = max(0, math.ceil(math.log2(max_len)))

    @property
    def order(self) -> int:
        return self.b.shape[0]

    def _kernel(self) -> torch.Tensor:
        """(2^doublings, h_out, r) stack of C S^j."""
        g, power = self.c[None], self.s
        for _ in range(self.doublings):
            g = torch.cat([g, g @ power], 0)
            power = power @ power
        return g

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        length = u.shape[1]
        kern = self._kernel()[:length].flip(0).permute(1, 2, 0)  # (h_out, r, K), lags reversed
        v = F.pad((u @ self.b.T).transpose(1, 2), (kern.shape[-1], 0))
        y = F.conv1d(v, kern)[..., :length].transpose(1, 2)
        return y + (u * self.d if self.d.dim() == 1 else u @ self.d.T)

    def state_space(self) -> StateSpace:
        return StateSpace(*(t.detach().double() for t in (self.s, self.b, self.c, self.d)))


SSM_LAYERS: tuple[type[nn.Module], ...] = (RotationSSM, ModalSSM, DiagonalSSM, DenseSSM, SchurSSM)
"""Layer kinds the ``ssm`` method finds and reduces; each has ``state_space() -> StateSpace``."""
