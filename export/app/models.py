"""Turn what a user names on the command line into a model and data (the input edge of the tool).

Model specs (``load_model``):

- ``resnet18`` — a torchvision architecture, built with random weights unless ``weights`` names a local
  state dict (nothing is ever downloaded);
- ``path/to/file.py:factory`` — a callable in a file, imported by path (``sys.path`` is left alone);
- ``package.module:factory`` — a callable in an importable module;
- ``model.pt2`` — a program written by ``torch.export.save``, loaded under a guard that lets only torch's
  weights-only unpickler run (see :mod:`export.pickle_guard`), unless trusted;
- ``model.pt`` / ``model.pth`` — a whole pickled ``nn.Module``, loaded only with ``trust_pickle=True``.

A state dict is never a model on its own: it goes in ``weights`` next to a factory or torchvision name.

Data specs (``load_data``, ``load_dataset``): ``digits``, ``digits-flat``, ``digits-seq`` (scikit-learn's
digits, offline); ``data.npz`` (inputs ``x``/``X``/``inputs``, optional labels ``y``/``Y``/``labels``/
``targets``); ``data.npy`` (inputs only); an image folder (one sub-folder per class, torchvision's
``ImageFolder`` conventions, resized and ImageNet-normalised); ``file.py:fn`` or ``package.module:fn``
returning ``(x, y)``, ``x``, a ``Dataset`` or an iterable of batches.

Untrusted files are never unpickled: ``np.load(..., allow_pickle=False)`` and
``torch.load(..., weights_only=True)`` unless the caller passes ``trust_pickle=True``.
Every failure is a :class:`SpecError` whose one-line message names the spec or file and what to do.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import pickle
import re
import sys
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from compress.data import Dataset
from compress.datasets import digits

__all__ = [
    "BUILTIN_DATA",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LoadedData",
    "MIN_EVAL_SAMPLES",
    "SpecError",
    "check_input_shape",
    "load_data",
    "load_dataset",
    "load_model",
]

logger = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INPUT_KEYS = ("x", "X", "inputs")
LABEL_KEYS = ("y", "Y", "labels", "targets")
PICKLE_SUFFIXES = (".pt", ".pth")
CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MIN_EVAL_SAMPLES = 2  # parity is verified at two batch sizes


class SpecError(ValueError):
    """A model or data spec cannot be loaded; the one-line message names the culprit and what to do."""


def _cause(exc: BaseException) -> str:
    """``"TypeError: first line of the message"``, without terminal colour codes, at most 200 characters."""
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _shape(t: torch.Tensor | np.ndarray) -> str:
    return str(tuple(int(d) for d in t.shape))


# --------------------------------------------------------------------------------------------------
# ``module:callable`` and ``file.py:callable``
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _CallableSpec:
    source: str  # a file path ending in .py, or a dotted module name
    attr: str  # possibly dotted attribute path inside the module

    @property
    def is_file(self) -> bool:
        return self.source.endswith(".py")


def _parse_callable(spec: str) -> _CallableSpec | None:
    """``"a/b.py:make"`` or ``"pkg.mod:make"`` → parts; anything else (paths, names) → None."""
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not all(part.isidentifier() for part in attr.split(".")):
        return None
    return _CallableSpec(source, attr)


def _import_file(path: Path) -> ModuleType:
    """Import a Python file by path under a private module name (registered so pickling/dataclasses work)."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_minreal_spec_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SpecError(f"cannot import {path} as a Python module; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_source(spec: str, target: _CallableSpec, kind: str) -> ModuleType:
    """The module a callable spec points into; import failures become one-line SpecErrors."""
    if target.is_file:
        path = Path(target.source)
        if not path.is_file():
            raise SpecError(f"{kind} file {path} not found (spec {spec!r}); check the path")
        try:
            return _import_file(path)
        except Exception as exc:
            raise SpecError(f"importing {path} failed ({_cause(exc)}); fix the file — its own imports must "
                            "be installed or on PYTHONPATH (minreal does not edit sys.path)") from exc
    try:
        return importlib.import_module(target.source)
    except Exception as exc:
        raise SpecError(f"cannot import module {target.source!r} from spec {spec!r} ({_cause(exc)}); install "
                        f"it, or give path/to/file.py:{target.attr}") from exc


def _resolve_callable(spec: str, target: _CallableSpec, kind: str) -> Callable[..., Any]:
    """Import the module and walk the (dotted) attribute; the result must be callable."""
    module = _import_source(spec, target, kind)
    obj: Any = module
    for part in target.attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"define {part} there"
            raise SpecError(f"{kind} factory {target.attr!r} not found in {target.source} (spec {spec!r}); {hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{target.attr!r} in {target.source} is a {type(obj).__name__}, not a callable "
                        f"(spec {spec!r}); name a function or class")
    return obj


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------

def _build_from_factory(spec: str, target: _CallableSpec, num_classes: int | None) -> nn.Module:
    """Call a user factory (with ``num_classes=`` when given) and insist on an ``nn.Module``."""
    factory = _resolve_callable(spec, target, "model")
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    try:
        model = factory(**kwargs)
    except Exception as exc:
        raise SpecError(f"model factory {spec} raised {_cause(exc)}; it must build the model with "
                        f"{'num_classes=' + str(num_classes) if kwargs else 'no arguments'}") from exc
    if not isinstance(model, nn.Module):
        raise SpecError(f"model factory {spec} returned a {type(model).__name__}, not a torch.nn.Module; "
                        "make it return the model")
    return model


def _build_torchvision(name: str, num_classes: int | None) -> nn.Module:
    """A torchvision architecture with random weights; backbones are never downloaded either."""
    from torchvision.models import get_model_builder, list_models

    names = list_models()
    if name not in names:
        close = difflib.get_close_matches(name.lower(), names, n=5)
        hint = f"did you mean {', '.join(close)}?" if close else "see torchvision.models.list_models()"
        raise SpecError(f"unknown model spec {name!r}: not a file, a module:factory or a torchvision "
                        f"architecture; {hint}")
    builder = get_model_builder(name)
    kwargs: dict[str, Any] = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    try:
        return builder(**kwargs)
    except Exception as exc:
        raise SpecError(f"building torchvision model {name!r} failed ({_cause(exc)}); check num_classes") from exc


_PT2_PROGRAM_MEMBER = r"(^|/)(models/[^/]+\.json|serialized_exported_program\.json)$"  # 2.8+ / 2.7 layout
_PT2_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # torchbind / opaque constants: always unpickled
# Loggers torch.export.load writes to while deserializing; their records (one of which has a broken format
# string in torch 2.14 and prints "--- Logging error ---" with a traceback) are kept off stderr.
_PT2_NOISY_LOGGERS = ("torch._export.serde.serialize", "torch.export", "torch.export.pt2_archive._package")
_TRUST_HINT = ("pass trust_pickle=True (--trust-pickle) only if you trust the file: it lets torch unpickle "
               "arbitrary Python objects from it, which can run code")


def _check_pt2_archive(path: Path, trust_pickle: bool) -> None:
    """A complete zip archive (CRC-checked), and without pickled custom objects unless trusted.

    This is only for clear messages; safety comes from loading under :func:`no_unpickling`.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            names = zf.namelist()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise SpecError(f"{path} is not a complete .pt2 archive (truncated or corrupt: {_cause(exc)}); "
                        "re-save it with torch.export.save") from exc
    if bad is not None:
        raise SpecError(f"{path} is corrupt: archive member {bad} fails its CRC check (truncated or damaged "
                        "file); re-save it with torch.export.save")
    if not any(re.search(_PT2_PROGRAM_MEMBER, n) for n in names):
        # zipfile also finds the directory of a zip *nested* in a cut-off archive (torch.save members are zips)
        raise SpecError(f"{path} is not a complete .pt2 archive (truncated or corrupt: it holds no exported "
                        "program); re-save it with torch.export.save")
    objects = [n for n in names if n.rsplit("/", 1)[-1].startswith(_PT2_OBJECT_PREFIXES)]
    if objects and not trust_pickle:
        raise SpecError(f"{path} holds pickled custom objects ({_first_and_more(objects)}); {_TRUST_HINT}")


class _DropRecords(logging.Filter):
    """Keeps torch's deserialization log records off stderr; their gist goes to this module's debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger.debug("torch.export.load (%s): %s", record.name, record.msg)
        return False


@contextmanager
def _quiet_torch_export_logs() -> Iterator[None]:
    drop = _DropRecords()
    loggers = [logging.getLogger(name) for name in _PT2_NOISY_LOGGERS]
    for log in loggers:
        log.addFilter(drop)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(drop)


@contextmanager
def _guard(trust_pickle: bool) -> Iterator[list[str]]:
    """:func:`export.pickle_guard.no_unpickling`, or nothing (an always-empty refusal list) when trusted."""
    from export.pickle_guard import no_unpickling

    if trust_pickle:
        yield []
        return
    with no_unpickling() as refusals:
        yield refusals


def _load_exported(path: Path, trust_pickle: bool = False) -> nn.Module:
    """``torch.export.load(path).module()``; the graph keeps the train/eval mode it was exported in.

    A .pt2 archive can hold pickles (sample inputs, pickled tensors, custom objects) that
    ``torch.export.load`` would unpickle in full. Unless ``trust_pickle`` is set, the load runs under
    :func:`export.pickle_guard.no_unpickling`, so only torch's weights-only unpickler can run.
    """
    _check_pt2_archive(path, trust_pickle)
    refusals: list[str] = []
    try:
        with _quiet_torch_export_logs(), _guard(trust_pickle) as refusals, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the verdict below says it all
            module = torch.export.load(path).module()
    except Exception as exc:
        if refusals:
            raise SpecError(f"{path} holds objects that need full unpickling ({refusals[0]}); "
                            f"{_TRUST_HINT}") from exc
        raise SpecError(f"could not load torch.export program {path} ({_cause(exc)}); re-save it with "
                        f"torch.export.save under torch {torch.__version__}") from exc
    if refusals:  # torch caught a refusal and carried on: the file still asked for unpickling
        raise SpecError(f"{path} holds objects that need full unpickling ({refusals[0]}); {_TRUST_HINT}")
    # ExportedProgram.module() replaces train()/eval() with methods that raise; the flag cannot change the
    # traced graph, so restore nn.Module's own methods and let callers switch the flag harmlessly.
    for method in ("train", "eval"):
        module.__dict__.pop(method, None)
    return module


def _load_pickled_module(path: Path, trust_pickle: bool) -> nn.Module:
    """A whole pickled ``nn.Module``: refused unless trusted; a state dict here is told where it belongs."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            raise SpecError(f"{path} holds pickled Python objects and loading it can run arbitrary code; pass "
                            "trust_pickle=True (--trust-pickle) only if you trust its source, or save a .pt2 "
                            "with torch.export") from exc
        obj = _unpickle_trusted(path)
    except Exception as exc:
        raise SpecError(f"could not read model file {path} ({_cause(exc)}); it must be written by torch.save") from exc
    if isinstance(obj, Mapping):
        raise SpecError(f"{path} holds a state dict, not a model; give the architecture as the spec (a "
                        "torchvision name or file.py:factory) and this file as weights")
    if not isinstance(obj, nn.Module):
        raise SpecError(f"{path} holds a {type(obj).__name__}, not a torch.nn.Module; save the model itself")
    return obj


def _unpickle_trusted(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise SpecError(f"could not unpickle {path} ({_cause(exc)}); the classes it references must be "
                        "importable") from exc


_MODEL_FILE_LOADERS: dict[str, Callable[[Path, bool], nn.Module]] = {
    ".pt2": _load_exported,
    **{suffix: _load_pickled_module for suffix in PICKLE_SUFFIXES},
}


def _looks_like_path(spec: str) -> bool:
    return bool(Path(spec).suffix) or "/" in spec or "\\" in spec


def _load_model_file(spec: str, trust_pickle: bool) -> nn.Module:
    """Dispatch a file spec on its suffix; a missing or unsupported file gets a precise message."""
    path = Path(spec)
    loader = _MODEL_FILE_LOADERS.get(path.suffix.lower())
    if not path.is_file():
        raise SpecError(f"model file {path} not found; check the path")
    if path.suffix == ".py":
        raise SpecError(f"{path} is a Python file; name the factory in it, e.g. {path}:build_model")
    if loader is None:
        raise SpecError(f"model file {path} has unsupported suffix {path.suffix!r}; give a .pt2 program, a "
                        ".pt/.pth pickled module, path/to/file.py:factory or a torchvision name")
    return loader(path, trust_pickle)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _describe(obj: Any) -> str:
    if isinstance(obj, Mapping):
        keys = ", ".join(repr(k) for k in list(obj)[:5])
        return f"a dict with keys {keys}{', ...' if len(obj) > 5 else ''}"
    return f"a {type(obj).__name__}"


def _with_metadata(items: Iterable[tuple[str, torch.Tensor]], metadata: Any) -> OrderedDict[str, torch.Tensor]:
    """A state dict of ``items`` carrying torch's per-module ``_metadata`` (module versions), if there is one.

    ``load_state_dict`` reads the versions to upgrade old checkpoints (e.g. BatchNorm fills a missing
    ``num_batches_tracked`` in state dicts from before torch 0.4.1), so copies must keep them.
    """
    out: OrderedDict[str, torch.Tensor] = OrderedDict(items)
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out


def _read_state_dict(path: Path) -> OrderedDict[str, torch.Tensor]:
    """Load a state dict with ``weights_only=True``; unwrap ``{"state_dict": ...}``-style checkpoints."""
    if not path.is_file():
        raise SpecError(f"weights file {path} not found; check the path")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise SpecError(f"weights file {path} holds pickled objects, not a plain state dict; save it with "
                        "torch.save(model.state_dict(), path)") from exc
    except Exception as exc:
        raise SpecError(f"could not read weights file {path} ({_cause(exc)}); it must be written by torch.save") from exc
    if not _is_state_dict(obj) and isinstance(obj, Mapping):
        inner = next((k for k in CHECKPOINT_KEYS if _is_state_dict(obj.get(k))), None)
        if inner is not None:
            logger.info("using the %r entry of checkpoint %s as the state dict", inner, path)
            obj = obj[inner]
    if not _is_state_dict(obj):
        raise SpecError(f"weights file {path} holds {_describe(obj)}, not a state dict (names → tensors); "
                        "save it with torch.save(model.state_dict(), path)")
    return _with_metadata(obj.items(), getattr(obj, "_metadata", None))


def _strip_wrapper_prefix(state: OrderedDict[str, torch.Tensor], expected: Mapping[str, Any]
                          ) -> OrderedDict[str, torch.Tensor]:
    """Drop a DataParallel/``torch.compile`` prefix that every key carries and the model's keys lack."""
    for prefix in WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
            logger.info("stripping prefix %r from every weight name", prefix)
            meta = getattr(state, "_metadata", None)
            if meta is not None:
                root = prefix[:-1]
                meta = {("" if k == root else k[len(prefix):]): v for k, v in meta.items()
                        if k == root or k.startswith(prefix)}
            return _with_metadata(((k[len(prefix):], v) for k, v in state.items()), meta)
    return state


def _first_and_more(keys: list[str]) -> str:
    return f"{keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")


def _check_fit(missing: list[str], unexpected: list[str], mismatched: list[str],
               state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], where: str) -> None:
    """Name the first missing key, unexpected key or shape mismatch (keys as torch's ``load_state_dict`` reports
    them, so whatever torch accepts, such as BatchNorm's ``num_batches_tracked`` in old checkpoints, passes)."""
    hint = "check that the weights belong to this architecture"
    if missing:
        raise SpecError(f"{where}: missing key {_first_and_more(missing)}; {hint}")
    if unexpected:
        raise SpecError(f"{where}: unexpected key {_first_and_more(unexpected)}; {hint}")
    if mismatched:
        k = mismatched[0]
        raise SpecError(f"{where}: shape mismatch at {_first_and_more(mismatched)}: file has "
                        f"{_shape(state[k])}, model has {_shape(expected[k])}; {hint} (and num_classes)")


def _load_weights(model: nn.Module, weights: Path, spec: str) -> None:
    """Load a state dict exactly as ``model.load_state_dict(state, strict=True)`` would accept it.

    Keys with a shape mismatch are held back (torch would raise a multi-line error on them); torch itself
    then reports missing and unexpected keys, and any of the three makes a one-line :class:`SpecError`.
    """
    where = f"weights {weights} do not fit model {spec}"
    expected = model.state_dict()
    state = _strip_wrapper_prefix(_read_state_dict(weights), expected)
    mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    fitting = _with_metadata(((k, v) for k, v in state.items() if k not in mismatched),
                             getattr(state, "_metadata", None))
    try:
        result = model.load_state_dict(fitting, strict=False)
    except Exception as exc:
        raise SpecError(f"{where} ({_cause(exc)})") from exc
    missing = [k for k in result.missing_keys if k not in mismatched]
    _check_fit(missing, list(result.unexpected_keys), mismatched, state, expected, where)


def load_model(spec: str, weights: str | Path | None = None, trust_pickle: bool = False,
               num_classes: int | None = None) -> nn.Module:
    """Build or load the model a spec names, on CPU and in eval mode.

    Args:
        spec: a torchvision architecture name (``"resnet18"``), ``path/to/file.py:factory``,
            ``package.module:factory``, a ``torch.export`` program ``*.pt2``, or a pickled module
            ``*.pt``/``*.pth`` (only with ``trust_pickle``).
        weights: a local state-dict file (``torch.save(model.state_dict(), path)``) loaded with
            ``weights_only=True`` into a torchvision model or a factory's model; keys and shapes must match.
        trust_pickle: allow unpickling a whole module from ``*.pt``/``*.pth`` (can run arbitrary code).
        num_classes: passed as ``num_classes=`` to the torchvision builder or the factory.

    Returns:
        The model. A ``.pt2`` program keeps the mode it was exported in; its ``eval()`` only sets the flag.

    Raises:
        SpecError: the spec, weights or file cannot be used; the message names it and what to do.
    """
    target = _parse_callable(spec)
    is_file = target is None and (_looks_like_path(spec) or Path(spec).exists())
    if is_file and (num_classes is not None or (weights is not None and spec.endswith(".pt2"))):
        raise SpecError(f"model file {spec} already fixes its architecture and weights; drop num_classes/weights "
                        "or give a factory or torchvision name instead")
    if target is not None:
        model = _build_from_factory(spec, target, num_classes)
    elif is_file:
        model = _load_model_file(spec, trust_pickle)
    else:
        model = _build_torchvision(spec, num_classes)
        if weights is None:
            logger.warning("%s has random weights: no weights file given (minreal never downloads); pass a "
                           "local state dict as weights", spec)
    if weights is not None:
        _load_weights(model, Path(weights), spec)
    return model.eval()


def check_input_shape(model: nn.Module, x: torch.Tensor, model_spec: str = "model") -> Any:
    """Run ``model`` on the first two samples of ``x`` and return its output.

    Raises:
        SpecError: ``"<model_spec>: model forward failed on input of shape (2, 1, 8, 8): <cause>"``.
    """
    batch = x[:2]
    try:
        with torch.no_grad():
            return model(batch)
    except Exception as exc:
        raise SpecError(f"{model_spec}: model forward failed on input of shape {_shape(batch)}: {_cause(exc)}; "
                        "check that the data (or input_shape) matches what the model expects") from exc


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------

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


def _digits_seq(seed: int = 0, test_fraction: float = 0.25) -> tuple[Dataset, Dataset]:
    """Digits read pixel by pixel: sequences (N, 64, 1), same split as ``digits``.

    Replace with ``compress.datasets.sequential_digits`` once that is committed.
    """
    train, test = digits(seed, test_fraction, as_images=False)
    return Dataset(train.x.unsqueeze(-1), train.y), Dataset(test.x.unsqueeze(-1), test.y)


BUILTIN_DATA: dict[str, Callable[[int, float], tuple[Dataset, Dataset]]] = {
    "digits": partial(digits, as_images=True),
    "digits-flat": partial(digits, as_images=False),
    "digits-seq": _digits_seq,
}
"""Built-in data by name: ``(seed, eval_fraction) -> (calib, evaluation)``; shapes (N,1,8,8), (N,64), (N,64,1)."""


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
        spec: ``digits``/``digits-flat``/``digits-seq``, a ``.npz``/``.npy`` file, an image folder,
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
        calib, held_out = BUILTIN_DATA[spec](seed, 0.25)
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


def load_data(spec: str, *, eval_spec: str | None = None, eval_fraction: float = 0.25, seed: int = 0,
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
