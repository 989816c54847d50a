"""The tiny case the checks shared by every method run svd on."""

from __future__ import annotations

from ...core.smoke import SmokeCase, digits_mlp, digits_subset


def smoke_case() -> SmokeCase:
    """Seeded digits MLP, 240 digits, half the factorisable layers' MACs (the config's default budget)."""
    from .config import SVDConfig

    return SmokeCase(digits_mlp(), digits_subset(), SVDConfig())
