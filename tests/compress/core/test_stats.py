"""Second-moment collection: im2col matches the convolution, shifted views match im2col, chunking under a memory
cap changes nothing, output Grams equal W M Wᵀ without the input side."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minreal.compress.core import stats
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import grouped_weight, matrix_view
from minreal.compress.core.stats import collect_moments, conv_patches, layer_rows, shifted_moments

CONVS = [
    nn.Conv1d(4, 6, 3, stride=2, padding=1),
    nn.Conv1d(4, 6, 3, padding="same", dilation=2, padding_mode="reflect"),
    nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1),
    nn.Conv2d(4, 8, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=2),
    nn.Conv2d(4, 6, 3, padding=1, padding_mode="circular"),
    nn.Conv3d(4, 6, 3, stride=(1, 2, 2), padding=1, groups=2),
]


@pytest.mark.parametrize("conv", CONVS, ids=lambda c: f"{type(c).__name__}-g{c.groups}-{c.padding_mode}")
def test_patches_reproduce_the_convolution(conv: nn.Module) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, *([9] * (conv.weight.dim() - 2)), dtype=torch.float64)
    conv = conv.double()
    y = conv(x)
    rows = conv_patches(conv, x)  # (B·positions, C·k)
    g = conv.groups
    w = conv.weight.reshape(g, conv.out_channels // g, -1)
    per_group = torch.einsum("ngd,god->ngo", rows.reshape(rows.shape[0], g, -1), w).reshape(rows.shape[0], -1)
    expect = y.movedim(1, -1).reshape(-1, conv.out_channels) - conv.bias
    torch.testing.assert_close(per_group, expect, atol=1e-10, rtol=1e-10)


def test_patches_match_unfold_for_conv2d() -> None:
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=2)
    x = torch.randn(2, 3, 11, 11)
    ref = F.unfold(x, 3, dilation=2, padding=1, stride=2).transpose(1, 2).reshape(-1, 27)
    torch.testing.assert_close(conv_patches(conv, x), ref)


def test_linear_rows_are_all_leading_positions() -> None:
    lin = nn.Linear(5, 3)
    x = torch.randn(2, 7, 4, 5)
    assert layer_rows(lin, x).shape == (56, 5)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_chunked_moments_equal_direct_moments(dtype: str) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, groups=1), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.Flatten(), nn.Linear(8 * 25, 4)).double()
    data = Dataset(torch.randn(10, 3, 10, 10, dtype=torch.float64))
    layers = {"0": model[0], "2": model[2], "4": model[4]}
    big = collect_moments(model, layers, data, batch_size=4, memory_cap_bytes=1 << 30, dtype=dtype)
    tiny = collect_moments(model, layers, data, batch_size=4, memory_cap_bytes=1, dtype=dtype)
    inp = data.x
    h1 = model[1](model[0](inp))
    direct = {"0": conv_patches(model[0], inp), "2": conv_patches(model[2], h1),
              "4": model[3](model[2](h1))}
    tol = 1e-12 if dtype == "float64" else 1e-5
    for name, rows in direct.items():
        s = big[name]
        grouped = rows.reshape(rows.shape[0], s.groups, s.size).transpose(0, 1)
        expect = grouped.transpose(1, 2) @ grouped / rows.shape[0]
        assert s.rows == tiny[name].rows == rows.shape[0]
        assert tiny[name].chunks == 10 and big[name].chunks == 3  # one sample per chunk under the 1-byte cap
        assert tiny[name].over_cap
        torch.testing.assert_close(s.moment, expect, rtol=tol, atol=tol)
        torch.testing.assert_close(tiny[name].moment, expect, rtol=tol, atol=tol)


SHIFTED = [
    nn.Conv2d(3, 5, 3, padding=1),
    nn.Conv2d(3, 5, 3),
    nn.Conv2d(3, 5, (3, 2), padding=(2, 1), dilation=(2, 1)),
    nn.Conv2d(3, 5, 4, padding="same"),
    nn.Conv2d(3, 5, 3, padding=2),
    nn.Conv2d(2, 5, 7, padding=3),
    nn.Conv1d(3, 5, 5, padding="same", dilation=2),
    nn.Conv3d(3, 5, 3, padding=1),
]


@pytest.mark.parametrize("size", [9, 2, 1])
@pytest.mark.parametrize("conv", SHIFTED,
                         ids=lambda c: f"{type(c).__name__}-k{c.kernel_size}-p{c.padding}-d{c.dilation}")
def test_shifted_moments_equal_the_patch_gram(conv: nn.Module, size: int) -> None:
    """Σ ppᵀ from shifted views equals the Gram of the unfolded patches, also on inputs no larger than the kernel."""
    torch.manual_seed(2)
    x = torch.randn(3, conv.in_channels, *([size] * (conv.weight.dim() - 2)), dtype=torch.float64)
    _assert_exact(conv, x)


def _assert_exact(conv: nn.Module, x: torch.Tensor) -> None:
    """shifted_moments of ``x`` equals the Gram of its unfolded patches (zero and no patch without an output)."""
    total, count = shifted_moments(conv, x)
    pads = [conv.padding[i] if conv.padding != "same" else None for i in range(x.dim() - 2)]
    reach = [d * (k - 1) + 1 for d, k in zip(conv.dilation, conv.kernel_size)]
    if any(p is not None and n + 2 * p < r for n, p, r in zip(x.shape[2:], pads, reach)):  # no output position
        assert count == 0 and not total.any()
        return
    rows = conv_patches(conv, x)
    assert count == rows.shape[0]
    torch.testing.assert_close(total[0], rows.T @ rows, rtol=1e-12, atol=1e-12)


def test_shifted_moments_are_exact_on_random_geometries() -> None:
    """Seeded sweep: 1-3 D, per-axis kernels 1-4, dilations 1-3, paddings 0-3 or 'same', non-square inputs 1-7."""
    rng = torch.Generator().manual_seed(4)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng))  # noqa: E731
    checked = 0
    while checked < 60:
        nd = draw(1, 3)
        kernel = tuple(draw(1, 4) for _ in range(nd))
        if math.prod(kernel) == 1:
            continue
        padding = "same" if draw(0, 3) == 0 else tuple(draw(0, 3) for _ in range(nd))
        conv = getattr(nn, f"Conv{nd}d")(draw(1, 3), 2, kernel, padding=padding,
                                         dilation=tuple(draw(1, 3) for _ in range(nd))).double()
        _assert_exact(conv, torch.randn(draw(1, 3), conv.in_channels, *(draw(1, 7) for _ in range(nd)),
                                        generator=rng, dtype=torch.float64))
        checked += 1


@pytest.mark.parametrize("conv", [nn.Conv2d(2, 2, 3, stride=2), nn.Conv2d(2, 2, 3, groups=2),
                                  nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), nn.Conv2d(2, 2, 1)],
                         ids=["stride", "groups", "reflect", "1x1"])
def test_shifted_moments_refuse_what_they_do_not_sum(conv: nn.Module) -> None:
    with pytest.raises(ValueError, match="use layer_rows"):
        shifted_moments(conv, torch.randn(1, 2, 6, 6))


def test_shifted_path_under_a_tiny_memory_cap_is_chunked_and_exact() -> None:
    torch.manual_seed(5)
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    data = Dataset(torch.randn(5, 3, 6, 7, dtype=torch.float64))
    tiny = collect_moments(conv, {"c": conv}, data, batch_size=5, memory_cap_bytes=1, dtype="float64")["c"]
    rows = conv_patches(conv, data.x)
    assert tiny.chunks == 5 and tiny.over_cap and tiny.rows == rows.shape[0]
    torch.testing.assert_close(tiny.moment[0], rows.T @ rows / rows.shape[0], rtol=1e-12, atol=1e-12)


def test_collect_moments_sums_stride_one_convolutions_from_shifts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stride-1 ungrouped conv goes through shifted_moments; a strided or grouped one is unfolded; both exact."""

    calls = []
    spy = stats.shifted_moments
    monkeypatch.setattr(stats, "shifted_moments", lambda layer, x, dtype: calls.append(layer) or spy(layer, x, dtype))
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, stride=2, padding=1),
                          nn.Conv2d(6, 6, 3, padding=1, groups=3)).double()
    data = Dataset(torch.randn(7, 3, 8, 8, dtype=torch.float64))
    layers = {"0": model[0], "2": model[2], "3": model[3]}
    got = collect_moments(model, layers, data, batch_size=3, dtype="float64")
    assert {id(layer) for layer in calls} == {id(model[0])} and len(calls) == 3  # one call per batch
    inputs = {"0": data.x, "2": model[1](model[0](data.x)), "3": model[2](model[1](model[0](data.x)))}
    for name, x in inputs.items():
        rows = conv_patches(layers[name], x)
        g = layers[name].groups
        grouped = rows.reshape(rows.shape[0], g, -1).transpose(0, 1)
        torch.testing.assert_close(got[name].moment, grouped.transpose(1, 2) @ grouped / rows.shape[0],
                                   rtol=1e-12, atol=1e-12)


# ---- the output side: E[y₀y₀ᵀ] from the layer's outputs equals W E[xxᵀ] Wᵀ from its inputs ------------------------

OUTPUT_LAYERS = [
    nn.Linear(7, 5),
    nn.Linear(7, 5, bias=False),
    nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2),
    nn.Conv1d(4, 6, 3, padding="same", dilation=2, padding_mode="reflect", bias=False),
    nn.Conv2d(4, 6, 3, stride=2, padding=1),
    nn.Conv2d(4, 8, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=2),
    nn.Conv2d(4, 6, 3, padding=1, padding_mode="circular", bias=False),
    nn.Conv3d(4, 6, 3, stride=(1, 2, 2), padding=1, dilation=(1, 2, 1), groups=2),
]


def _input_shape(layer: nn.Module) -> tuple[int, ...]:
    return (2, 3, 7) if isinstance(layer, nn.Linear) else (4, *([9] * (layer.weight.dim() - 2)))


@pytest.mark.parametrize("layer", OUTPUT_LAYERS,
                         ids=lambda m: f"{type(m).__name__}-g{getattr(m, 'groups', 1)}-bias{m.bias is not None}")
@pytest.mark.parametrize("cap", [1 << 30, 1])
def test_output_gram_equals_the_weight_times_the_input_moment(layer: nn.Module, cap: int) -> None:
    """G = E[y₀y₀ᵀ] summed from the outputs is W_g M_g W_gᵀ, M_g the input moment of the same pass, per group,
    with the same row count, whole or one sample per chunk (a Linear's leading dims are rows)."""
    torch.manual_seed(3)
    layer = layer.double()
    with torch.no_grad():
        if layer.bias is not None:
            layer.bias.uniform_(1.0, 3.0)  # a bias that would show if it were not subtracted
    data = Dataset(torch.randn(6, *_input_shape(layer), dtype=torch.float64))
    model = nn.Sequential(layer)
    grams = collect_moments(model, {"0": layer}, data, 4, cap, "float64", output_side=["0"])["0"]
    moments = collect_moments(model, {"0": layer}, data, 4, cap, "float64")["0"]
    v = matrix_view(layer)
    w = grouped_weight(layer)
    assert grams.side == "output" and grams.total.shape == (v.groups, v.out_per_group, v.out_per_group)
    assert grams.rows == moments.rows and grams.over_cap == (cap == 1)
    torch.testing.assert_close(grams.moment, w @ moments.moment @ w.transpose(1, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", [nn.Linear(4096, 8), nn.Conv2d(64, 4, 3, padding=1)], ids=["linear", "conv"])
def test_output_side_never_unfolds_nor_builds_the_input_moment(layer: nn.Module,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide layer's output statistic is o × o: neither the im2col rows nor the shifted d × d sums are formed."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the input side was used for an output-side layer")

    for helper in ("layer_rows", "conv_patches", "shifted_moments", "_bytes_per_sample"):
        monkeypatch.setattr(stats, helper, refuse)
    shape = (3, 4096) if isinstance(layer, nn.Linear) else (3, 64, 6, 6)
    got = collect_moments(nn.Sequential(layer), {"0": layer}, Dataset(torch.randn(*shape)), 2, output_side={"0"})
    o = matrix_view(layer).out_per_group
    assert got["0"].total.shape == (1, o, o) and got["0"].rows == (3 if isinstance(layer, nn.Linear) else 108)


def test_output_side_of_an_unknown_layer_is_refused() -> None:
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="output_side names layers not in `layers`: other"):
        collect_moments(nn.Sequential(lin), {"0": lin}, Dataset(torch.randn(2, 3)), output_side=["other"])


class _OneByOne(nn.Module):
    """Calls ``layer`` on one unbatched sample at a time."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.layer(v) for v in x])


@pytest.mark.parametrize("layer", [nn.Linear(6, 3), nn.Conv1d(4, 2, 3, groups=2)], ids=["linear", "conv1d"])
def test_output_side_takes_unbatched_calls(layer: nn.Module) -> None:
    """A layer called on one sample without a batch dim (a Linear on a vector, a ConvNd on (C, *spatial)) adds the
    same rows as a batched call."""
    torch.manual_seed(4)
    layer = layer.double()
    data = Dataset(torch.randn(5, *((6,) if isinstance(layer, nn.Linear) else (4, 7)), dtype=torch.float64))
    batched = collect_moments(nn.Sequential(layer), {"0": layer}, data, 5, dtype="float64", output_side=["0"])["0"]
    single = _OneByOne(layer)
    each = collect_moments(single, {"layer": layer}, data, 5, dtype="float64", output_side=["layer"])["layer"]
    assert each.rows == batched.rows == (5 if isinstance(layer, nn.Linear) else 25)
    torch.testing.assert_close(each.total, batched.total, rtol=1e-12, atol=1e-12)
