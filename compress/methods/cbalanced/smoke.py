"""The tiny case the checks shared by every method run cbalanced on."""

from __future__ import annotations

from ...core.smoke import SmokeCase, digits_mlp, digits_subset


def smoke_case() -> SmokeCase:
    """Seeded digits MLP on 240 digits; 1% energy left out, warm start, no controls."""
    from .config import CBalancedConfig

    config = CBalancedConfig(energy_eps=1e-2, controls=False, gramian_samples=200, go_samples=100)
    return SmokeCase(digits_mlp(), digits_subset(), config)
