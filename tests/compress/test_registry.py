"""The registry: built-ins found by package, third-party methods through the ``minreal.methods`` entry points,
duplicate names refused, and ``compress()`` filling the shared cost fields for any method."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import minreal.compress.registry as registry
from minreal.compress import MethodSpec, compress, get_method, method_names, register
from minreal.compress.core.data import Dataset
from minreal.compress.models import mlp

THROWAWAY = '''
from dataclasses import dataclass, field

from minreal.compress.core.errors import CompressionError
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.spec import MethodSpec


@dataclass
class ThrowawayConfig:
    scale: float = field(default=1.0, metadata={"help": "Output scale, > 0; default 1."})

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise CompressionError(f"--scale must be > 0, got {self.scale}")


def run(model, data, config):
    import copy
    new = copy.deepcopy(model)
    return new, CompressionReport("throwaway", {"scale": config.scale})


SPEC = MethodSpec("throwaway", "does nothing (registry test)", ThrowawayConfig, run)
'''


class _EntryPoint:
    """The part of importlib.metadata.EntryPoint the registry uses."""

    def __init__(self, name: str, value: str, target: object = None, error: Exception | None = None) -> None:
        self.name, self.value, self._target, self._error = name, value, target, error

    def load(self) -> object:
        if self._error is not None:
            raise self._error
        return self._target


@pytest.fixture
def throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A method package outside the repository, importable as ``minreal_throwaway`` for this test only."""
    pkg = tmp_path / "minreal_throwaway"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(THROWAWAY)
    spec = importlib.util.spec_from_file_location("minreal_throwaway", pkg / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "minreal_throwaway", module)
    spec.loader.exec_module(module)
    return module


def _fresh_registry(monkeypatch: pytest.MonkeyPatch, eps: list[_EntryPoint]) -> None:
    def fake_entry_points(*, group: str) -> list[_EntryPoint]:
        assert group == registry.ENTRY_POINT_GROUP
        return eps

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_REGISTRY", registry.MethodRegistry())


def _data() -> Dataset:
    g = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(32, 6, generator=g))


def test_builtins_each_export_one_spec() -> None:
    names = method_names()
    assert {"svd", "factorize", "cbalanced", "ssm", "fde", "magnitude", "wanda"} <= set(names)
    for name in names:
        spec = get_method(name)
        assert isinstance(spec, MethodSpec) and spec.name == name and spec.fn is spec.run


def test_entry_point_method_is_registered_and_runs(throwaway, monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_registry(monkeypatch, [_EntryPoint("throwaway", "minreal_throwaway:SPEC", throwaway.SPEC)])
    assert "throwaway" in method_names() and "svd" in method_names()
    torch.manual_seed(0)
    model = mlp(6, [8], 3).eval()
    new, report = compress(model, _data(), "throwaway")
    assert report.method == "throwaway"
    assert report.params_before == report.params_after == sum(p.numel() for p in model.parameters())
    assert report.macs_before == report.macs_after > 0
    assert report.measured["relative_output_error"] == 0.0


def test_broken_entry_point_warns_in_one_line(throwaway, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    _fresh_registry(monkeypatch, [_EntryPoint("broken", "nowhere:SPEC", error=ImportError("no module nowhere")),
                                  _EntryPoint("not-a-spec", "minreal_throwaway:run", throwaway.run),
                                  _EntryPoint("throwaway", "minreal_throwaway", throwaway)])
    with caplog.at_level(logging.WARNING, logger="minreal.compress.registry"):
        names = method_names()
    assert "throwaway" in names and "broken" not in names
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert "'broken'" in lines[0] and "no module nowhere" in lines[0]
    assert "'not-a-spec'" in lines[1] and "not a MethodSpec" in lines[1]


def test_duplicate_name_raises_for_a_run_time_registration(throwaway, monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_registry(monkeypatch, [_EntryPoint("throwaway", "minreal_throwaway:SPEC", throwaway.SPEC)])
    with pytest.raises(ValueError, match="'svd' is already registered"):
        register(MethodSpec("svd", "a second svd", throwaway.ThrowawayConfig, throwaway.run))


def test_duplicate_builtin_raises_and_leaves_no_partial_registry(throwaway, monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_registry(monkeypatch, [])
    builtins = registry._builtin_specs()
    monkeypatch.setattr(registry, "_builtin_specs", lambda: builtins + [builtins[0]])
    for _ in range(2):  # the second call fails the same way instead of returning a partial registry
        with pytest.raises(ValueError, match=f"{builtins[0].name!r} is already registered"):
            method_names()


def test_duplicate_entry_points_are_skipped_with_one_warning_line(throwaway, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    svd_again = MethodSpec("svd", "a second svd", throwaway.ThrowawayConfig, throwaway.run)
    _fresh_registry(monkeypatch, [_EntryPoint("my-svd", "minreal_throwaway:SVD", svd_again),
                                  _EntryPoint("a", "minreal_throwaway:SPEC", throwaway.SPEC),
                                  _EntryPoint("b", "minreal_throwaway:SPEC", throwaway.SPEC)])
    with caplog.at_level(logging.WARNING, logger="minreal.compress.registry"):
        names = method_names()
    assert "throwaway" in names and get_method("svd") is not svd_again
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert "'my-svd'" in lines[0] and "'svd' is already registered" in lines[0]
    assert "'b'" in lines[1] and "'throwaway' is already registered" in lines[1]


def test_entry_point_declaring_a_shared_field_apart_is_skipped(throwaway, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from dataclasses import field, make_dataclass

    clashing = make_dataclass("ClashConfig", [("seed", int, field(default=1, metadata={"help": "Seed."}))])
    spec = MethodSpec("clash", "declares --seed apart (not from SeedOption)", clashing, throwaway.run)
    _fresh_registry(monkeypatch, [_EntryPoint("clash", "minreal_throwaway:CLASH", spec)])
    with caplog.at_level(logging.WARNING, logger="minreal.compress.registry"):
        names = method_names()
    assert "clash" not in names and "svd" in names
    [line] = [r.getMessage() for r in caplog.records]
    assert "'clash'" in line and "'seed' (--seed)" in line and "\n" not in line
    with pytest.raises(ValueError, match="'seed'"):
        register(spec)


def test_no_two_builtin_methods_declare_a_field_apart() -> None:
    from minreal.compress.core.options import field_clash

    configs = {spec.name: spec.config_cls for spec in registry._builtin_specs()}
    assert len(configs) >= 7
    for name, cls in configs.items():
        others = {n: c for n, c in configs.items() if n != name}
        assert field_clash(others, name, cls) is None


def test_config_validates_itself_and_compress_revalidates(throwaway, monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.compress.core.errors import CompressionError

    _fresh_registry(monkeypatch, [_EntryPoint("throwaway", "minreal_throwaway:SPEC", throwaway.SPEC)])
    with pytest.raises(CompressionError, match="--scale"):
        throwaway.ThrowawayConfig(scale=0.0)
    cfg = throwaway.ThrowawayConfig()
    cfg.scale = -1.0
    with pytest.raises(CompressionError, match="--scale"):
        compress(nn.Linear(6, 3), _data(), "throwaway", cfg)


def test_low_rank_methods_carry_provider_defaults() -> None:
    for name in ("svd", "factorize"):
        defaults = get_method(name).provider_defaults
        assert defaults(("cpu",)) == {"rank_multiple": 16}
        assert defaults(("cuda",)) == {"rank_multiple": 8}
        assert defaults(("cpu", "cuda")) == {"rank_multiple": 16}
        assert defaults(("rocm",)) == {}
    assert get_method("fde").provider_defaults(("cpu",)) == {}


def test_no_method_imports_another() -> None:
    import ast

    root = Path(registry.__file__).parent / "methods"
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    for path in root.rglob("*.py"):
        own = path.relative_to(root).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = (node.module or "").split(".")
                if node.level == 2 and target[0] in packages - {own}:
                    raise AssertionError(f"{path}: imports method {target[0]}")
                if node.module and node.module.startswith("minreal.compress.methods."):
                    assert node.module.split(".")[2] == own, f"{path}: imports {node.module}"


def test_chain_report_keeps_each_steps_budget(tiny_mlp: nn.Module, mlp_data: Dataset) -> None:
    from minreal.compress.methods.fde import FDEConfig
    from minreal.compress.methods.svd import SVDConfig
    from minreal.compress.registry import compress_chain

    _, report = compress_chain(tiny_mlp, mlp_data, [("fde", FDEConfig(merge_eps=0.01)),
                                                    ("svd", SVDConfig(param_ratio=0.8))])
    steps = report.predicted["steps"]
    assert steps[0]["budget"] is None and steps[1]["budget"]["kind"] == "param_ratio"
    assert report.predicted["budget"] == {**steps[1]["budget"], "step": "svd"}


#: Two-phase methods and a config field their preparation reads (changing it must be refused by realise).
PREPARED_FIELDS = {"factorize": ("eig_threshold", 1e-3), "svd": ("exclude", ("1",)), "magnitude": ("seed", 1),
                   "wanda": ("norm_samples", 100), "fde": ("max_sweeps", 3), "depth": ("criterion", "greedy")}
#: Fields a method's smoke config sets that a whole-model budget excludes.
BUDGET_EXCLUDES = {"fde": {"merge_eps": 0.0}}


def test_every_two_phase_method_is_checked() -> None:
    assert {n for n in method_names() if get_method(n).two_phase} == set(PREPARED_FIELDS)


@pytest.mark.parametrize("method", sorted(PREPARED_FIELDS))
def test_prepare_once_then_realise_each_budget_is_compress(method: str) -> None:
    """Two phases give what ``compress`` gives, budget by budget, from one preparation; a config that
    differs in a field the preparation read is refused."""
    import dataclasses

    import torch

    from minreal.compress.registry import compress, prepare, realise

    spec = get_method(method)
    case = spec.smoke_case()
    budgets = [dataclasses.replace(case.config, mac_ratio=r, **BUDGET_EXCLUDES.get(method, {})) for r in (0.9, 0.6)]
    prepared = prepare(case.model, case.data, method, budgets[0])
    x = case.data.x[:16]
    for cfg in budgets:
        two, two_report = realise(prepared, cfg)
        one, one_report = compress(case.model, case.data, method, cfg)
        assert two_report.mac_ratio == one_report.mac_ratio < 1.0
        with torch.no_grad():  # the same computation twice (float32 tolerance: BLAS may reorder sums by threads)
            torch.testing.assert_close(two(x), one(x), rtol=1e-5, atol=1e-6)
    other, value = PREPARED_FIELDS[method]
    with pytest.raises(ValueError, match=f"differs from the prepared one in {other}"):
        realise(prepared, dataclasses.replace(budgets[0], **{other: value}))


def test_a_missed_budget_is_stated_with_the_rules_share() -> None:
    from minreal.compress.core.report import CompressionReport

    # rules cut 1000 -> 500 MACs (0.500) while 1000 MACs outside them stay: 1500 / 2000 = 0.75 was reached
    report = CompressionReport("m", {}, macs_before=2000, macs_after=1500, rule_macs_before=1000, rule_macs_after=500,
                               not_covered_by_rules=["attn.matmul"])
    assert registry.budget_shortfall(report, "mac_ratio", 0.5, report.mac_ratio) == (
        "budget missed: `mac_ratio` 0.5 was asked, 0.750 was reached: the method budgets the MACs of its per-layer "
        "rules, which reached 0.500; MACs no rule covers (e.g. attn.matmul) stay")
    assert registry.budget_shortfall(report, "mac_ratio", 0.5, 0.5 + registry.BUDGET_SLACK) is None  # within slack
    assert registry.budget_shortfall(report, "param_ratio", 0.5, 0.75) == (
        "budget missed: `param_ratio` 0.5 was asked, 0.750 was reached")
    assert registry.budget_shortfall(report, "latency_ratio", 0.5, 0.75) is None  # measured by the method itself


def test_an_overshot_budget_is_stated_in_the_report(tiny_mlp: nn.Module, mlp_data: Dataset,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.compress.core.report import CompressionReport
    from minreal.compress.methods.svd import SVDConfig

    report = CompressionReport("wanda", {})
    assert registry.budget_overshoot(report, "mac_ratio", 0.7, 0.535) == (
        "budget overshot: `mac_ratio` 0.7 was asked, 0.535 was reached: wanda's steps are coarser than the budget "
        "here (more was cut than asked); check the accuracy, or ask for a larger `mac_ratio`")
    assert registry.budget_overshoot(report, "mac_ratio", 0.7, 0.7 - registry.OVERSHOOT) is None  # at the limit
    assert registry.budget_overshoot(report, "mac_ratio", 0.7, 0.72) is None  # above: budget_shortfall's business
    assert registry.budget_overshoot(report, "latency_ratio", 0.7, 0.3) is None  # measured by the method itself
    # through compress: a method that cut more than asked gets the note and the field, with the reached ratio
    monkeypatch.setattr(registry, "OVERSHOOT", -1.0)  # any result counts as overshot: the wiring is what is tested
    _, rep = compress(tiny_mlp, mlp_data, "svd", SVDConfig(mac_ratio=0.6))
    assert rep.predicted.budget_overshot == registry.budget_overshoot(rep, "mac_ratio", 0.6, rep.mac_ratio)
    assert rep.predicted.budget_overshot in rep.notes and f"{rep.mac_ratio:.3f} was reached" in rep.notes[-1]
