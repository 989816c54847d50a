"""Load the data a spec names (the data half of the tool's input edge).

Data specs (``load_data``, ``load_dataset``): ``digits``, ``digits-flat``, ``digits-seq`` (scikit-learn's
digits, offline), ``digits32`` (the same digits upsampled to 3×32×32, CIFAR-sized, with the same split);
``data.npz`` (inputs ``x``/``X``/``inputs``, optional labels ``y``/``Y``/``labels``/``targets``); ``data.npy``
(inputs only); an image folder (one sub-folder per class, torchvision's
``ImageFolder`` conventions, resized and ImageNet-normalised); ``file.py:fn`` or ``package.module:fn``
returning ``(x, y)``, ``x``, a ``Dataset`` or an iterable of batches.

Nothing is unpickled: ``np.load(..., allow_pickle=False)``. Every failure is a :class:`SpecError` whose
one-line message names the spec or file and what to do.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.data import Dataset
from compress.datasets import digits, digits32, sequential_digits
from export.app.callables import (SpecError, _CallableSpec, _cause, _describe, _looks_like_path, _parse_callable,
                                  _resolve_callable, _shape)

__all__ = [
    "BUILTIN_DATA",
    "HOLDOUT_FRACTION",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LoadedData",
    "MIN_EVAL_SAMPLES",
    "SpecError",
    "load_data",
    "load_dataset",
]

logger = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INPUT_KEYS = ("x", "X", "inputs")
LABEL_KEYS = ("y", "Y", "labels", "targets")
MIN_EVAL_SAMPLES = 2  # parity is verified at two batch sizes


@dataclass(frozen=True)
class LoadedData:
    """Calibration (and training) data, held-out evaluation data, and a one-line account of both.

    Attributes:
        calib: samples handed to compression methods.
        evaluation: held-out samples used to measure what compression changed (None when nothing is
            held out).
        source: where both came from (for reports), e.g. ``"digits (seed 0, 25% held out)"``.
    """

    calib: Dataset
    evaluation: Dataset | None
    source: str


#: Share of the data held out for measurement unless the user says otherwise (--calib-holdout, digits splits).
HOLDOUT_FRACTION = 0.25


BUILTIN_DATA: dict[str, Callable[[int, float], tuple[Dataset, Dataset]]] = {
    "digits": partial(digits, as_images=True),
    "digits-flat": partial(digits, as_images=False),
    "digits-seq": sequential_digits,
    "digits32": digits32,
}
"""Built-in data by name: ``(seed, eval_fraction) -> (calib, evaluation)``; shapes (N,1,8,8), (N,64), (N,64,1),
(N,3,32,32). Every digits spec splits the same samples for a given seed."""


def _to_tensor(a: Any, origin: str, key: str) -> torch.Tensor:
    """Numbers only: floats → float32, integers → int64, bool → float32; anything else is refused."""
    if isinstance(a, torch.Tensor):
        t = a.detach().cpu()
    else:
        try:
            arr = np.asarray(a)
        except Exception as exc:
            raise SpecError(f"{key!r} in {origin} is not an array ({_cause(exc)}); give a numeric array") from exc
        if arr.dtype.kind not in "biuf":
            raise SpecError(f"{key!r} in {origin} has dtype {arr.dtype}; save a numeric (float or integer) array")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_complex():
        raise SpecError(f"{key!r} in {origin} is complex ({t.dtype}); give real-valued data")
    if t.is_floating_point() or t.dtype == torch.bool:
        return t.to(torch.float32)
    return t.to(torch.int64)


def _check_finite(t: torch.Tensor, origin: str, key: str) -> None:
    if not t.is_floating_point():
        return
    bad = ~torch.isfinite(t.reshape(len(t), -1))
    if bad.any():
        first = int(bad.any(dim=1).nonzero()[0])
        raise SpecError(f"{key!r} in {origin} has {int(bad.sum())} NaN/inf values (first in sample {first}); "
                        "clean or drop those samples")


def _make_dataset(x: Any, y: Any | None, origin: str, x_key: str, y_key: str | None) -> Dataset:
    """Validated ``Dataset``: numeric, non-empty, finite, and as many labels as inputs."""
    xt = _to_tensor(x, origin, x_key)
    if xt.ndim == 0 or len(xt) == 0:
        raise SpecError(f"{x_key!r} in {origin} holds no samples (shape {_shape(xt)}); give at least one sample")
    _check_finite(xt, origin, x_key)
    if y is None or y_key is None:
        return Dataset(xt)
    yt = _to_tensor(y, origin, y_key)
    if yt.ndim == 0 or len(yt) != len(xt):
        raise SpecError(f"{origin}: {len(xt)} inputs in {x_key!r} but labels {y_key!r} have shape {_shape(yt)}; "
                        "give one label per input")
    _check_finite(yt, origin, y_key)
    return Dataset(xt, yt)


def _pick_key(keys: list[str], candidates: tuple[str, ...], path: Path, role: str) -> str | None:
    found = [k for k in candidates if k in keys]
    if len(found) > 1:
        raise SpecError(f"{path} has several {role} arrays ({', '.join(found)}); keep one")
    return found[0] if found else None


def _read_npz_array(archive: Any, key: str, path: Path) -> np.ndarray:
    try:
        return archive[key]
    except ValueError as exc:
        raise SpecError(f"array {key!r} in {path} holds pickled objects (dtype object), which are not loaded; "
                        "save a numeric array") from exc


def _load_npz(path: Path) -> Dataset:
    """Inputs under x/X/inputs, optional labels under y/Y/labels/targets."""
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise SpecError(f"could not read {path} as .npz ({_cause(exc)}); write it with np.savez") from exc
    if not hasattr(archive, "files"):
        raise SpecError(f"{path} holds a single array, not an .npz archive; rename it to .npy")
    with archive:
        keys = list(archive.files)
        x_key = _pick_key(keys, INPUT_KEYS, path, "input")
        if x_key is None:
            raise SpecError(f"{path} has no input array: found keys {keys}; name the inputs one of "
                            f"{', '.join(INPUT_KEYS)} (labels: {', '.join(LABEL_KEYS)})")
        y_key = _pick_key(keys, LABEL_KEYS, path, "label")
        x = _read_npz_array(archive, x_key, path)
        y = None if y_key is None else _read_npz_array(archive, y_key, path)
    return _make_dataset(x, y, str(path), x_key, y_key)


def _load_npy(path: Path) -> Dataset:
    """A single input array, no labels."""
    try:
        x = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise SpecError(f"{path} holds pickled objects (dtype object), which are not loaded; save a numeric "
                        "array with np.save") from exc
    except Exception as exc:
        raise SpecError(f"could not read {path} as .npy ({_cause(exc)}); write it with np.save") from exc
    if not isinstance(x, np.ndarray):
        raise SpecError(f"{path} is an .npz archive, not a single array; rename it to .npz")
    return _make_dataset(x, None, str(path), "x", None)


_DATA_FILE_LOADERS: dict[str, Callable[[Path], Dataset]] = {".npz": _load_npz, ".npy": _load_npy}


def _capped_indices(n: int, max_samples: int, seed: int, origin: str) -> list[int]:
    """All indices, or a seeded random ``max_samples`` of them (sorted) with a logged note."""
    if n <= max_samples:
        return list(range(n))
    logger.warning("%s has %d samples; loading a seeded random %d (raise max_samples for more)", origin, n,
                   max_samples)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_samples]
    return sorted(order.tolist())


def _load_image_folder(root: Path, image_size: int, max_samples: int, seed: int) -> Dataset:
    """RGB images resized (short side) and centre-cropped to ``image_size``, ImageNet-normalised."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    try:
        folder = datasets.ImageFolder(str(root), transform=transform)
    except Exception as exc:
        raise SpecError(f"image folder {root} cannot be read ({_cause(exc)}); it needs one sub-folder per class "
                        "holding image files") from exc
    xs, ys = [], []
    for i in _capped_indices(len(folder), max_samples, seed, str(root)):
        try:
            image, label = folder[i]
        except Exception as exc:
            raise SpecError(f"could not read image {folder.samples[i][0]} ({_cause(exc)}); fix or remove it") from exc
        xs.append(image)
        ys.append(label)
    return Dataset(torch.stack(xs), torch.tensor(ys, dtype=torch.int64))


def _is_array(a: Any) -> bool:
    return isinstance(a, (torch.Tensor, np.ndarray))


def _batch_parts(batch: Any, origin: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x``, ``(x,)``, ``(x, y)``, ``[x, y]`` or a ``Dataset`` → tensors."""
    if isinstance(batch, Dataset):
        batch = (batch.x, batch.y)
    elif _is_array(batch):
        batch = (batch,)
    if not isinstance(batch, (tuple, list)) or len(batch) not in (1, 2):
        raise SpecError(f"{origin} is {_describe(batch)}; yield x or (x, y) arrays/tensors")
    x = _to_tensor(batch[0], origin, "x")
    y = None if len(batch) == 1 or batch[1] is None else _to_tensor(batch[1], origin, "y")
    return x, y


def _concat(parts: list[torch.Tensor], origin: str) -> torch.Tensor:
    try:
        return torch.cat(parts)
    except RuntimeError as exc:
        shapes = sorted({_shape(p[0]) for p in parts if p.ndim and len(p)})
        raise SpecError(f"batches from {origin} have different sample shapes {', '.join(shapes)}; every batch "
                        "needs the same per-sample shape") from exc


def _from_batches(batches: Iterator[Any], spec: str, max_samples: int) -> Dataset:
    """Concatenate batches (stopping after ``max_samples`` samples, so an endless iterator is fine)."""
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor | None] = []
    count = 0
    while count < max_samples and (batch := next(batches, None)) is not None:
        x, y = _batch_parts(batch, f"batch {len(xs)} from {spec}")
        xs.append(x.reshape(1) if x.ndim == 0 else x)
        ys.append(y)
        count += len(xs[-1])
    if not xs:
        raise SpecError(f"data callable {spec} yielded no batches; return (x, y) arrays or a non-empty iterable")
    labelled = {y is not None for y in ys}
    if len(labelled) > 1:
        raise SpecError(f"data callable {spec} yields labels in some batches only; label all batches or none")
    x = _concat(xs, spec)[:max_samples]
    y = _concat(ys, spec)[:max_samples] if labelled == {True} else None  # type: ignore[arg-type]
    return _make_dataset(x, y, spec, "x", None if y is None else "y")


def _data_from_callable(spec: str, target: _CallableSpec, max_samples: int) -> Dataset:
    """Call a user data function and read its result as one of the accepted shapes."""
    fn = _resolve_callable(spec, target, "data")
    try:
        result = fn()
    except Exception as exc:
        raise SpecError(f"data callable {spec} raised {_cause(exc)}; it must take no arguments") from exc
    if isinstance(result, Dataset):
        return _make_dataset(result.x, result.y, spec, "x", "y")
    if _is_array(result):
        return _make_dataset(result, None, spec, "x", None)
    if isinstance(result, tuple) and len(result) == 2 and _is_array(result[0]):
        return _make_dataset(result[0], result[1], spec, "x", "y")
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes, Mapping)):
        return _from_batches(iter(result), spec, max_samples)
    raise SpecError(f"data callable {spec} returned {_describe(result)}; return a tuple (x, y), x alone, a "
                    "Dataset or an iterable of batches")


def _unknown_data(spec: str) -> SpecError:
    if _looks_like_path(spec):
        return SpecError(f"data file {spec} not found; check the path")
    close = difflib.get_close_matches(spec, list(BUILTIN_DATA), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return SpecError(f"unknown data spec {spec!r}; {hint}give one of {', '.join(BUILTIN_DATA)}, a .npz/.npy file, "
                     "an image folder, or module:callable")


def _load_data_file(path: Path, image_size: int, max_samples: int, seed: int) -> Dataset:
    if path.is_dir():
        return _load_image_folder(path, image_size, max_samples, seed)
    loader = _DATA_FILE_LOADERS.get(path.suffix.lower())
    if loader is None:
        raise SpecError(f"data file {path} has unsupported suffix {path.suffix!r}; give a .npz or .npy file, "
                        "an image folder, or module:callable")
    return loader(path)


def _reshape(data: Dataset, input_shape: tuple[int, ...] | None, origin: str) -> Dataset:
    """Reshape every sample to ``input_shape`` (the sample count stays first)."""
    if input_shape is None:
        return data
    per_sample, wanted = math.prod(data.x.shape[1:]), math.prod(input_shape)
    if per_sample != wanted:
        raise SpecError(f"cannot reshape inputs from {origin} of shape {_shape(data.x)} to (N, "
                        f"{', '.join(map(str, input_shape))}): {per_sample} values per sample vs {wanted}; "
                        "fix input_shape")
    return Dataset(data.x.reshape(len(data.x), *input_shape), data.y)


def load_dataset(spec: str, *, seed: int = 0, input_shape: tuple[int, ...] | None = None,
                 image_size: int = 224, max_samples: int = 2048) -> Dataset:
    """Every sample one data spec names (no split).

    Args:
        spec: ``digits``/``digits-flat``/``digits-seq``/``digits32``, a ``.npz``/``.npy`` file, an image folder,
            or ``file.py:fn``/``package.module:fn``.
        seed: picks the subset when an image folder or batch iterable is capped.
        input_shape: reshape every sample to this shape (e.g. ``(1, 8, 8)``); sample count unchanged.
        image_size: image folders are resized and centre-cropped to ``image_size`` × ``image_size``.
        max_samples: cap for image folders and batch iterables (arrays already in memory are not capped).

    Raises:
        SpecError: the data cannot be loaded or fails validation (empty, NaN/inf, non-numeric, labels
            of the wrong length); the message names the file or spec and the array key.
    """
    target = _parse_callable(spec)
    if spec in BUILTIN_DATA:
        calib, held_out = BUILTIN_DATA[spec](seed, HOLDOUT_FRACTION)
        data = Dataset(torch.cat([calib.x, held_out.x]), torch.cat([calib.y, held_out.y]))
    elif target is not None:
        data = _data_from_callable(spec, target, max_samples)
    elif Path(spec).exists():
        data = _load_data_file(Path(spec), image_size, max_samples, seed)
    else:
        raise _unknown_data(spec)
    return _reshape(data, input_shape, spec)


def _split(data: Dataset, fraction: float, seed: int, spec: str) -> tuple[Dataset, Dataset]:
    calib, held_out = data.split(fraction, seed)
    if len(calib) == 0:
        raise SpecError(f"data {spec} has {len(data)} sample(s), too few to hold {fraction:.0%} out; give more "
                        "data, a smaller eval_fraction, or separate eval data")
    return calib, held_out


def _check_evaluation(evaluation: Dataset, what: str) -> None:
    """Held-out data must be large enough for a parity check at two batch sizes."""
    if len(evaluation) < MIN_EVAL_SAMPLES:
        raise SpecError(f"{what} has {len(evaluation)} sample(s); evaluation needs at least {MIN_EVAL_SAMPLES} "
                        "(parity is checked at two batch sizes) — give more samples")


def load_data(spec: str, *, eval_spec: str | None = None, eval_fraction: float = HOLDOUT_FRACTION, seed: int = 0,
              input_shape: tuple[int, ...] | None = None, image_size: int = 224,
              max_samples: int = 2048) -> LoadedData:
    """Calibration and evaluation data from one spec (seeded split) or two specs.

    Args:
        spec: the calibration data (see :func:`load_dataset`); without ``eval_spec`` a seeded
            ``eval_fraction`` of it is held out (the built-in digits use ``compress.datasets.digits``'s split).
        eval_spec: separate evaluation data; then all of ``spec`` is calibration data.
        eval_fraction: share held out when ``eval_spec`` is None, in [0, 1); 0 holds nothing out (all of
            ``spec`` is calibration data and ``evaluation`` is None).
        seed: seed of the split (and of capped subsets).
        input_shape, image_size, max_samples: as in :func:`load_dataset`, applied to both parts.

    Returns:
        :class:`LoadedData` with ``calib``, ``evaluation`` and a ``source`` line.

    Raises:
        SpecError: as :func:`load_dataset`, when the two parts disagree in per-sample shape, or when the
            evaluation data has fewer than :data:`MIN_EVAL_SAMPLES` samples.
    """
    options = {"seed": seed, "image_size": image_size, "max_samples": max_samples}
    if eval_spec is None and not 0.0 <= eval_fraction < 1.0:
        raise SpecError(f"eval_fraction (--calib-holdout) must lie in [0, 1), got {eval_fraction}")
    evaluation: Dataset | None
    if eval_spec is not None:
        calib, evaluation = load_dataset(spec, **options), load_dataset(eval_spec, **options)
        source = f"{spec} (calibration) + {eval_spec} (evaluation)"
        _check_evaluation(evaluation, f"evaluation data {eval_spec} (--eval-data)")
        if calib.x.shape[1:] != evaluation.x.shape[1:]:
            raise SpecError(f"calibration data {spec} has samples of shape {_shape(calib.x[0])} but evaluation "
                            f"data {eval_spec} has {_shape(evaluation.x[0])}; give matching data")
    elif eval_fraction == 0.0:
        calib, evaluation = load_dataset(spec, **options), None
        source = f"{spec} (all of it; nothing held out)"
    else:
        if spec in BUILTIN_DATA:
            calib, evaluation = BUILTIN_DATA[spec](seed, eval_fraction)
        else:
            calib, evaluation = _split(load_dataset(spec, **options), eval_fraction, seed, spec)
        source = f"{spec} (seed {seed}, {eval_fraction:.0%} held out)"
        _check_evaluation(evaluation, f"the {eval_fraction:.0%} held out of {spec}")
    return LoadedData(_reshape(calib, input_shape, spec),
                      None if evaluation is None else _reshape(evaluation, input_shape, eval_spec or spec), source)
