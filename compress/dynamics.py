"""Regression data that ships offline: flow maps of small dynamical systems (scipy) and scikit-learn's diabetes.

A flow-map sample is ``(x(0), x(Δt))`` with ``x(0)`` uniform in the system's box, integrated with
``scipy.integrate.solve_ivp`` (all samples at once as one vectorised system, rtol 1e-8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.integrate import solve_ivp

from .core.data import Dataset

__all__ = ["System", "SYSTEMS", "REGRESSION_DATASETS", "flow_map", "diabetes", "regression_dataset"]

Rhs = Callable[[np.ndarray], np.ndarray]  # (d, N) states -> (d, N) derivatives


@dataclass(frozen=True)
class System:
    """An autonomous ODE ``dx/dt = rhs(x)`` with the box initial states are drawn from."""

    rhs: Rhs
    low: tuple[float, ...]
    high: tuple[float, ...]


def _reaction(x: np.ndarray) -> np.ndarray:
    """A + B ⇌ C (k1 = 2, k−1 = 0.5), C → D + B (k2 = 1): mass action, B catalytic."""
    a, b, c, _ = x
    f, r, k = 2.0 * a * b, 0.5 * c, 1.0 * c
    return np.stack([-f + r, -f + r + k, f - r - k, k])


def _rlc(x: np.ndarray) -> np.ndarray:
    """Two-section RLC ladder (L = 1, C = 0.5, R1 = 0.2, R2 = 0.3, load 2 Ω): states (i1, v1, i2, v2)."""
    i1, v1, i2, v2 = x
    return np.stack([-0.2 * i1 - v1, (i1 - i2) / 0.5, v1 - 0.3 * i2 - v2, (i2 - v2 / 2.0) / 0.5])


def _polymer(x: np.ndarray) -> np.ndarray:
    """Chain-growth polymerisation: monomer M, chains P1..P5 (initiation k_i = 0.5, propagation k_p = 2)."""
    m, p = x[0], x[1:]
    grow = 2.0 * m * p
    dp = np.empty_like(p)
    dp[0] = 0.5 * m - grow[0]
    dp[1:-1] = grow[:-2] - grow[1:-1]
    dp[-1] = grow[-2]
    return np.concatenate([(-0.5 * m - grow[:-1].sum(0))[None], dp])


def _glycolysis(x: np.ndarray) -> np.ndarray:
    """Sel'kov glycolytic oscillator (a = 0.08, b = 0.6): dx = −x + a y + x²y, dy = b − a y − x²y."""
    u, v = x
    return np.stack([-u + 0.08 * v + u * u * v, 0.6 - 0.08 * v - u * u * v])


SYSTEMS: dict[str, System] = {
    "reaction": System(_reaction, (0.0,) * 4, (1.0,) * 4),
    "rlc": System(_rlc, (-1.0,) * 4, (1.0,) * 4),
    "polymer": System(_polymer, (0.0,) * 6, (1.0,) + (0.3,) * 5),
    "glycolysis": System(_glycolysis, (0.0, 0.0), (2.5, 2.5)),
}
REGRESSION_DATASETS = (*SYSTEMS, "diabetes")


def flow_map(name: str, n: int = 3000, dt: float = 0.1, seed: int = 0, test_fraction: float = 0.25
             ) -> tuple[Dataset, Dataset]:
    """(train, test) pairs ``x(0) → x(Δt)`` of system ``name`` (float32)."""
    try:
        sys_ = SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; choose one of {', '.join(SYSTEMS)}") from None
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(sys_.low, sys_.high, size=(n, len(sys_.low)))
    d = x0.shape[1]
    sol = solve_ivp(lambda _t, y: sys_.rhs(y.reshape(d, n)).ravel(), (0.0, dt), x0.T.ravel(),
                    rtol=1e-8, atol=1e-10)
    x1 = sol.y[:, -1].reshape(d, n).T
    full = Dataset(torch.from_numpy(x0.astype(np.float32)), torch.from_numpy(x1.astype(np.float32)))
    return full.split(test_fraction, seed)


def diabetes(seed: int = 0, test_fraction: float = 0.25) -> tuple[Dataset, Dataset]:
    """scikit-learn's diabetes regression, features and target standardised: (train, test), float32."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    x = (d.data - d.data.mean(0)) / d.data.std(0)
    y = (d.target - d.target.mean()) / d.target.std()
    full = Dataset(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y[:, None].astype(np.float32)))
    return full.split(test_fraction, seed)


def regression_dataset(name: str, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Any of :data:`REGRESSION_DATASETS` by name."""
    return diabetes(seed) if name == "diabetes" else flow_map(name, seed=seed)
