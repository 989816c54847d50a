"""The two phases of every method that has them: one ``prepare``, then ``realise`` per budget, gives what
``compress`` gives at that budget, and ``realise`` never recomputes the budget-free statistics."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.smoke import digits_mlp, digits_subset
from minreal.compress.registry import compress, get_method, prepare, realise


def _resnet() -> nn.Module:
    from minreal.compress.models import CifarResNet

    torch.manual_seed(0)
    return CifarResNet(blocks_per_stage=1).eval()


def _resnet2() -> nn.Module:
    from minreal.compress.models import CifarResNet

    torch.manual_seed(0)
    return CifarResNet(blocks_per_stage=2).eval()


def _images() -> Dataset:
    from minreal.compress.datasets import digits32

    train, _ = digits32(seed=0)
    return train.take(16)


def _duplicated() -> nn.Module:
    from minreal.compress.methods.fde.smoke import duplicated_mlp

    return duplicated_mlp()


#: (method, model, data, budgets realised from one preparation, the statistics functions realise must not call:
#: names in the module that defines the method's ``prepare``, monkeypatched there with a counter).
CASES = [
    ("svd", digits_mlp, digits_subset, [{"mac_ratio": 0.9}, {"mac_ratio": 0.6}, {"layer_param_ratio": 0.5}],
     ["layer_svd", "svd_spectra"]),
    ("svd", _resnet, _images, [{"mac_ratio": 0.8}, {"mac_ratio": 0.6}], ["layer_svd"]),
    ("magnitude", digits_mlp, digits_subset, [{"param_ratio": 0.5}, {"mac_ratio": 0.7}, {"widths": (20, 10)}],
     ["magnitude_scores"]),
    ("magnitude", _resnet, _images, [{"mac_ratio": 0.7}, {"param_ratio": 0.6}], ["magnitude_group_scores"]),
    ("wanda", digits_mlp, digits_subset, [{"param_ratio": 0.5}, {"mac_ratio": 0.7}, {"widths": (20, 10)}],
     ["activation_norms"]),
    ("wanda", _resnet, _images, [{"mac_ratio": 0.7}, {"param_ratio": 0.6}], ["wanda_importance"]),
    ("fde", _resnet, _images, [{"merge_eps": 1.0}, {"merge_eps": 1.5}], ["graph_prepare"]),
    ("depth", _resnet2, _images, [{"mac_ratio": 0.9, "score_samples": 8, "criterion": "greedy"},
                                  {"mac_ratio": 0.6, "score_samples": 8, "criterion": "greedy"},
                                  {"param_ratio": 0.9, "score_samples": 8, "criterion": "greedy"}],
     ["energy_scores", "removal_scores", "greedy_order", "_costs"]),
]


def _count(monkeypatch: pytest.MonkeyPatch, method: str, name: str, calls: dict[str, int]) -> None:
    """Count the calls of ``name`` in the module that defines ``method``'s prepare function."""
    import importlib

    package = importlib.import_module(f"minreal.compress.methods.{method}")
    namespace = getattr(package, f"{method}_prepare").__globals__
    original = namespace[name]

    def counted(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    calls[name] = 0
    monkeypatch.setitem(namespace, name, counted)


@pytest.mark.parametrize("method, model_fn, data_fn, budgets, statistics", CASES,
                         ids=[f"{c[0]}-{c[1].__name__.strip('_')}" for c in CASES])
def test_realise_each_budget_from_one_preparation_is_compress(
        method: str, model_fn: Callable[[], nn.Module], data_fn: Callable[[], Dataset], budgets: list[dict],
        statistics: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = get_method(method)
    model, data = model_fn(), data_fn()
    configs = [spec.config_cls(**b) for b in budgets]
    calls: dict[str, int] = {}
    for target in statistics:
        _count(monkeypatch, method, target, calls)
    prepared = prepare(model, data, method, configs[0])
    after_prepare = dict(calls)
    assert all(n > 0 for n in after_prepare.values())
    realised = [realise(prepared, cfg) for cfg in configs]
    assert calls == after_prepare  # realise reads the prepared statistics, never recomputes them
    x = data.x[:8]
    for cfg, (two, two_report) in zip(configs, realised):
        one, one_report = compress(model, data, method, cfg)
        assert (two_report.mac_ratio, two_report.param_ratio) == (one_report.mac_ratio, one_report.param_ratio)
        assert two_report.mac_ratio < 1.0
        with torch.no_grad():  # the same computation twice (float32 tolerance: BLAS may reorder sums by threads)
            torch.testing.assert_close(two(x), one(x), rtol=1e-5, atol=1e-6)


def test_prepared_states_hold_plain_data_and_the_model_itself() -> None:
    """No module copies, functions or traced graphs in a prepared state: only tensors, arrays, numbers, strings,
    None, dataclasses and containers of them, and the original model."""
    import dataclasses

    import numpy as np

    def leaves(obj, model):
        if obj is model:
            return
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                yield from leaves(getattr(obj, f.name), model)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                yield from leaves(k, model)
                yield from leaves(v, model)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from leaves(v, model)
        else:
            yield obj

    plain = (torch.Tensor, np.ndarray, np.generic, int, float, str, bool, type(None), torch.dtype)
    for method, model_fn, data_fn, budgets, _ in CASES:
        model, data = model_fn(), data_fn()
        state = prepare(model, data, method, get_method(method).config_cls(**budgets[0])).state
        odd = [type(v).__name__ for v in leaves(state, model) if not isinstance(v, plain)]
        assert not odd, f"{method}: {odd}"
