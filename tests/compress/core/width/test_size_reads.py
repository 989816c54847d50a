"""Sizes the model's code reads from a tensor (``b, t, d = x.shape``) and uses on another (issue 44, found by a
review: wanda cut the residual width of hand-written attention while qkv kept its 3·d outputs, so the cut model's
``view(b, t, 3, heads, d // heads)`` no longer fit, and torch.fx's traceback reached the console): the channels are
left whole unless the size reshapes the very channels it was read from, and a cut model that does not run is
refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width import Cut, analyse, apply_cuts
from minreal.compress.methods.wanda import WandaConfig


class _SizeFromOtherTensor(nn.Module):
    """Attention written by hand, as in many repositories (timm's older Attention): the head size ``d // 4`` and
    the output width ``d`` are read from the stream (``b, t, d = h.shape``) and reshape qkv's output, another
    layer's channels: a cut of the stream would not resize qkv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.n = nn.Linear(6, 16), nn.LayerNorm(16)
        self.qkv, self.o = nn.Linear(16, 48), nn.Linear(16, 16)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.conv2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        b, t, d = h.shape
        q, k, v = self.qkv(self.n(h)).view(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        h = h + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return self.conv2(h + self.fc2(F.gelu(self.fc1(h))))


class _SizeFromSameChannels(nn.Module):
    """A gate over tokens: ``d`` read from the stream views the pooled branch, whose channels the residual addition
    after the view makes the stream's: a cut resizes both alike, so the stream stays cuttable."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Linear(6, 16), nn.Linear(16, 3)
        self.a, self.g = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        b, t, d = h.shape
        y = self.a(h)
        return self.conv2(h + y * torch.sigmoid(self.g(y.mean(1).reshape(b, d))).view(b, 1, d))


def test_a_size_read_from_one_tensor_that_reshapes_another_freezes_both() -> None:
    model, x = _SizeFromOtherTensor().eval(), torch.randn(5, 2, 6)
    wg = analyse(model, x)
    g = wg.group("conv1")
    assert g.frozen.startswith("view: ") and "size read from the 16 channels of conv1" in g.frozen, g.frozen
    assert ("view", g.frozen.split(": ", 1)[1]) in wg.unsupported
    assert g not in wg.cuttable() and wg.group("qkv").frozen
    assert [c.name for c in wg.cuttable()] == ["fc1"]
    with pytest.raises(CompressionError) as refused:
        apply_cuts(wg, {"conv1": Cut(range(g.size - 1))})
    assert "'conv1' cannot be cut: view: " in str(refused.value) and "\n" not in str(refused.value)
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"conv1": Cut(range(g.size))})(x), model(x))


def test_a_size_read_from_the_same_channels_stays_cuttable() -> None:
    model, x = _SizeFromSameChannels().eval(), torch.randn(5, 2, 6)
    wg = analyse(model, x)
    g = wg.group("conv1")
    assert not g.frozen and g in wg.cuttable()
    with torch.no_grad():
        assert apply_cuts(wg, {"conv1": Cut(range(8))})(x).shape == (5, 2, 3)


def test_wanda_on_hand_written_attention_leaves_the_stream_whole_and_runs() -> None:
    torch.manual_seed(0)
    model = _SizeFromOtherTensor().eval()
    g = torch.Generator().manual_seed(1)
    data = Dataset(torch.randn(64, 8, 6, generator=g), torch.randn(64, 8, 3, generator=g))
    new, report = compress(model, data, "wanda", WandaConfig(mac_ratio=0.7))
    with torch.no_grad():
        assert new(data.x[:3]).shape == model(data.x[:3]).shape == (3, 8, 3)
    assert report.predicted.group_widths["fc1"][1] < 32 and "conv1" not in report.predicted.group_widths
    assert any(n.startswith("left whole: conv1 (16 channels) — view: ") for n in report.notes)


def test_a_cut_model_that_does_not_run_is_refused_in_one_line_and_prints_nothing(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """The safety net alone (the size rule switched off, the gap as it was): the cut model is run once on the
    traced example, and its failure is one line naming the operation, with nothing on stderr."""
    import minreal.compress.core.width.analysis as analysis

    monkeypatch.setattr(analysis, "_freeze_size_uses", lambda wg: None)
    model, x = _SizeFromOtherTensor().eval(), torch.randn(5, 2, 6)
    wg = analyse(model, x)
    capfd.readouterr()
    with pytest.raises(CompressionError) as refused:
        apply_cuts(wg, {"conv1": Cut(range(8))})
    said = str(refused.value)
    assert "does not run at its operation view" in said and "\n" not in said
    assert capfd.readouterr().err == ""


class _Noisy(nn.Module):
    """A forward that draws noise whatever its mode (dropout with ``training=True``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.dropout(torch.relu(self.a(x)), 0.5, training=True))


def test_running_a_cut_model_leaves_the_random_state_as_it_was() -> None:
    """Review: the run of each cut model drew from the global generator, so a seeded run depended on how many cuts
    were tried (fde bisects)."""
    wg = analyse(_Noisy().eval(), torch.randn(5, 6))
    torch.manual_seed(7)
    state = torch.get_rng_state()
    apply_cuts(wg, {"a": Cut(range(8))})
    assert torch.equal(torch.get_rng_state(), state)


class _Flattened(nn.Module):
    """A head that flattens the feature map by sizes it reads from it: ``h.shape[1:].numel()`` (``product``) or
    ``h.size(1) * h.size(2) * h.size(3)`` (``arithmetic``); or divides by that count (``scale``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.c = how, nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16 if how == "scale" else 16 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.c(x))
        if self.how == "product":
            return self.fc(h.view(h.shape[0], h.shape[1:].numel()))
        if self.how == "arithmetic":
            return self.fc(h.view(h.size(0), h.size(1) * h.size(2) * h.size(3)))
        if self.how == "square":  # review: runs after a cut of 16 to 8 channels, computing something else
            return self.fc(h.view(h.size(0), h.size(1) ** 2 // 2, -1).transpose(1, 2).flatten(1))
        return self.fc(h.mean((2, 3)) / h.shape[1:].numel() ** 0.5)


@pytest.mark.parametrize("how", ["product", "arithmetic", "square", "scale"])
def test_a_product_of_sizes_flattens_its_own_tensor_but_is_no_scale(how: str) -> None:
    """Review gap: ``x.shape.numel()`` was not followed, so a scale by it changed silently under a cut (the cut model
    ran). Now the product of a shape read's entries (``h.shape[1:].numel()``) where the tensor's own channels are
    flattened stays cuttable (a cut changes both alike); other arithmetic on sizes (a second review: ``size(1) ** 2
    // 2`` was cut and ran, computing something else) and a scale leave the channels whole."""
    torch.manual_seed(0)
    model, x = _Flattened(how).eval(), torch.randn(4, 3, 4, 4)
    wg = analyse(model, x)
    g = wg.group("c")
    if how != "product":
        op = "truediv" if how == "scale" else "view"
        assert g.frozen.startswith(f"{op}: ") and g not in wg.cuttable(), g.frozen
        assert how == "square" or "takes a size read from the 16 channels" in g.frozen
        return
    assert not g.frozen and g in wg.cuttable()
    cut = apply_cuts(wg, {"c": Cut(range(8))})
    with torch.no_grad():
        assert cut(x).shape == (4, 5) and cut.fc.in_features == 8 * 4 * 4
        torch.testing.assert_close(apply_cuts(wg, {"c": Cut(range(16))})(x), model(x))


class _FunctionalNorm(nn.Module):
    """``F.layer_norm(h, (h.shape[-1],))``: the normalised shape read from the channels normalised (``own``); read
    from the channels where another dimension of the same length is normalised (``other_dim``, h of (b, 16, 16)); or
    a shape slice (``slice``, ``h.shape[-1:]``)."""

    def __init__(self, how: str = "own") -> None:
        super().__init__()
        self.how = how
        self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.how == "other_dim":
            h = h.transpose(1, 2)  # (b, 16 channels, 16 positions): normalised over the positions
            return self.b(F.layer_norm(h, (h.shape[1],)).mean(2))
        return self.b(F.layer_norm(h, h.shape[-1:] if self.how == "slice" else (h.shape[-1],)))


@pytest.mark.parametrize("how, frozen", [
    ("other_dim", "layer_norm: takes a size read from the 16 channels"),
    ("slice", "layer_norm: layer_norm whose normalised shape is computed from sizes"),
])
def test_a_functional_layer_norm_over_another_dimension_or_a_computed_shape_is_left_whole(how: str,
                                                                                        frozen: str) -> None:
    """Second review: the channel count normalising another dimension of the same length was let through and every
    cut then failed the run-once check; a shape slice failed the analysis (a Node is not iterable)."""
    torch.manual_seed(0)
    model, x = _FunctionalNorm(how).eval(), torch.randn(4, 16, 6)
    wg = analyse(model, x)
    g = wg.group("a")
    assert g.frozen.startswith(frozen) and g not in wg.cuttable(), g.frozen


def test_a_functional_layer_norm_over_its_own_channel_count_stays_cuttable() -> None:
    """The last review's gap: any size read used outside a view froze its channels, F.layer_norm's normalised shape
    too, though the cut rewrites that shape to the new width (so the count stays consistent)."""
    torch.manual_seed(0)
    model, x = _FunctionalNorm().eval(), torch.randn(4, 5, 6)
    wg = analyse(model, x)
    g = wg.group("a")
    assert not g.frozen and g in wg.cuttable()
    with torch.no_grad():
        assert apply_cuts(wg, {"a": Cut(range(8))})(x).shape == (4, 5, 3)
        torch.testing.assert_close(apply_cuts(wg, {"a": Cut(range(16))})(x), model(x))
