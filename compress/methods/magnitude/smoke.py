"""The tiny case the checks shared by every method run magnitude on."""

from __future__ import annotations

from ...core.smoke import SmokeCase, digits_mlp, digits_subset


def smoke_case() -> SmokeCase:
    """Seeded digits MLP, 240 digits, half the parameters kept (the config's default)."""
    from . import MagnitudeConfig

    return SmokeCase(digits_mlp(), digits_subset(), MagnitudeConfig())
