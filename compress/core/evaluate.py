"""Measured quality of a compressed model against the original on held-out data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from .data import Dataset
from .errors import CompressionError
from .inputs import call

__all__ = ["eval_mode", "hooks_removed", "flatten_outputs", "predict", "compare_outputs"]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block, then restore every submodule's training flag."""
    flags = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield module
    finally:
        for m, flag in flags.items():
            m.training = flag


@contextlib.contextmanager
def hooks_removed(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    """Remove the given hook handles when the block ends, however it ends."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def flatten_outputs(outputs: object) -> list[torch.Tensor]:
    """Return a module's output(s) as a flat list of tensors (tensor, or tuple/list/dict of them)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, Mapping):
        outputs = list(outputs.values())
    if isinstance(outputs, (tuple, list)):
        return [t for item in outputs for t in flatten_outputs(item)]
    raise TypeError(f"module output of type {type(outputs).__name__} is not a tensor or a tuple/list/dict of tensors")


@torch.no_grad()
def predict(model: nn.Module, data: Dataset, batch_size: int = 256) -> torch.Tensor:
    """Concatenated model outputs over ``data`` in eval mode."""
    with eval_mode(model):
        return torch.cat([call(model, xb) for xb in data.inputs(batch_size)])


def _require_finite_outputs(ref: torch.Tensor, out: torch.Tensor) -> None:
    """Errors over NaN/inf outputs would be meaningless (and reported as null): say why instead."""
    for who, t in (("original", ref), ("compressed", out)):
        bad = ~torch.isfinite(t.reshape(len(t), -1)).all(dim=1)
        if bad.any():
            raise CompressionError(f"the {who} model's outputs are NaN/inf on {int(bad.sum())} of {len(t)} samples "
                                   f"(first: sample {int(bad.nonzero()[0])}); values overflow inside the model, so "
                                   "check the data scale, e.g. normalise the inputs")


def compare_outputs(original: nn.Module, compressed: nn.Module, data: Dataset,
                    batch_size: int = 256) -> dict[str, float]:
    """Relative output error, max abs diff, top-1 agreement and (with labels) both accuracies / MSEs."""
    ref, out = predict(original, data, batch_size).double(), predict(compressed, data, batch_size).double()
    _require_finite_outputs(ref, out)
    res = {
        "relative_output_error": float((out - ref).norm() / ref.norm().clamp_min(1e-30)),
        "max_abs_diff": float((out - ref).abs().max()),
    }
    if ref.dim() == 2 and ref.shape[1] > 1:
        res["top1_agreement"] = float((out.argmax(1) == ref.argmax(1)).double().mean())
    if data.y is not None:
        if data.y.dtype in (torch.int64, torch.int32) and ref.dim() == 2:
            res["accuracy_original"] = float((ref.argmax(1) == data.y).double().mean())
            res["accuracy_compressed"] = float((out.argmax(1) == data.y).double().mean())
        else:
            y = data.y.double().reshape(ref.shape)
            res["mse_original"] = float(((ref - y) ** 2).mean())
            res["mse_compressed"] = float(((out - y) ** 2).mean())
    return res
