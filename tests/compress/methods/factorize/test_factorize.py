"""factorize: layer reproduction at full rank, predicted = measured distortion, beats SVD, caching, ONNX parity,
statistics from the output side equal to those from the input moments."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import minreal.compress.methods.factorize.method as factorize_method
from minreal.compress import compress, method_names
from minreal.compress.core import stats
from minreal.compress.core.attention import PlainAttention
from minreal.compress.core.costs import count_macs_torch
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, find_targets
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases
from minreal.compress.methods.factorize.method import _factors, statistics_side
from minreal.compress.methods.svd import SVDConfig
from minreal.compress.models import mlp, small_cnn


def _conv_net() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 24, (3, 1), stride=(1, 2), padding=(2, 0), dilation=(2, 1)), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 4),
    ).eval()


def _seq_net() -> nn.Module:
    torch.manual_seed(8)
    return nn.Sequential(nn.Conv1d(3, 12, 5, stride=2, padding=2, groups=3), nn.ReLU(),
                         nn.Conv1d(12, 16, 3, padding=1), nn.Flatten(), nn.Linear(16 * 8, 6)).eval()


def _inputs(model: nn.Module, n: int = 24) -> Dataset:
    shape = (3, 16) if isinstance(model[0], nn.Conv1d) else (3, 10, 10)
    return Dataset(torch.randn(n, *shape, generator=torch.Generator().manual_seed(9)))


def _layer_io(model: nn.Module, name: str, data: Dataset) -> torch.Tensor:
    seen = []
    h = model.get_submodule(name).register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.no_grad():
        model(data.x)
    h.remove()
    return seen[0]


def test_registered() -> None:
    assert "factorize" in method_names()


@pytest.mark.parametrize("make", [_conv_net, _seq_net])
def test_full_rank_reproduces_every_layer(make) -> None:
    model = make().double()
    data = Dataset(_inputs(model).x.double())
    targets, _, _ = find_targets(model, data.x[:4])
    cfg = FactorizeConfig(stats_dtype="float64")
    bases = layer_bases(model, data, targets, cfg, CompressionReport("factorize", {}))
    full = {t.name: matrix_view(t.layer).max_rank for t in targets}
    new = apply_factors(model, targets, _factors(targets, bases, full))
    with torch.no_grad():
        for t in targets:
            x = _layer_io(model, t.name, data)
            torch.testing.assert_close(new.get_submodule(t.name)(x), t.layer(x), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(new(data.x), model(data.x), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("make,kinds", [(_conv_net, {"Linear", "Conv2d", "grouped"}), (_seq_net, {"Conv1d"})])
def test_predicted_distortion_equals_measured_on_calibration_data(make, kinds: set[str]) -> None:
    model = make().double()
    data = Dataset(_inputs(model).x.double())
    new, report = compress(model, data, "factorize", FactorizeConfig(layer_mac_ratio=0.45, stats_dtype="float64"))
    factorised = [lr for lr in report.layers if lr.action == "factorized"]
    grouped = {"grouped"} if any(getattr(model.get_submodule(lr.name), "groups", 1) > 1 for lr in factorised) else set()
    assert kinds <= {lr.kind for lr in factorised} | grouped
    with torch.no_grad():
        for lr in factorised:
            x = _layer_io(model, lr.name, data)
            y, y_hat = model.get_submodule(lr.name)(x), new.get_submodule(lr.name)(x)
            rows = y.numel() // (y.shape[1] if y.dim() > 2 else y.shape[-1])
            measured = float(((y - y_hat) ** 2).sum()) / rows
            assert measured == pytest.approx(lr.details["predicted_distortion"], rel=1e-8, abs=1e-12)
            assert lr.details["predicted_distortion"] > 0


def test_duplicated_input_channels_stay_finite_and_exact() -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 36, 5)).double()
    x = torch.randn(20, 3, 6, 6, dtype=torch.float64)
    data = Dataset(torch.cat([x, x], 1))  # channels 3..5 duplicate 0..2: singular second moment
    new, report = compress(model, data, "factorize", FactorizeConfig(rank_fraction=0.6, stats_dtype="float64"))
    out = new(data.x)
    assert torch.isfinite(out).all()
    conv = [lr for lr in report.layers if lr.name == "0"][0]
    assert conv.action == "factorized"
    xin = _layer_io(model, "0", data)
    with torch.no_grad():
        measured = float(((model[0](xin) - new[0](xin)) ** 2).sum()) / (20 * 36)
    assert measured == pytest.approx(conv.details["predicted_distortion"], rel=1e-8, abs=1e-12)


def test_report_lists_skips_and_predicted_next_to_measured(grouped_cnn, image_data) -> None:
    new, report = compress(grouped_cnn, image_data, "factorize", FactorizeConfig(layer_mac_ratio=0.6))
    skipped = {lr.name: lr.reason for lr in report.layers if lr.action == "skipped"}
    assert "depthwise" in skipped["5"]
    assert report.predicted["factorizable_mac_ratio"] <= 0.6 + 1e-9
    assert {"statistics", "decompose"} <= set(report.timings_s)
    assert 0 <= report.measured["relative_output_error"] < 1
    assert new(image_data.x).shape == grouped_cnn(image_data.x).shape


def test_cache_hit_gives_the_same_model_without_statistics(tmp_path, tiny_cnn, image_data) -> None:
    cfg = FactorizeConfig(layer_mac_ratio=0.5, cache_dir=str(tmp_path))
    first, r1 = compress(tiny_cnn, image_data, "factorize", cfg)
    again, r2 = compress(tiny_cnn, image_data, "factorize", replace(cfg, layer_mac_ratio=0.7))
    assert r1.predicted["cache_hits"] == 0 and r2.predicted["cache_hits"] == 4
    same, r3 = compress(tiny_cnn, image_data, "factorize", cfg)
    with torch.no_grad():
        torch.testing.assert_close(same(image_data.x), first(image_data.x), atol=0, rtol=0)
    other = Dataset(image_data.x + 1.0)
    _, r4 = compress(tiny_cnn, other, "factorize", cfg)
    assert r4.predicted["cache_hits"] == 0  # different data, different key
    assert r2.predicted["factorizable_mac_ratio"] > r1.predicted["factorizable_mac_ratio"]


@pytest.fixture(scope="module")
def trained_digits():
    train_set, test_set = digits()
    torch.manual_seed(0)
    cnn, net = small_cnn(), mlp(64, [128, 64], 10)
    for m in (cnn, net):
        train(m, train_set, test_set, TrainConfig(epochs=5))
    return {"cnn": cnn, "mlp": net}, train_set, test_set


@pytest.mark.parametrize("name", ["cnn", "mlp"])
@pytest.mark.parametrize("flops", [0.7, 0.5])
def test_beats_plain_svd_at_the_same_budget(trained_digits, name: str, flops: float) -> None:
    models, train_set, test_set = trained_digits
    fac, rf = compress(models[name], train_set, "factorize", FactorizeConfig(layer_mac_ratio=flops))
    _, rs = compress(models[name], train_set, "svd", SVDConfig(layer_mac_ratio=flops))
    assert rf.predicted["factorizable_mac_ratio"] <= flops + 1e-9
    assert rs.predicted["factorizable_mac_ratio"] <= flops + 1e-9
    assert rf.measured["relative_output_error"] < rs.measured["relative_output_error"]


TORCHVISION = [
    pytest.param("resnet18", 64, 8, id="resnet18"),
    pytest.param("mobilenet_v2", 64, 8, id="mobilenet_v2"),
    pytest.param("resnext50_32x4d", 64, 4, id="resnext50_32x4d", marks=pytest.mark.slow),
    pytest.param("vit_b_16", 224, 2, id="vit_b_16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("arch,size,calib", TORCHVISION)
def test_torchvision_models_export_and_pass_ort_parity(tmp_path, arch: str, size: int, calib: int) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None).eval()
    data = Dataset(torch.randn(calib, 3, size, size))  # random weights and inputs: parity, not accuracy
    new, report = compress(model, data, "factorize", FactorizeConfig(layer_mac_ratio=0.5, stats_dtype="float32"))
    assert report.predicted["factorizable_mac_ratio"] <= 0.5 + 1e-9
    assert any(lr.action == "factorized" for lr in report.layers)
    skipped = {lr.name: lr.reason for lr in report.layers if lr.action == "skipped"}
    if arch == "vit_b_16":  # attention unfused: its projections are targets like any Linear
        attention = {lr.name for lr in report.layers if lr.details.get("attention")}
        assert attention == {f"encoder.layers.encoder_layer_{i}.self_attention.{p}" for i in range(12)
                             for p in PlainAttention.PROJECTIONS}
    if arch == "mobilenet_v2":
        assert any("depthwise" in r for r in skipped.values())
    assert all(type(m).__module__.startswith(("torch.nn", "torchvision")) or type(m) is PlainAttention
               for m in new.modules())
    path = tmp_path / f"{arch}.onnx"
    _export_torchscript(new, data.x[:2], path)
    _assert_ort_parity(new, path, [data.x[:1], data.x[:3]], rtol=1e-3, atol=1e-4)


def _export_torchscript(model: nn.Module, example: torch.Tensor, path) -> None:
    # The TorchScript exporter: export.to_onnx tries dynamo first, which takes ~30 s per model here.
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def _assert_ort_parity(model: nn.Module, path, inputs: list[torch.Tensor], rtol: float, atol: float) -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for x in inputs:
            got = sess.run(None, {"input": x.numpy()})[0]
            np.testing.assert_allclose(got, model(x).numpy(), rtol=rtol, atol=atol)


# ---- statistics from the output side (o < d): the same bases, ranks and model as from the input moments ----------

def _vol_net() -> nn.Module:
    torch.manual_seed(10)
    return nn.Sequential(nn.Conv3d(2, 6, 3, stride=(1, 2, 2), padding=1, dilation=(2, 1, 1), bias=False), nn.ReLU(),
                         nn.Conv3d(6, 8, 1), nn.Flatten(), nn.Linear(8 * 4 * 3 * 3, 5, bias=False)).eval()


def _float64_case(make) -> tuple[nn.Module, Dataset]:
    model = make().double()
    if make is _vol_net:
        return model, Dataset(torch.randn(20, 2, 6, 6, 6, generator=torch.Generator().manual_seed(9)).double())
    return model, Dataset(_inputs(model).x.double())


def _input_side_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer's statistic from its input moment, as before the output side existed."""
    monkeypatch.setattr(factorize_method, "statistics_side", lambda layer: "input")


SIDED = [_conv_net, _seq_net, _vol_net]  # Linear, Conv1d/2d/3d; stride, padding, dilation, groups; bias or not


@pytest.mark.parametrize("make", SIDED)
def test_output_side_bases_equal_those_of_the_input_moments(make, monkeypatch, projectors_agree) -> None:
    model, data = _float64_case(make)
    targets, _, _ = find_targets(model, data.x[:4])
    assert "output" in {statistics_side(t.layer) for t in targets}
    cfg = FactorizeConfig(stats_dtype="float64")
    new = layer_bases(model, data, targets, cfg, CompressionReport("factorize", {}))
    _input_side_only(monkeypatch)
    old = layer_bases(model, data, targets, cfg, CompressionReport("factorize", {}))
    for t in targets:
        a, b = new[t.name], old[t.name]
        assert a.routes == b.routes and a.basis.shape == b.basis.shape
        torch.testing.assert_close(a.sq_values, b.sq_values, rtol=0, atol=1e-10 * float(b.sq_values.max()))
        for g in range(len(b.basis)):
            projectors_agree(a.basis[g], b.basis[g], b.sq_values[g], 1e-6)


@pytest.mark.parametrize("make", SIDED)
def test_whole_model_is_factorised_the_same_from_either_side(make, monkeypatch) -> None:
    model, data = _float64_case(make)
    cfg = FactorizeConfig(layer_mac_ratio=0.5, stats_dtype="float64")
    new, after = compress(model, data, "factorize", cfg)
    _input_side_only(monkeypatch)
    old, before = compress(model, data, "factorize", cfg)
    assert [(lr.name, lr.action, lr.rank) for lr in after.layers] == [(lr.name, lr.action, lr.rank)
                                                                      for lr in before.layers]
    assert any(lr.action == "factorized" for lr in after.layers)
    with torch.no_grad():
        torch.testing.assert_close(new(data.x), old(data.x), rtol=1e-9, atol=1e-9)


def test_wide_layers_take_o_by_o_statistics_and_never_unfold(monkeypatch) -> None:
    """d ≫ o: the statistic collected is o × o per layer; the im2col rows, the shifted d × d sums and the input
    moment's helpers are never called."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the input side was used for a layer with o < d")

    for helper in ("layer_rows", "conv_patches", "shifted_moments", "_bytes_per_sample"):
        monkeypatch.setattr(stats, helper, refuse)
    collected = {}
    real = factorize_method.collect_moments

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        collected.update({n: (s.side, tuple(s.total.shape)) for n, s in out.items()})
        return out

    monkeypatch.setattr(factorize_method, "collect_moments", spy)
    torch.manual_seed(12)
    model = nn.Sequential(nn.Conv2d(64, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)).eval()
    _, report = compress(model, Dataset(torch.randn(12, 64, 8, 8)), "factorize", FactorizeConfig(rank_fraction=0.5))
    assert collected == {"0": ("output", (1, 4, 4)), "3": ("output", (1, 3, 3))}
    assert {lr.details["whitening"] for lr in report.layers if lr.action == "factorized"} == {"output"}


def test_output_grams_are_cached_under_a_kind_of_their_own(tmp_path, monkeypatch) -> None:
    """A cache written with input moments for every layer (before the output side) serves the input-side layers
    only: the output-side layers miss, are collected from their outputs, and their entries hold an o × o "gram"."""
    model, data = _float64_case(_conv_net)
    targets, _, _ = find_targets(model, data.x[:4])
    sides = {t.name: statistics_side(t.layer) for t in targets}
    assert set(sides.values()) == {"input", "output"}
    cfg = FactorizeConfig(stats_dtype="float64", cache_dir=str(tmp_path))
    with monkeypatch.context() as m:
        _input_side_only(m)
        old = layer_bases(model, data, targets, cfg, CompressionReport("factorize", {}))
    collected = []
    real = factorize_method.collect_moments
    monkeypatch.setattr(factorize_method, "collect_moments",
                        lambda *a, **k: collected.append((sorted(a[1]), sorted(k["output_side"]))) or real(*a, **k))
    report = CompressionReport("factorize", {})
    new = layer_bases(model, data, targets, cfg, report)
    outputs = sorted(n for n, side in sides.items() if side == "output")
    assert collected == [(outputs, outputs)] and report.predicted.cache_hits == len(targets) - len(outputs)
    for t in targets:
        torch.testing.assert_close(new[t.name].sq_values, old[t.name].sq_values, rtol=0,
                                   atol=1e-10 * float(old[t.name].sq_values.max()))
    stats_keys, _ = factorize_method._keys(model, data, targets, cfg)
    for name in outputs:
        entry = torch.load(tmp_path / f"{stats_keys[name]}.pt", weights_only=True)
        v = matrix_view(model.get_submodule(name))
        assert set(entry) == {"gram"} and entry["gram"].shape == (v.groups, v.out_per_group, v.out_per_group)
    again = CompressionReport("factorize", {})
    layer_bases(model, data, targets, cfg, again)
    assert len(collected) == 1 and again.predicted.cache_hits == len(targets)


class _StandardisedConv(nn.Conv2d):
    """timm's ``StdConv2d`` in small: the weight is standardised inside ``forward``, so the output is not W x + b for
    the W the layer stores."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


def test_a_layer_with_a_forward_of_its_own_is_left_whole(image_data) -> None:
    """Review (issue 44): factorising the stored weight of a layer whose own forward transforms it (weight
    standardisation) would replace what it computes, and its output Gram would not be W M Wᵀ: such a layer is no
    target (the cost table attributes only torch.nn's own layers) and stays whole, computing exactly what it did."""
    torch.manual_seed(0)
    model = nn.Sequential(_StandardisedConv(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 144, 4)).eval()
    targets, _, _ = find_targets(model, image_data.x[:2])
    assert [t.name for t in targets] == ["2", "5"]
    new, report = compress(model, image_data, "factorize", FactorizeConfig(layer_mac_ratio=0.6))
    assert "0" not in {lr.name for lr in report.layers}
    assert type(new[0]) is _StandardisedConv and torch.equal(new[0].weight, model[0].weight)
    with torch.no_grad():
        torch.testing.assert_close(new[0](image_data.x), model[0](image_data.x), rtol=0, atol=0)


class _VideoConv(nn.Conv3d):
    """torchvision's video ``Conv3DSimple`` in small: a constructor of its own (no kernel argument), ``nn.Conv3d``'s
    forward."""

    def __init__(self, in_planes: int, out_planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, out_planes, kernel_size=(3, 3, 3), stride=stride, padding=1, bias=False)


def _video_net() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(_VideoConv(3, 12), nn.ReLU(), _VideoConv(12, 16, stride=2), nn.ReLU(),
                         nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 4)).eval()


def test_a_layer_subclass_keeping_its_computation_is_factorised_into_plain_layers() -> None:
    """Review (issue 44): torchvision's video ResNets build their convolutions as ``nn.Conv3d`` subclasses that differ
    only in ``__init__``; the cost table missed them and factorize refused mc3_18 at ``--mac-ratio 0.7`` ("0.9602 of
    the cost is in layers it does not factorise"). Counted as ``nn.Conv3d`` they are targets: at full rank the
    factorised model reproduces the original, a whole-model MAC budget is met by torch's own count, and each pair is
    two plain ``nn.Conv3d`` (nothing for the exporter to know)."""
    model = _video_net().double()
    data = Dataset(torch.randn(12, 3, 4, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(9)))
    targets, _, _ = find_targets(model, data.x[:2])
    assert [t.name for t in targets] == ["0", "2", "6"]
    bases = layer_bases(model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    full = apply_factors(model, targets, _factors(targets, bases, {t.name: matrix_view(t.layer).max_rank
                                                                   for t in targets}))
    assert [type(m) for m in (*full[0], *full[2])] == [nn.Conv3d] * 4
    with torch.no_grad():
        torch.testing.assert_close(full(data.x), model(data.x), atol=1e-10, rtol=1e-10)

    model, x = _video_net(), data.x.float()
    new, report = compress(model, Dataset(x), "factorize", FactorizeConfig(mac_ratio=0.7))
    assert {lr.name for lr in report.layers if lr.action == "factorized"} >= {"0", "2"}
    measured = count_macs_torch(new, x[:1]).macs / count_macs_torch(model, x[:1]).macs
    assert measured == report.mac_ratio <= 0.7
    assert all(type(m).__module__.startswith("torch.nn") for m in (*new[0].modules(), *new[2].modules()))
