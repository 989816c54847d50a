"""Named model inputs (minreal.compress.core.inputs): indexing, concatenation, calls, and the methods on a two-input
model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.compress import compress, get_method
from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import (
    NamedInputs,
    as_floating,
    call,
    cat,
    halve_axes,
    repeat_to,
    sample_shapes,
    slice_axis,
)


class TwoInputs(nn.Module):
    """An image branch and a vector branch summed into a small head (forward order: image, meta)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.vec = nn.Linear(4, 16)
        self.head = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 5))

    def forward(self, image: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(image).mean((2, 3)) + self.vec(meta))


def _inputs(n: int = 6) -> NamedInputs:
    g = torch.Generator().manual_seed(0)
    return NamedInputs({"image": torch.randn(n, 1, 8, 8, generator=g), "meta": torch.randn(n, 4, generator=g)})


def test_indexing_slicing_and_concatenation_keep_rows_aligned() -> None:
    ids = torch.arange(10).reshape(5, 2)
    x = NamedInputs({"ids": ids, "mask": ids * 10})
    assert len(x) == 5 and x.names == ["ids", "mask"]
    picked = x[torch.tensor([4, 0])]
    assert torch.equal(picked.tensors["ids"], ids[[4, 0]]) and torch.equal(picked.tensors["mask"], ids[[4, 0]] * 10)
    both = cat([x[:2], x[2:]])
    assert all(torch.equal(both.tensors[n], x.tensors[n]) for n in x.names)
    tiled = repeat_to(x[:2], 5)
    assert torch.equal(tiled.tensors["ids"], ids[[0, 1, 0, 1, 0]])


def test_construction_refuses_mismatched_sample_counts_and_string_index() -> None:
    with pytest.raises(ValueError, match="different sample counts"):
        NamedInputs({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})
    with pytest.raises(TypeError, match="tensors"):
        _inputs()["image"]


def test_dtype_changes_touch_floating_inputs_only() -> None:
    x = NamedInputs({"ids": torch.ones(2, 3, dtype=torch.int64), "w": torch.ones(2, 3)})
    y = as_floating(x, torch.float64)
    assert y.tensors["ids"].dtype == torch.int64 and y.tensors["w"].dtype == torch.float64


def test_slice_axis_cuts_each_named_axis() -> None:
    x = NamedInputs({"ids": torch.zeros(2, 8, dtype=torch.int64), "mask": torch.zeros(2, 8)})
    cut = slice_axis(x, {"ids": {1: 3}, "mask": {1: 3}})
    assert sample_shapes(cut) == {"ids": (3,), "mask": (3,)}


def test_slice_axis_grows_an_axis_by_repeating_its_last_slice_and_halve_axes_takes_1_to_2() -> None:
    x = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 3, 1)
    grown = slice_axis(x, {"input": {1: 5, 2: 2}})
    assert grown.shape == (2, 5, 2)
    assert torch.equal(grown[:, :3, 0], x[:, :, 0]) and torch.equal(grown[:, 3:, 0], x[:, 2:, 0].expand(2, 2))
    assert torch.equal(grown[..., 1], grown[..., 0])  # a length of 1 grown: its one slice repeated
    axes = {"input": {0: "batch", 1: "seq", 2: "feat"}}
    other = halve_axes(x, axes)
    assert other.shape == (2, 1, 2)  # seq 3 -> 1 (half), feat 1 -> 2 (a length of 1 has no half)
    assert halve_axes(x, {"input": {0: "batch"}}) is None  # the batch alone: nothing else to vary


def test_dataset_batches_named_inputs_with_labels() -> None:
    x, y = _inputs(5), torch.arange(5)
    batches = list(Dataset(x, y).batches(2))
    assert [len(b) for b, _ in batches] == [2, 2, 1]
    assert torch.equal(torch.cat([yb for _, yb in batches]), y)


@pytest.mark.parametrize("method, options", [("factorize", {"mac_ratio": 0.7}), ("svd", {"mac_ratio": 0.7}),
                                             ("magnitude", {"mac_ratio": 0.7}), ("wanda", {"mac_ratio": 0.7})])
def test_methods_compress_a_two_input_model(method: str, options: dict) -> None:
    """Statistics, costs and width tracing take named inputs; the result is still called with both."""
    model = TwoInputs().eval()
    data = Dataset(_inputs(64))
    new, report = compress(model, data, method, get_method(method).config_cls(**options))
    with torch.no_grad():
        out = call(new, data.x[:3])
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    assert report.macs_after < report.macs_before
