"""Library errors about config fields name the field as the Python API spells it (never a command-line flag) and
list it in ``CompressionError.fields`` (the CLI puts its flags in their place: tests/app/test_method_options.py)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable

import pytest
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.methods.depth import DepthConfig
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.compress.methods.fde import FDEConfig
from minreal.compress.methods.magnitude import MagnitudeConfig
from minreal.compress.methods.svd import SVDConfig


@pytest.mark.parametrize("make, start, fields", [
    (lambda: DepthConfig(score_samples=4), "`DepthConfig.score_samples` must be >= 8, got 4", ("score_samples",)),
    (lambda: DepthConfig(criterion="nope"), "`DepthConfig.criterion` must be one of", ("criterion",)),
    (lambda: FactorizeConfig(mac_ratio=1.5), "`FactorizeConfig.mac_ratio` must lie in (0, 1], got 1.5",
     ("mac_ratio",)),
    (lambda: FactorizeConfig(mac_ratio=0.5, param_ratio=0.5), "give only one of `mac_ratio`, `param_ratio`",
     ("mac_ratio", "param_ratio")),
    (lambda: SVDConfig(mac_ratio=0.5, layer_mac_ratio=0.5), "give only one of `mac_ratio` and `layer_mac_ratio`",
     ("mac_ratio", "layer_mac_ratio")),
    (lambda: SVDConfig(layer_mac_ratio=0.5, layer_param_ratio=0.5),
     "give only one of `layer_mac_ratio`, `layer_param_ratio`", ("layer_mac_ratio", "layer_param_ratio")),
    (lambda: SVDConfig(rank_multiple=0), "`rank_multiple` must be >= 1, got 0", ("rank_multiple",)),
    (lambda: FDEConfig(param_ratio=0.5, merge_eps=0.1), "give `merge_eps` or `param_ratio`, not both",
     ("merge_eps", "param_ratio")),
    (lambda: MagnitudeConfig(width_multiple=0), "`MagnitudeConfig.width_multiple` must be >= 1, got 0",
     ("width_multiple",)),
    (lambda: RecoveryConfig(epochs=1, batch_size=0), "`RecoveryConfig.batch_size` must be >= 1, got 0",
     ("batch_size",)),
])
def test_config_errors_name_the_field_not_the_flag(make: Callable[[], object], start: str,
                                                   fields: tuple[str, ...]) -> None:
    with pytest.raises(CompressionError) as info:
        make()
    message = str(info.value)
    assert message.startswith(start) and "--" not in message, message
    assert info.value.fields == fields


def test_a_latency_budget_without_a_table_names_the_fields_and_the_table_command_in_backticks() -> None:
    with pytest.raises(CompressionError) as info:
        MagnitudeConfig(latency_ratio=0.5)
    message = str(info.value)
    assert message.startswith("`latency_ratio` needs `latency_table`") and "`--kind width` for magnitude" in message
    assert "--" not in re.sub(r"`[^`]*`", "", message), message  # flags only inside the command to run
    assert info.value.fields == ("latency_ratio", "latency_table")


def test_a_refusal_while_compressing_names_the_field(tiny_cnn: nn.Module, image_data: Dataset) -> None:
    with pytest.raises(CompressionError, match=r"^`widths` sets the hidden widths of an MLP; for other models give "
                                               r"`param_ratio` or `mac_ratio`$") as info:
        compress(tiny_cnn, image_data, "magnitude", MagnitudeConfig(widths=(4,)))
    assert info.value.fields == ("widths", "param_ratio", "mac_ratio")


def test_fields_survive_pickling() -> None:
    """Tune's worker processes send a method's refusal back pickled; the fields travel with it."""
    exc = pickle.loads(pickle.dumps(CompressionError("`mac_ratio` too small", fields=("mac_ratio",))))
    assert str(exc) == "`mac_ratio` too small" and exc.fields == ("mac_ratio",)
    assert CompressionError("a plain sentence").fields == ()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_require_finite_refuses_any_nan_or_infinity_and_names_the_layer(bad: float) -> None:
    import torch

    from minreal.compress.core.errors import require_finite

    for values in ([1.0, bad, 2.0], [bad] * 3, [bad, -bad]):  # inf and -inf together: a NaN sum
        with pytest.raises(CompressionError, match="layer 'fc1': input activations contain NaN/inf"):
            require_finite(torch.tensor(values), "fc1", "input activations")


def test_require_finite_passes_finite_values_whose_sum_overflows() -> None:
    import torch

    from minreal.compress.core.errors import require_finite

    big = torch.full((4, 3), 3e38, dtype=torch.float32)
    assert not bool(big.sum().isfinite())  # the quick test cannot decide: the elementwise one must
    require_finite(big, "fc1", "input activations")
    require_finite(torch.randn(2, 3, 5), "fc1", "input activations")
