"""SSM layers: the stable rotation-block layer of Schwerdtner et al., "Hankel singular value regularization for
highly compressible state space models", adapters (dense, S5/S4D diagonal), the modal layer.

All layers map ``u`` (batch, length, h_in) to ``y`` (batch, length, h_out) with
x_{k+1} = A x_k + B u_k, y_k = C x_k + D u_k from zero state. The rotation-block and modal layers run
the recurrence as a causal convolution of ``B u`` with the modal kernel ρ^k R(kα), computed in-graph
from (ρ, α): no per-step unrolling, any sequence length, real dtypes only. Without the FFT (export, the
modal layer) the convolution is two-level: within chunks of T steps, then over chunks (sub-quadratic in L).
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


def _block_powers(rho: torch.Tensor, alpha: torch.Tensor, k: torch.Tensor, m: int) -> torch.Tensor:
    """A_g^k for every mode block g and power k (any shape): (G, m, m, *k.shape).

    m = 2: the rotation block ρ^k R(kα); m = 1: the real mode ρ^k cos(kα) (α ∈ {0, π} encodes the sign).
    """
    kc, ks = _powers(rho, alpha, k.reshape(-1))
    shape = (rho.shape[0], m, m, *k.shape)
    if m == 1:
        return kc.reshape(shape)
    return torch.stack([torch.stack([kc, -ks], 1), torch.stack([ks, kc], 1)], 1).reshape(shape)


def _direct_states(v: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, m: int,
                   step: int = 1) -> torch.Tensor:
    """x_t = Σ_{j≥0} (A^step)^j v_{t−1−j} for one kind of block, ``v`` (batch, G·m, L): a causal grouped
    conv1d whose full-length kernel is built in-graph (O(L²) per channel)."""
    length = v.shape[-1]
    # Kernel laid out reversed (k = L−1 … 0) so conv1d's cross-correlation is the causal convolution.
    k = step * ((length - 1) - torch.arange(length, device=v.device, dtype=v.dtype))
    w = _block_powers(rho, alpha, k, m).reshape(rho.shape[0] * m, m, length)
    # Output t of the valid conv sees v_{t−1}, …, v_{t−L}.
    return F.conv1d(F.pad(v, (length, 0)), w, groups=rho.shape[0])[..., :length]


def _chunked_states(v: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, m: int, chunk: int) -> torch.Tensor:
    """:func:`_direct_states` by a two-level (chunked) convolution over chunks of T = ``chunk`` steps.

    With t = jT + k: x_t = Σ_{jT≤s<t} A^{t−1−s} v_s + A^k e_j, where e_j = x_{jT} obeys e_{j+1} = A^T e_j + s_j
    and s_j = Σ_{k<T} A^{T−1−k} v_{jT+k}. The within-chunk states and s_j are one stride-T conv (a
    block-Toeplitz product per chunk), e_j is the direct convolution over chunks with (ρ^T, Tα), and A^k e_j a
    stride-T transposed conv: O(L·T + L²/T²) per state instead of O(L²). Returns N·T ≥ L steps, N ≥ 2 chunks.
    """
    g, t, b = rho.shape[0], chunk, v.shape[0]
    steps = torch.arange(t + 1, device=v.device, dtype=v.dtype)
    lag = steps[:, None] - 1 - steps[None, :t]  # (T+1, T): state k (k = T: the chunk end) from input s
    toeplitz = _block_powers(rho, alpha, lag.clamp_min(0), m) * (lag >= 0)  # (G, m, m, T+1, T)
    w_in = toeplitz.transpose(2, 3).reshape(g * m * (t + 1), m, t)
    w_out = _block_powers(rho, alpha, steps[:t], m).transpose(1, 2).reshape(g * m, m, t)  # A^k
    # Static padding by 2T−1 zeros: N = ⌈L/T⌉ + 1 ≥ 2 chunks, with no length-dependent pad for export to trace.
    z = F.conv1d(F.pad(v, (0, 2 * t - 1)), w_in, stride=t, groups=g)
    z = z.reshape(b, g, m, t + 1, z.shape[-1])  # (B, G, m, T+1, N)
    entry = _direct_states(z[:, :, :, t].reshape(b, g * m, -1), rho, alpha, m, step=t)  # e_j: (B, G·m, N)
    within = z[:, :, :, :t].transpose(3, 4).reshape(b, g * m, -1)
    return within + F.conv_transpose1d(entry, w_out, stride=t, groups=g)


def modal_states(v: torch.Tensor, rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor,
                 use_fft: bool, chunk: int | None = 32) -> torch.Tensor:
    """States x_t = Σ_{j≥0} A^j v_{t−1−j} of the real modal A for inputs ``v`` (batch, n, length).

    ``use_fft`` picks an FFT convolution (training speed). Otherwise the kernel ρ^k R(kα) (and
    |λ|^k cos(kπ[λ<0]) for real modes) is built in-graph for the dynamic length: with ``chunk`` = T a
    two-level convolution over chunks of T steps (O(L·T + L²/T²) per state), with ``chunk=None`` one
    causal grouped ``conv1d`` with a full-length kernel (O(L²)).
    """
    q, length = rho.shape[0], v.shape[-1]
    lam_rho = lam.abs()
    lam_alpha = torch.where(lam < 0, torch.full_like(lam, math.pi), torch.zeros_like(lam))
    if use_fft:
        return _states_fft(v, rho, alpha, lam_rho, lam_alpha)
    kinds = [(v[:, : 2 * q], rho, alpha, 2), (v[:, 2 * q:], lam_rho, lam_alpha, 1)]
    parts = [_chunked_states(*kind, chunk) if chunk else _direct_states(*kind)
             for kind in kinds if kind[1].shape[0]]
    x = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
    if not chunk:
        return x
    # The first L steps, by index (a slice would make export guard on N·T versus L and fix the length),
    # gathered as rows of the time-major layout, which callers transpose back (adjacent transposes cancel).
    return x.transpose(1, 2).index_select(1, torch.arange(length, device=v.device)).transpose(1, 2)


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
               b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, use_fft: bool,
               chunk: int | None = 32) -> torch.Tensor:
    """y = C x + D u for the modal system, ``u`` (batch, length, h_in); ``chunk`` as in :func:`modal_states`."""
    v = (u @ b.T).transpose(1, 2)
    x = modal_states(v, rho, alpha, lam, use_fft, chunk).transpose(1, 2)
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
    """The stable layer of Schwerdtner et al. (Hankel singular value regularisation): A = diag(ρ_i R(α_i)),
    ρ = (1 + tanh a)/2 ∈ (0,1), α = π(1 + tanh b)/2 ∈ (0,π).

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

    Only real parameters and plain ops (exp, cos, sin, grouped (transposed) conv1d); cost scales with r = 2q + p. The
    states are a two-level convolution over chunks of ``chunk`` steps (O(L·T + L²/T²) per state, see
    :func:`modal_states`); ``chunk=None`` uses one full-length causal conv (O(L²)).
    """

    def __init__(self, rho: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor, b: torch.Tensor,
                 c: torch.Tensor, d: torch.Tensor, chunk: int | None = 32) -> None:
        super().__init__()
        self.chunk = chunk
        if b.shape[0] != 2 * rho.shape[0] + lam.shape[0]:
            raise ValueError(f"B has {b.shape[0]} rows for {rho.shape[0]} pairs and {lam.shape[0]} real modes")
        self.rho, self.alpha, self.lam = nn.Parameter(rho), nn.Parameter(alpha), nn.Parameter(lam)
        self.b, self.c, self.d = nn.Parameter(b), nn.Parameter(c), nn.Parameter(d)

    @property
    def order(self) -> int:
        return self.b.shape[0]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return _run_modal(u, self.rho, self.alpha, self.lam, self.b, self.c, self.d, use_fft=False,
                          chunk=self.chunk)

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

from . import mac_rules as _mac_rules  # noqa: E402,F401  (the layers' MAC rules, registered with the layers)
