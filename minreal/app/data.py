"""Load the data a spec names (the data half of the tool's input edge).

Data specs (``load_data``, ``load_dataset``): ``digits``, ``digits-flat``, ``digits-seq`` (scikit-learn's
digits, offline), ``digits32`` (the same digits upsampled to 3×32×32, CIFAR-sized, with the same split);
``data.npz`` (inputs ``x``/``X``/``inputs``, or, for a model with several inputs, one array per input keyed by
the ``forward`` parameter's name, e.g. ``input_ids`` and ``attention_mask``; optional labels
``y``/``Y``/``labels``/``targets``); ``data.npy``
(inputs only); an image folder (one sub-folder per class, torchvision's
``ImageFolder`` conventions, preprocessed as an :class:`~minreal.app.preprocess.ImagePreprocess` says: by default
224×224 with ImageNet statistics, warning when that upscales small images); ``file.py:fn`` or ``package.module:fn``
returning ``(x, y)``, ``x``, a ``Dataset`` or an iterable of batches.

Nothing is unpickled: ``np.load(..., allow_pickle=False)``. Every failure is a :class:`SpecError` whose
one-line message names the spec or file and what to do.
"""

from __future__ import annotations

import difflib
import logging
import math
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from minreal.app.callables import (
    SpecError,
    _CallableSpec,
    _cause,
    _describe,
    _looks_like_path,
    _parse_callable,
    _resolve_callable,
    _shape,
)
from minreal.app.preprocess import DEFAULT_SOURCE, ImagePreprocess
from minreal.app.settings import HOLDOUT_FRACTION
from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import Inputs, NamedInputs, sample_shapes
from minreal.compress.datasets import digits, digits32, sequential_digits

__all__ = [
    "BUILTIN_DATA",
    "LoadedData",
    "MIN_EVAL_SAMPLES",
    "load_data",
    "load_dataset",
    "require_image_folder",
]

logger = logging.getLogger(__name__)

INPUT_KEYS = ("x", "X", "inputs")
LABEL_KEYS = ("y", "Y", "labels", "targets")
MIN_EVAL_SAMPLES = 2  # parity is verified at two batch sizes


@dataclass(frozen=True)
class LoadedData:
    """Calibration (and training) data, held-out evaluation data, and a one-line account of both.

    Attributes
    ----------
    calib : Dataset
        samples handed to compression methods.
    evaluation : Dataset | None
        held-out samples used to measure what compression changed (None when nothing is
        held out).
    source : str
        where both came from (for reports), e.g. ``"digits (seed 0, 25% held out)"``.
    """

    calib: Dataset
    evaluation: Dataset | None
    source: str




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


def _input_tensor(x: Any, origin: str, key: str) -> torch.Tensor:
    """One validated input array: numeric, non-empty, finite."""
    xt = _to_tensor(x, origin, key)
    if xt.ndim == 0 or len(xt) == 0:
        raise SpecError(f"{key!r} in {origin} holds no samples (shape {_shape(xt)}); give at least one sample")
    _check_finite(xt, origin, key)
    return xt


def _named_inputs(x: Mapping[str, Any], origin: str) -> NamedInputs:
    """Validated named inputs: every array numeric, non-empty, finite, with the same sample count."""
    x = x.tensors if isinstance(x, NamedInputs) else x
    if not x:
        raise SpecError(f"{origin} gives an empty mapping of inputs; give one array per model input")
    bad = [k for k in x if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise SpecError(f"input names {bad} in {origin} are not identifiers; key each input by its forward "
                        "parameter name")
    tensors = {k: _input_tensor(v, origin, k) for k, v in x.items()}
    counts = {k: len(t) for k, t in tensors.items()}
    if len(set(counts.values())) > 1:
        raise SpecError(f"inputs in {origin} have different sample counts {counts}; give every input one row per "
                        "sample")
    return NamedInputs(tensors)


def _make_dataset(x: Any, y: Any | None, origin: str, x_key: str, y_key: str | None) -> Dataset:
    """Validated ``Dataset``: numeric, non-empty, finite, and as many labels as inputs (``x`` may map input names
    to arrays, for a model with several inputs)."""
    xt: Inputs = _named_inputs(x, origin) if isinstance(x, (Mapping, NamedInputs)) and not _is_array(x) \
        else _input_tensor(x, origin, x_key)
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


def _check_declared_size(fp: BinaryIO, room: int, what: str) -> None:
    """Refuse an ``.npy`` stream (``fp`` at its start, ``room`` bytes long) whose header declares more data than
    the stream holds: read before the array is allocated, so a few bytes declaring 10^12 elements allocate nothing.
    Object arrays pass (they are refused as pickles when read)."""
    try:
        version = np.lib.format.read_magic(fp)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(fp)
    except Exception as exc:
        raise SpecError(f"{what} has no valid .npy header ({_cause(exc)}); write it again with np.save(z)") from exc
    if dtype.hasobject:
        return
    declared, held = math.prod(shape) * dtype.itemsize, room - fp.tell()
    if declared > held:
        raise SpecError(f"{what} declares shape {tuple(shape)} of {dtype} ({declared} bytes) but holds {held} bytes "
                        "of data; the file is corrupt or truncated: write it again with np.save(z)")


def _read_npz_array(archive: Any, key: str, path: Path) -> np.ndarray:
    what = f"array {key!r} in {path}"
    member = f"{key}.npy" if f"{key}.npy" in archive.zip.namelist() else key
    info = archive.zip.getinfo(member)
    room = info.file_size if info.compress_type != zipfile.ZIP_STORED else min(info.file_size, info.compress_size)
    try:
        with archive.zip.open(member) as fp:
            _check_declared_size(fp, room, what)
        return archive[key]
    except SpecError:
        raise
    except ValueError as exc:
        if "pickle" not in str(exc).lower():
            raise SpecError(f"could not read {what} ({_cause(exc)}); write it again with np.savez") from exc
        raise SpecError(f"{what} holds pickled objects (dtype object), which are not loaded; "
                        "save a numeric array") from exc
    except Exception as exc:  # a damaged archive: bad CRC, short member, bad compressed data
        raise SpecError(f"could not read {what} ({_cause(exc)}); the file is corrupt or truncated: write it "
                        "again with np.savez") from exc


def _load_npz(path: Path) -> Dataset:
    """Inputs under x/X/inputs (or every non-label key: one named input each), optional labels under
    y/Y/labels/targets."""
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise SpecError(f"could not read {path} as .npz ({_cause(exc)}); write it with np.savez") from exc
    if not hasattr(archive, "files"):
        raise SpecError(f"{path} holds a single array, not an .npz archive; rename it to .npy")
    with archive:
        keys = list(archive.files)
        x_key = _pick_key(keys, INPUT_KEYS, path, "input")
        y_key = _pick_key(keys, LABEL_KEYS, path, "label")
        named = [k for k in keys if k not in LABEL_KEYS]
        if x_key is None and not named:
            raise SpecError(f"{path} has no input array: found keys {keys}; name the inputs one of "
                            f"{', '.join(INPUT_KEYS)}, or key each input by its forward parameter name (labels: "
                            f"{', '.join(LABEL_KEYS)})")
        if x_key is not None and len(named) > 1:
            raise SpecError(f"{path} has an input array {x_key!r} and other arrays {[k for k in named if k != x_key]}; "
                            "give one input as x, or key every input by its forward parameter name")
        x: Any = _read_npz_array(archive, x_key, path) if x_key is not None else \
            {k: _read_npz_array(archive, k, path) for k in named}
        y = None if y_key is None else _read_npz_array(archive, y_key, path)
    return _make_dataset(x, y, str(path), x_key or "inputs", y_key)


def _load_npy(path: Path) -> Dataset:
    """A single input array, no labels."""
    with path.open("rb") as fp:
        if fp.read(6) == b"\x93NUMPY":
            fp.seek(0)
            _check_declared_size(fp, path.stat().st_size, str(path))
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


UPSCALE_WARN_FACTOR = 2.0
"""Default preprocessing warns when it enlarges every image's short side by at least this factor."""


def _warn_if_upscaled(root: Path, sizes: set[tuple[int, int]], prep: ImagePreprocess) -> None:
    """Warn when preprocessing nobody chose (224×224, ImageNet statistics) upscales every image by ≥ 2× (e.g.
    32×32 CIFAR images): the model most likely expects its own size and statistics."""
    largest = max(min(w, h) for w, h in sizes)
    if prep.source != DEFAULT_SOURCE or largest * UPSCALE_WARN_FACTOR > prep.resize_to:
        return
    if len(sizes) == 1:
        (w, h), = sizes
        seen, hint = f"all {w}x{h}", str(h) if w == h else f"{h}x{w}"
    else:
        seen, hint = f"at most {largest} px on the short side", "N"
    logger.warning("image folder %s: the images are %s but are upscaled to %dx%d and normalised with ImageNet "
                   "statistics (the default, as no preprocessing was given); for a model trained on small images "
                   "pass --image-size %s and its --mean/--std (or --preprocess WEIGHTS_ENTRY)", root, seen,
                   *prep.size, hint)


def _load_image_folder(root: Path, prep: ImagePreprocess, max_samples: int, seed: int) -> Dataset:
    """RGB images preprocessed as ``prep`` says (resize, centre crop, normalise), with their class labels."""
    from torchvision import datasets

    try:
        folder = datasets.ImageFolder(str(root))
    except Exception as exc:
        raise SpecError(f"image folder {root} cannot be read ({_cause(exc)}); it needs one sub-folder per class "
                        "holding image files") from exc
    transform = prep.transform()
    xs, ys, sizes = [], [], set()
    for i in _capped_indices(len(folder), max_samples, seed, str(root)):
        path, label = folder.samples[i]
        try:
            image = folder.loader(path)
            xs.append(transform(image))
        except Exception as exc:
            raise SpecError(f"could not read image {path} ({_cause(exc)}); fix or remove it") from exc
        sizes.add(image.size)
        ys.append(label)
    _warn_if_upscaled(root, sizes, prep)
    return Dataset(torch.stack(xs), torch.tensor(ys, dtype=torch.int64))


def _is_array(a: Any) -> bool:
    return isinstance(a, (torch.Tensor, np.ndarray))


def _batch_parts(batch: Any, origin: str) -> tuple[Inputs, torch.Tensor | None]:
    """``x``, ``(x,)``, ``(x, y)``, ``[x, y]``, a ``Dataset``, or any of these with ``x`` a dict of named inputs
    → tensors."""
    if isinstance(batch, Dataset):
        batch = (batch.x, batch.y)
    elif _is_array(batch) or isinstance(batch, Mapping):
        batch = (batch,)
    if not isinstance(batch, (tuple, list)) or len(batch) not in (1, 2):
        raise SpecError(f"{origin} is {_describe(batch)}; yield x, (x, y) or ({{name: x}}, y) arrays/tensors")
    first = batch[0]
    x: Inputs = NamedInputs({k: _to_tensor(v, origin, k) for k, v in first.items()}) \
        if isinstance(first, Mapping) and first else _to_tensor(first, origin, "x")
    y = None if len(batch) == 1 or batch[1] is None else _to_tensor(batch[1], origin, "y")
    return x, y


def _concat(parts: list[Any], origin: str) -> Any:
    if isinstance(parts[0], NamedInputs):
        names = {tuple(p.names) for p in parts}
        if len(names) > 1:
            raise SpecError(f"batches from {origin} name different inputs {sorted(names)}; yield the same names "
                            "in every batch")
        return NamedInputs({n: _concat([p.tensors[n] for p in parts], f"{origin} (input {n!r})")
                            for n in parts[0].names})
    try:
        return torch.cat(parts)
    except RuntimeError as exc:
        shapes = sorted({_shape(p[0]) for p in parts if p.ndim and len(p)})
        raise SpecError(f"batches from {origin} have different sample shapes {', '.join(shapes)}; every batch "
                        "needs the same per-sample shape (pad sequences to one length per call)") from exc


def _from_batches(batches: Iterator[Any], spec: str, max_samples: int) -> Dataset:
    """Concatenate batches (stopping after ``max_samples`` samples, so an endless iterator is fine)."""
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor | None] = []
    count = 0
    while count < max_samples and (batch := next(batches, None)) is not None:
        x, y = _batch_parts(batch, f"batch {len(xs)} from {spec}")
        xs.append(x.reshape(1) if isinstance(x, torch.Tensor) and x.ndim == 0 else x)
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
    if _is_array(result) or isinstance(result, Mapping):
        return _make_dataset(result, None, spec, "x", None)
    if isinstance(result, tuple) and len(result) == 2 and (_is_array(result[0]) or isinstance(result[0], Mapping)):
        return _make_dataset(result[0], result[1], spec, "x", "y")
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes, Mapping)):
        return _from_batches(iter(result), spec, max_samples)
    raise SpecError(f"data callable {spec} returned {_describe(result)}; return a tuple (x, y), x alone (x may "
                    "be a dict of named inputs), a Dataset or an iterable of batches")


def _unknown_data(spec: str) -> SpecError:
    if _looks_like_path(spec):
        return SpecError(f"data file {spec} not found; check the path")
    close = difflib.get_close_matches(spec, list(BUILTIN_DATA), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return SpecError(f"unknown data spec {spec!r}; {hint}give one of {', '.join(BUILTIN_DATA)}, a .npz/.npy file, "
                     "an image folder, or module:callable")


def _is_image_folder(spec: str) -> bool:
    return spec not in BUILTIN_DATA and _parse_callable(spec) is None and Path(spec).is_dir()


def require_image_folder(preprocess: ImagePreprocess | None, *specs: str | None) -> None:
    """Image preprocessing given for data none of whose ``specs`` is an image folder is an error, not ignored."""
    if preprocess is not None and not any(_is_image_folder(s) for s in specs if s):
        named = " / ".join(s for s in specs if s)
        what = f"data {named} is not one" if named else "no data was given"
        raise SpecError(f"--image-size/--mean/--std/--preprocess apply to image folders, and {what}; drop them "
                        "(arrays and callables are used as they are)")


def _load_data_file(path: Path, prep: ImagePreprocess, max_samples: int, seed: int) -> Dataset:
    if path.is_dir():
        return _load_image_folder(path, prep, max_samples, seed)
    loader = _DATA_FILE_LOADERS.get(path.suffix.lower())
    if loader is None:
        raise SpecError(f"data file {path} has unsupported suffix {path.suffix!r}; give a .npz or .npy file, "
                        "an image folder, or module:callable")
    return loader(path)


def _reshape(data: Dataset, input_shape: tuple[int, ...] | None, origin: str) -> Dataset:
    """Reshape every sample to ``input_shape`` (the sample count stays first)."""
    if input_shape is None:
        return data
    if isinstance(data.x, NamedInputs):
        raise SpecError(f"{origin} holds named inputs {data.x.names}; a per-sample input_shape applies to one "
                        "unnamed input only (name each shape: --input-shape NAME:SHAPE:DTYPE)")
    per_sample, wanted = math.prod(data.x.shape[1:]), math.prod(input_shape)
    if per_sample != wanted:
        raise SpecError(f"cannot reshape inputs from {origin} of shape {_shape(data.x)} to (N, "
                        f"{', '.join(map(str, input_shape))}): {per_sample} values per sample vs {wanted}; "
                        "fix input_shape")
    return Dataset(data.x.reshape(len(data.x), *input_shape), data.y)


def load_dataset(spec: str, *, seed: int = 0, input_shape: tuple[int, ...] | None = None,
                 image_size: int = 224, max_samples: int = 2048,
                 preprocess: ImagePreprocess | None = None) -> Dataset:
    """Every sample one data spec names (no split).

    Parameters
    ----------
    spec : str
        ``digits``/``digits-flat``/``digits-seq``/``digits32``, a ``.npz``/``.npy`` file, an image folder,
        or ``file.py:fn``/``package.module:fn``.
    seed : int
        picks the subset when an image folder or batch iterable is capped.
    input_shape : tuple[int, ...] | None
        reshape every sample to this shape (e.g. ``(1, 8, 8)``); sample count unchanged.
    image_size : int
        without ``preprocess``, image folders are resized and centre-cropped to ``image_size`` ×
        ``image_size`` and ImageNet-normalised (with a warning when that upscales every image ≥ 2×).
    max_samples : int
        cap for image folders and batch iterables (arrays already in memory are not capped).
    preprocess : ImagePreprocess | None
        how image folders become inputs (size, resize, mean, std); other specs ignore it (see
        :func:`require_image_folder`).

    Raises
    ------
    SpecError
        the data cannot be loaded or fails validation (empty, NaN/inf, non-numeric, labels
        of the wrong length); the message names the file or spec and the array key.
    """
    target = _parse_callable(spec)
    if spec in BUILTIN_DATA:
        calib, held_out = BUILTIN_DATA[spec](seed, HOLDOUT_FRACTION)
        data = Dataset(torch.cat([calib.x, held_out.x]), torch.cat([calib.y, held_out.y]))
    elif target is not None:
        data = _data_from_callable(spec, target, max_samples)
    elif Path(spec).exists():
        prep = preprocess or ImagePreprocess(size=(image_size, image_size))
        data = _load_data_file(Path(spec), prep, max_samples, seed)
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


def _check_matching(calib: Inputs, evaluation: Inputs, spec: str, eval_spec: str) -> None:
    """Calibration and evaluation data must feed the same inputs: same shape per sample for one tensor; for named
    inputs the same names, dtypes and ranks (lengths may differ: such an axis is a dynamic one, e.g. a sequence)."""
    a, b = sample_shapes(calib), sample_shapes(evaluation)
    if isinstance(calib, NamedInputs) != isinstance(evaluation, NamedInputs) or list(a) != list(b):
        raise SpecError(f"calibration data {spec} has inputs {list(a)} but evaluation data {eval_spec} has "
                        f"{list(b)}; give matching data")
    if not isinstance(calib, NamedInputs):
        if a != b:
            raise SpecError(f"calibration data {spec} has samples of shape {_shape(calib[0])} but evaluation "
                            f"data {eval_spec} has {_shape(evaluation[0])}; give matching data")
        return
    for name in a:
        ta, tb = calib.tensors[name], evaluation.tensors[name]
        if ta.ndim != tb.ndim or ta.dtype != tb.dtype:
            raise SpecError(f"input {name!r} is {ta.dtype} of shape {_shape(ta[0])} in {spec} but {tb.dtype} of "
                            f"shape {_shape(tb[0])} in {eval_spec}; give matching data")


def load_data(spec: str, *, eval_spec: str | None = None, eval_fraction: float = HOLDOUT_FRACTION, seed: int = 0,
              input_shape: tuple[int, ...] | None = None, image_size: int = 224,
              max_samples: int = 2048, preprocess: ImagePreprocess | None = None) -> LoadedData:
    """Calibration and evaluation data from one spec (seeded split) or two specs.

    Parameters
    ----------
    spec : str
        the calibration data (see :func:`load_dataset`); without ``eval_spec`` a seeded
        ``eval_fraction`` of it is held out (the built-in digits use ``minreal.compress.datasets.digits``'s split).
    eval_spec : str | None
        separate evaluation data; then all of ``spec`` is calibration data.
    eval_fraction : float
        share held out when ``eval_spec`` is None, in [0, 1); 0 holds nothing out (all of
        ``spec`` is calibration data and ``evaluation`` is None).
    seed : int
        seed of the split (and of capped subsets).
    input_shape, image_size, max_samples, preprocess
        as in :func:`load_dataset`, applied to both parts;
        ``preprocess`` when neither part is an image folder is an error.

    Returns
    -------
    LoadedData
        :class:`LoadedData` with ``calib``, ``evaluation`` and a ``source`` line.

    Raises
    ------
    SpecError
        as :func:`load_dataset`, when the two parts disagree in per-sample shape, or when the
        evaluation data has fewer than :data:`MIN_EVAL_SAMPLES` samples.
    """
    require_image_folder(preprocess, spec, eval_spec)
    options = {"seed": seed, "image_size": image_size, "max_samples": max_samples, "preprocess": preprocess}
    if eval_spec is None and not 0.0 <= eval_fraction < 1.0:
        raise SpecError(f"eval_fraction (--data-holdout) must lie in [0, 1), got {eval_fraction}")
    evaluation: Dataset | None
    if eval_spec is not None:
        calib, evaluation = load_dataset(spec, **options), load_dataset(eval_spec, **options)
        source = f"{spec} (calibration) + {eval_spec} (evaluation)"
        _check_evaluation(evaluation, f"evaluation data {eval_spec} (--eval-data)")
        _check_matching(calib.x, evaluation.x, spec, eval_spec)
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
