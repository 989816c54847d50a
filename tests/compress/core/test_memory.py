"""What a compress keeps alive: the replaced layers are never copied, factors are built one layer at a time, and
the one-shot ``compress`` frees the method's prepared state before measuring (issue 44's memory goal)."""

from __future__ import annotations

import copy
import gc
import platform
import sys
import weakref

import pytest
import torch
from torch import nn

import minreal.compress.methods.factorize.method as factorize_method
from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, find_targets
from minreal.compress.core.memory import release_freed_memory
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.surgery import replace_modules
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases


class _Uncopyable(nn.Linear):
    """A layer that fails if anything deep-copies it."""

    def __deepcopy__(self, memo: dict) -> nn.Module:
        raise AssertionError("a replaced layer was deep-copied")


def _net() -> nn.Sequential:
    torch.manual_seed(3)
    shared = nn.Linear(8, 8)
    return nn.Sequential(_Uncopyable(6, 8), nn.ReLU(), shared, nn.Tanh(), shared, nn.Linear(8, 3)).eval()


def test_replace_modules_never_copies_what_it_replaces() -> None:
    model = _net()
    new_first = nn.Linear(6, 8)
    out = replace_modules(model, {"0": new_first})
    assert out[0] is new_first and model[0] is not new_first and isinstance(model[0], _Uncopyable)
    assert out[5] is not model[5] and torch.equal(out[5].weight, model[5].weight)
    assert out[5].weight.data_ptr() != model[5].weight.data_ptr()  # the kept layers are copies, as before
    with pytest.raises(AssertionError):
        copy.deepcopy(model)  # the guard itself works


def test_a_shared_module_is_replaced_everywhere_it_is_used() -> None:
    model = _net()
    model[0] = nn.Linear(6, 8)
    new = nn.Linear(8, 8)
    out = replace_modules(model, {"2": new})
    assert out[2] is new and out[4] is new  # one module used twice stays one module, now the replacement
    assert model[2] is model[4] and model[2] is not new


def test_factors_given_one_at_a_time_build_the_same_model() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 6)).double().eval()
    data = Dataset(torch.randn(40, 12, dtype=torch.float64))
    targets, _, _ = find_targets(model, data.x[:4])
    bases = layer_bases(model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    ranks = {t.name: matrix_view(t.layer).max_rank // 2 for t in targets}
    lazy = factorize_method._factors(targets, bases, ranks)
    assert not isinstance(lazy, dict)  # a generator: one layer's float64 factors alive at a time
    a = apply_factors(model, targets, lazy)
    b = apply_factors(model, targets, dict(factorize_method._factors(targets, bases, ranks)))
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)


def test_one_shot_compress_frees_the_prepared_bases(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = sys.modules["minreal.compress.registry"]
    refs: list[weakref.ref] = []
    alive_when_measured: list[int] = []
    real_bases, real_compare = factorize_method.layer_bases, registry.compare_outputs

    def bases_spy(*args, **kwargs):
        out = real_bases(*args, **kwargs)
        refs.extend(weakref.ref(b.basis) for b in out.values())
        return out

    def compare_spy(*args, **kwargs):
        gc.collect()
        alive_when_measured.append(sum(r() is not None for r in refs))
        return real_compare(*args, **kwargs)

    monkeypatch.setattr(factorize_method, "layer_bases", bases_spy)
    monkeypatch.setattr(registry, "compare_outputs", compare_spy)
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    compress(model, Dataset(torch.randn(64, 16)), "factorize", FactorizeConfig(mac_ratio=0.6))
    assert refs and alive_when_measured == [0]  # bases were made, and none outlived the realisation


def test_release_freed_memory_runs_where_glibc_is() -> None:
    ran = release_freed_memory()
    assert isinstance(ran, bool)
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert ran
