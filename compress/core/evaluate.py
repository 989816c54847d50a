"""Measured quality of a compressed model against the original on held-out data."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from .data import Dataset
from .errors import CompressionError
from .inputs import NamedInputs, call

__all__ = ["eval_mode", "hooks_removed", "flatten_outputs", "output_paths", "output_rows", "predict", "compare_outputs",
           "predictions_kept", "kept_like", "KeptPredictions", "KEPT_PREDICTION_BYTES"]

KEPT_PREDICTION_BYTES = 512 << 20
"""Most bytes of outputs one :func:`predictions_kept` block (or its ``store``, over all its blocks) holds in memory;
outputs beyond are computed again (a segmentation model's over a held-out set are gigabytes)."""


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


def _leaves(outputs: object, prefix: str = "", keyed: bool = False, skip_other: bool = False
            ) -> Iterator[tuple[str, bool, torch.Tensor]]:
    """Each tensor of a module's output(s) in order, with its path (dict keys and sequence positions joined by ``.``)
    and whether a dict key is on that path; any other object is a TypeError, or passed over with ``skip_other``."""
    if isinstance(outputs, torch.Tensor):
        yield prefix, keyed, outputs
    elif isinstance(outputs, (Mapping, tuple, list)):
        items = outputs.items() if isinstance(outputs, Mapping) else enumerate(outputs)
        for key, item in items:
            yield from _leaves(item, f"{prefix}.{key}" if prefix else str(key), keyed or isinstance(outputs, Mapping),
                               skip_other)
    elif not skip_other:
        raise TypeError(f"module output of type {type(outputs).__name__} is not a tensor or a tuple/list/dict of "
                        "tensors; make the model return tensors only (a Hugging Face model returning a key/value "
                        "cache: build it with config.use_cache=False, as hf:FAMILY does)")


def flatten_outputs(outputs: object, skip_other: bool = False) -> list[torch.Tensor]:
    """Return a module's output(s) as a flat list of tensors (tensor, or tuple/list/dict of them); an output of
    another type (a Hugging Face key/value cache) is a TypeError, or left out with ``skip_other``."""
    return [t for _, _, t in _leaves(outputs, skip_other=skip_other)]


@torch.no_grad()
def require_tensor_outputs(model: nn.Module, data: Dataset) -> None:
    """Refuse, before any work, a model whose outputs on ``data``'s first sample are not tensors or containers of
    them (a Hugging Face model returning a key/value cache): every method ends by comparing outputs, which would
    refuse it only after the statistics passes. A forward that fails here is left for the method to report."""
    if not len(data):
        return
    try:
        with eval_mode(model):
            outputs = call(model, next(iter(data.inputs(1))))
    except Exception:  # the method's own forward reports it, in its words
        return
    try:
        flatten_outputs(outputs)
    except TypeError as exc:
        raise CompressionError(str(exc)) from None


def output_rows(outputs: object) -> torch.Tensor:
    """One tensor of a batch's outputs: a tensor as it is; a tuple, list or dict of tensors (a segmentation model's
    ``{"out": ..., "aux": ...}``, a Hugging Face ``ModelOutput``) as each output flattened per sample and
    concatenated in their order, shape ``(batch, total)``.

    Raises
    ------
    CompressionError
        The outputs do not all have one row per sample (a detection model's per-image boxes).
    """
    if isinstance(outputs, torch.Tensor):
        return outputs
    tensors = flatten_outputs(outputs)
    rows = {t.shape[0] if t.dim() else None for t in tensors}
    if len(rows) != 1 or None in rows:
        raise CompressionError(f"the model returns {type(outputs).__name__} of {len(tensors)} tensors whose first "
                               "dimensions are not all the batch; comparing outputs needs one row per sample in "
                               "every output: wrap the model so that it returns tensors of the batch's rows")
    return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)


def output_paths(outputs: object) -> list[tuple[str, bool]]:
    """Where each tensor of :func:`flatten_outputs` sits in ``outputs``, in the same order: its dict keys and
    sequence positions joined by ``.`` (``"out"``, ``"aux"``, ``"past.0.1"``; ``""`` for a lone tensor), and
    whether a dict key is among them (then the path is a name worth giving the graph output)."""
    return [(path, keyed) for path, keyed, _ in _leaves(outputs)]


@dataclass
class KeptPredictions:
    """The models whose :func:`predict` outputs a :func:`predictions_kept` block keeps, and those outputs by key
    (:func:`_prediction_key`). A caller that runs many jobs on one model (a tune's
    worker) passes one as ``store`` so that the outputs outlive each job's block; the models named are those of the
    blocks running now."""

    models: list[nn.Module] = field(default_factory=list)
    outputs: dict[tuple[object, ...], torch.Tensor] = field(default_factory=dict)
    bytes: int = 0


_KEPT: ContextVar[KeptPredictions | None] = ContextVar("minreal_kept_predictions", default=None)


def _named_for_block(kept: KeptPredictions, models: tuple[nn.Module, ...]) -> Iterator[None]:
    """Name ``models`` in ``kept`` for the block, and only for it."""
    kept.models.extend(models)
    try:
        yield
    finally:
        for m in models:
            index = next((i for i in range(len(kept.models) - 1, -1, -1) if kept.models[i] is m), None)
            if index is not None:
                del kept.models[index]


@contextlib.contextmanager
def predictions_kept(*models: nn.Module, store: KeptPredictions | None = None) -> Iterator[None]:
    """Within this block, :func:`predict` of one of ``models`` (by identity: the original a run judges every variant
    against) computes its outputs once per data: later calls with the same architecture, weights and buffers (their
    digest, the non-persistent buffers and devices included), the same data (its digest), batch size and torch thread
    count get a copy of them, never under autocast; at most :data:`KEPT_PREDICTION_BYTES` are held, also for later
    blocks given the same ``store``. A named model must not change otherwise while it is named (a forward hook, an
    attribute its forward reads): its kept outputs would be returned. A block inside another names its models in the
    outer one's until it ends (its own ``store`` is not used). The block is a context variable's: it covers this
    thread's calls."""
    outer = _KEPT.get()
    if outer is not None:
        yield from _named_for_block(outer, models)
        return
    kept = store if store is not None else KeptPredictions()
    token = _KEPT.set(kept)
    try:
        yield from _named_for_block(kept, models)
    finally:
        _KEPT.reset(token)


@contextlib.contextmanager
def kept_like(model: nn.Module, original: nn.Module) -> Iterator[None]:
    """Name ``model``, a frozen copy of ``original`` (a recovery's teacher), for this block in the running
    :func:`predictions_kept` block where ``original`` is named: its outputs are the original's, found by the same
    digests."""
    kept = _KEPT.get()
    if kept is None or not any(m is original for m in kept.models):
        yield
        return
    yield from _named_for_block(kept, (model,))


def _tensor_digest(h: "hashlib._Hash", name: str, t: torch.Tensor) -> None:
    if t.is_quantized or t.is_sparse or t.is_meta or torch.nn.parameter.is_lazy(t):  # no plain bytes, or no scales
        raise TypeError(f"{name}: no plain bytes to digest")
    t = t.detach().cpu().contiguous()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())


def _prediction_key(model: nn.Module, data: Dataset, batch_size: int) -> tuple[object, ...] | None:
    """The digest of the architecture as printed and the weights and buffers (state dict and non-persistent buffers,
    with their devices), the inputs' digest, the batch size and torch's thread count (a float sum may be split
    otherwise); ``None`` (not kept) under autocast, or where a tensor has no plain bytes to digest (quantised,
    sparse, meta or lazy tensors) or the state dict cannot be read."""
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return None  # its dtype would be part of the outputs too
    weights, inputs = hashlib.blake2b(digest_size=20), hashlib.blake2b(digest_size=20)
    weights.update(repr(model).encode())  # the architecture as printed: a swapped submodule is another model
    try:
        tensors = {**dict(model.named_buffers()), **model.state_dict(keep_vars=False)}
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor):
                weights.update(f"{t.device}".encode())
                _tensor_digest(weights, name, t)
        for name, t in data.x.items() if isinstance(data.x, NamedInputs) else [("", data.x)]:
            _tensor_digest(inputs, name, t)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None
    return weights.hexdigest(), inputs.hexdigest(), batch_size, torch.get_num_threads()


@torch.no_grad()
def predict(model: nn.Module, data: Dataset, batch_size: int = 256) -> torch.Tensor:
    """Concatenated model outputs over ``data`` in eval mode (several outputs as :func:`output_rows` joins them).
    Inside :func:`predictions_kept` naming ``model``, computed once per :func:`_prediction_key`."""
    kept = _KEPT.get()
    key = _prediction_key(model, data, batch_size) if kept is not None and any(m is model for m in kept.models) \
        else None
    if key is not None and key in kept.outputs:
        return kept.outputs[key].clone()
    with eval_mode(model):
        out = torch.cat([output_rows(call(model, xb)) for xb in data.inputs(batch_size)])
    if key is not None and kept.bytes + out.nbytes <= KEPT_PREDICTION_BYTES:
        kept.outputs[key] = out.clone()  # the caller may change its copy in place
        kept.bytes += out.nbytes
    return out


@torch.no_grad()
def _one_tensor(model: nn.Module, data: Dataset) -> bool:
    """Whether ``model`` returns a single tensor (not a tuple, list or dict of them) on ``data``'s first sample."""
    with eval_mode(model):
        return isinstance(call(model, next(iter(data.inputs(1)))), torch.Tensor)


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
    if ref.dim() == 2 and ref.shape[1] > 1 and _one_tensor(original, data):
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
