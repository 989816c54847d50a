"""Discrete LTI systems x_{k+1} = A x_k + B u_k, y_k = C x_k + D u_k as plain tensors (float64 maths)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StateSpace", "simulate", "impulse_response", "change_basis", "random_stable_system"]


@dataclass(frozen=True)
class StateSpace:
    """A MIMO discrete system: ``a`` (n, n), ``b`` (n, m), ``c`` (p, n), ``d`` (p, m) or diagonal (p,)."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor

    @property
    def order(self) -> int:
        return self.a.shape[0]

    def double(self) -> "StateSpace":
        return StateSpace(self.a.double(), self.b.double(), self.c.double(), self.d.double())

    def feedthrough(self, u: torch.Tensor) -> torch.Tensor:
        """D u for ``u`` (..., m), with ``d`` a matrix or a diagonal."""
        return u * self.d if self.d.dim() == 1 else u @ self.d.T


def simulate(sys: StateSpace, u: torch.Tensor) -> torch.Tensor:
    """The step-by-step recurrence from zero state; ``u`` (batch, length, m) -> y (batch, length, p).

    The reference every fast form is checked against (one Python step per time step).
    """
    x = u.new_zeros(u.shape[0], sys.order)
    ys = []
    for k in range(u.shape[1]):
        ys.append(x @ sys.c.T + sys.feedthrough(u[:, k]))
        x = x @ sys.a.T + u[:, k] @ sys.b.T
    return torch.stack(ys, 1) if ys else u.new_zeros(u.shape[0], 0, sys.c.shape[0])


def impulse_response(sys: StateSpace, length: int) -> torch.Tensor:
    """Markov parameters h_0 = D, h_k = C A^{k-1} B (k ≥ 1): tensor (length, p, m); basis-free."""
    d = torch.diag(sys.d) if sys.d.dim() == 1 else sys.d
    out, g = [d], sys.b
    for _ in range(1, length):
        out.append(sys.c @ g)
        g = sys.a @ g
    return torch.stack(out[:length])


def change_basis(sys: StateSpace, t: torch.Tensor) -> StateSpace:
    """The same system in state coordinates x = T z: (T⁻¹AT, T⁻¹B, CT, D)."""
    t_inv_a = torch.linalg.solve(t, sys.a)
    return StateSpace(t_inv_a @ t, torch.linalg.solve(t, sys.b), sys.c @ t, sys.d)


def random_stable_system(n: int, m: int, p: int, radius: float = 0.95,
                         generator: torch.Generator | None = None) -> StateSpace:
    """A random dense stable system (float64): A = radius · M / ρ(M) for a Gaussian M."""
    g = generator
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    a = radius * a / torch.linalg.eigvals(a).abs().max()
    return StateSpace(a, torch.randn(n, m, generator=g, dtype=torch.float64),
                      torch.randn(p, n, generator=g, dtype=torch.float64),
                      torch.randn(p, m, generator=g, dtype=torch.float64))
