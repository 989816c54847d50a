"""Build or load the model a spec names (the model half of the tool's input edge).

- ``resnet18`` — a torchvision architecture, built with random weights unless ``weights`` names a local
  state dict (nothing is ever downloaded);
- ``resnet20_cifar`` — a built-in architecture (:data:`BUILTIN_MODELS`), random or ``weights`` as above;
- ``timm:resnet50`` — a timm architecture, ``hf:bert`` — a Hugging Face family at its base size, its outputs a
  dict of named tensors (both :mod:`minreal.app.hub`, nothing downloaded), random or ``weights`` as above;
- ``path/to/file.py:factory`` — a callable in a file, imported by path (``sys.path`` is left alone);
- ``package.module:factory`` — a callable in an importable module;
- ``model.pt2`` — a program written by ``torch.export.save``, loaded under a guard that lets only torch's
  weights-only unpickler run (see :mod:`minreal.export.pickle_guard`), unless trusted;
- ``model.pt`` / ``model.pth`` — a whole pickled ``nn.Module``, loaded only with ``trust_pickle=True``.

A spec is read in this order: a hub prefix (``timm:``, ``hf:``) first, so that ``timm:NAME`` is never taken
for ``module:factory`` (a user's own module of that name is given as ``path/to/timm.py:make`` or
``mypkg.timm:make``); then ``source:factory``; then a file; then a built-in or torchvision name.

A state dict is never a model on its own: it goes in ``weights`` next to a factory, built-in or torchvision name.
Untrusted files are never unpickled: ``torch.load(..., weights_only=True)`` unless the caller passes
``trust_pickle=True``. Every failure is a :class:`SpecError` whose one-line message names the spec or file
and what to do.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import pickle
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

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
from minreal.app.hub import build_hub, hub_spec
from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import Inputs, NamedInputs, PackedInputs, call
from minreal.compress.models import resnet20_cifar

__all__ = ["BUILTIN_MODELS", "check_input_shape", "load_model", "refuse_labels_outside"]

logger = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".pt", ".pth")
CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet20_cifar": resnet20_cifar,
}
"""Built-in architectures by name: ``factory(num_classes=...)`` (plain torch modules from
:mod:`minreal.compress.models`)."""


def _build_builtin(name: str, num_classes: int | None) -> nn.Module:
    """A built-in architecture with random weights (``num_classes=`` passed when given)."""
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    try:
        return BUILTIN_MODELS[name](**kwargs)
    except Exception as exc:
        raise SpecError(f"building built-in model {name!r} failed ({_cause(exc)}); check num_classes") from exc


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
        close = difflib.get_close_matches(name.lower(), [*BUILTIN_MODELS, *names], n=5)
        hint = f"did you mean {', '.join(close)}?" if close else "see torchvision.models.list_models()"
        raise SpecError(f"unknown model spec {name!r}: not a file, a module:factory, a built-in model "
                        f"({', '.join(BUILTIN_MODELS)}) or a torchvision architecture; {hint}")
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
_TRUST_HINT = ("pass trust_pickle=True (--trust-pickle) only if you trust the file: it lets the file run code "
               "(unpickling Python objects, evaluating expressions, importing modules)")


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


_UNREGISTERED = r"Deserializing (\S+) in pytree is not registered"
"""torch's words for an output container type (a Hugging Face ``ModelOutput``) not registered in this process."""


class _DropRecords(logging.Filter):
    """Keeps torch's deserialization log records off stderr; their gist goes to this module's debug log, and the
    exceptions they carry to ``causes`` (torch logs why a program did not deserialize, then raises a bare error)."""

    def __init__(self) -> None:
        super().__init__()
        self.causes: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        logger.debug("torch.export.load (%s): %s", record.name, record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            self.causes.append(str(record.exc_info[1]))
        return False


@contextmanager
def _quiet_torch_export_logs() -> Iterator[_DropRecords]:
    drop = _DropRecords()
    loggers = [logging.getLogger(name) for name in _PT2_NOISY_LOGGERS]
    for log in loggers:
        log.addFilter(drop)
    try:
        yield drop
    finally:
        for log in loggers:
            log.removeFilter(drop)


@contextmanager
def _guard(trust_pickle: bool) -> Iterator[list[str]]:
    """:func:`minreal.export.pickle_guard.no_unpickling`, or nothing (an always-empty refusal list) when trusted."""
    from minreal.export.pickle_guard import no_unpickling

    if trust_pickle:
        yield []
        return
    with no_unpickling() as refusals:
        yield refusals


def _load_exported(path: Path, trust_pickle: bool = False) -> nn.Module:
    """``torch.export.load(path).module()``; the graph keeps the train/eval mode it was exported in.

    A .pt2 archive can hold pickles (sample inputs, pickled tensors, custom objects) that
    ``torch.export.load`` would unpickle in full. Unless ``trust_pickle`` is set, the load runs under
    :func:`minreal.export.pickle_guard.no_unpickling`, so only torch's weights-only unpickler can run.
    """
    _check_pt2_archive(path, trust_pickle)
    refusals: list[str] = []
    logs = _DropRecords()
    try:
        with _quiet_torch_export_logs() as logs, _guard(trust_pickle) as refusals, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the verdict below says it all
            module = torch.export.load(path).module()
    except Exception as exc:
        if refusals:
            raise SpecError(f"{path} holds objects that need full unpickling ({refusals[0]}); "
                            f"{_TRUST_HINT}") from exc
        if unregistered := next(filter(None, (re.search(_UNREGISTERED, c) for c in logs.causes)), None):
            raise SpecError(
                f"could not load torch.export program {path}: it returns {unregistered[1]}, an output type that "
                "only its own package knows how to rebuild (it registers the type with torch when imported, and "
                "loading a program imports no code); save the model with outputs of tensors in tuples, lists or "
                "dicts (e.g. wrap a Hugging Face model to return dict(outputs), as hf:FAMILY does)") from exc
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
                        "built-in or torchvision name, or file.py:factory) and this file as weights")
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
                        ".pt/.pth pickled module, path/to/file.py:factory, a built-in or a torchvision name")
    return loader(path, trust_pickle)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


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
        raise SpecError(f"could not read weights file {path} ({_cause(exc)}); "
                        "it must be written by torch.save") from exc
    if not _is_state_dict(obj) and isinstance(obj, Mapping):
        inner = next((k for k in CHECKPOINT_KEYS if _is_state_dict(obj.get(k))), None)
        if inner is not None:
            logger.info("using the %r entry of checkpoint %s as the state dict", inner, path)
            obj = obj[inner]
    if not _is_state_dict(obj):
        raise SpecError(f"weights file {path} holds {_describe(obj)}, not a state dict (names → tensors); "
                        "save it with torch.save(model.state_dict(), path)")
    nan = next((k for k, v in obj.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                and bool(torch.isnan(v).any())), None)
    if nan is not None:
        raise SpecError(f"weights file {path}: {nan!r} holds NaN values (a damaged file or a training that "
                        "diverged); give weights without NaN")
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

    Parameters
    ----------
    spec : str
        a built-in architecture name (``"resnet20_cifar"``, see :data:`BUILTIN_MODELS`), a torchvision
        architecture name (``"resnet18"``), a hub model (``"timm:resnet50"``, ``"hf:bert"``, see
        :mod:`minreal.app.hub`),
        ``path/to/file.py:factory``, ``package.module:factory``, a ``torch.export`` program ``*.pt2``, or a
        pickled module ``*.pt``/``*.pth`` (only with ``trust_pickle``). A hub prefix is read before
        ``module:factory``: ``timm:NAME`` and ``hf:FAMILY`` are always the hub's; a module of your own named
        ``timm`` or ``hf`` is given as ``path/to/timm.py:factory`` or ``package.timm:factory``.
    weights : str | Path | None
        a local state-dict file (``torch.save(model.state_dict(), path)``) loaded with
        ``weights_only=True`` into a built-in, torchvision, hub or factory's model; keys and shapes must match
        as ``load_state_dict`` would accept them (old checkpoints without BatchNorm's ``num_batches_tracked``
        included).
    trust_pickle : bool
        allow unpickling a whole module from ``*.pt``/``*.pth`` (can run arbitrary code).
    num_classes : int | None
        passed as ``num_classes=`` to the built-in, torchvision or hub builder or the factory.

    Returns
    -------
    nn.Module
        The model. A ``.pt2`` program keeps the mode it was exported in; its ``eval()`` only sets the flag.

    Raises
    ------
    SpecError
        the spec, weights or file cannot be used; the message names it and what to do.
    """
    hub = hub_spec(spec)
    target = None if hub is not None else _parse_callable(spec)
    is_file = hub is None and target is None and (_looks_like_path(spec) or Path(spec).exists())
    if is_file and (num_classes is not None or (weights is not None and spec.endswith(".pt2"))):
        raise SpecError(f"model file {spec} already fixes its architecture and weights; drop num_classes/weights "
                        "or give a factory, built-in or torchvision name instead")
    if target is not None:
        model = _build_from_factory(spec, target, num_classes)
    elif is_file:
        model = _load_model_file(spec, trust_pickle)
    else:
        build = build_hub if hub is not None else _build_builtin if spec in BUILTIN_MODELS else _build_torchvision
        model = build(spec, num_classes)
        if weights is None:
            logger.warning("%s has random weights: no weights file given (minreal never downloads); pass a "
                           "local state dict as weights", spec)
    if weights is not None:
        _load_weights(model, Path(weights), spec)
    return model.eval()


def forward_parameters(model: nn.Module) -> list[str] | None:
    """Names of the positional parameters of ``model.forward`` (``None`` when it takes ``*args`` or cannot be
    inspected, e.g. a loaded ``.pt2`` program)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    return [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def packed_model(model: nn.Module, x: Inputs, model_spec: str = "model") -> nn.Module:
    """``model`` itself, or, when its ``forward`` takes one structured argument and the data gives named inputs
    that are not its parameters, a :class:`~minreal.compress.core.inputs.PackedInputs` that calls it with a dict of them
    (or a tuple, when the names are ``ARG_0``, ``ARG_1``, ... for the parameter ``ARG``)."""
    params = forward_parameters(model)
    if not isinstance(x, NamedInputs) or params is None or len(params) != 1 or params[0] in x.names:
        return model
    arg = params[0]
    positional = [f"{arg}_{i}" for i in range(len(x.names))]
    as_tuple = sorted(x.names) == sorted(positional)
    names = positional if as_tuple else x.names
    logger.info("%s: forward(%s) takes one structured input; called with %s of %s", model_spec, arg,
                "a tuple" if as_tuple else "a dict", ", ".join(names))
    return PackedInputs(model, names, as_tuple=as_tuple)


def align_inputs(model: nn.Module, x: Inputs, model_spec: str = "model", data_spec: str = "the data") -> Inputs:
    """Named inputs reordered as ``model.forward`` takes them (they are passed positionally).

    The names must be the first parameters of ``forward`` in some order (later parameters keep their defaults).
    One tensor, or a model whose parameters cannot be read, is returned unchanged.

    Raises
    ------
    SpecError
        a name that is not a ``forward`` parameter, or a gap (a parameter before a given one is
        missing), naming the parameters ``forward`` takes.
    """
    params = forward_parameters(model)
    if isinstance(model, PackedInputs):
        return NamedInputs({n: x.tensors[n] for n in model.names})
    if not isinstance(x, NamedInputs) or params is None:
        return x
    unknown = [n for n in x.names if n not in params]
    if unknown:
        raise SpecError(f"{data_spec} names input(s) {unknown} but {model_spec}'s forward takes {params}; key each "
                        "array by a forward parameter name")
    wanted = params[: len(x.names)]
    missing = [n for n in wanted if n not in x.names]
    if missing:
        raise SpecError(f"{model_spec}'s forward takes {params} in this order; {data_spec} gives {x.names} but not "
                        f"{missing}, which come before them: give those inputs too")
    required = [n for n in _required_parameters(model) if n not in x.names]
    if required:
        raise SpecError(f"{data_spec} has no array for {required}, which {model_spec}'s forward needs (it has no "
                        f"default); {data_spec} holds {x.names}")
    return NamedInputs({n: x.tensors[n] for n in wanted})


def _required_parameters(model: nn.Module) -> list[str]:
    """Positional parameters of ``model.forward`` without a default (``[]`` when it cannot be inspected)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def check_input_shape(model: nn.Module, x: Inputs, model_spec: str = "model", data_spec: str = "the data") -> Any:
    """Run ``model`` on the first two samples of ``x`` and return its output, which must be finite.

    Raises
    ------
    SpecError
        ``"<model_spec>: model forward failed on input of shape (2, 1, 8, 8): <cause>"``, or the
        outputs are NaN/inf (the data overflows inside the model).
    """
    batch = x[:2]
    try:
        with torch.no_grad():
            out = call(model, batch)
    except Exception as exc:
        raise SpecError(f"{model_spec}: model forward failed on input of shape {_shapes(batch)}: {_cause(exc)}; "
                        f"{_input_hint(batch, data_spec)}") from exc
    if not all(torch.isfinite(t).all() for t in _tensors(out)):
        raise SpecError(f"{model_spec}: outputs on the first samples of {data_spec} are NaN/inf (values overflow "
                        "inside the model); check the data scale, e.g. normalise the inputs")
    return out


def checked_dataset(model: nn.Module, data: Dataset, model_spec: str = "model", data_spec: str = "the data",
                    allow_mismatch: bool = False) -> Dataset:
    """``data`` with its named inputs in ``forward`` order (:func:`align_inputs`), after a forward pass on its
    first samples (:func:`check_input_shape`) and :func:`refuse_labels_outside` (a warning with
    ``allow_mismatch``)."""
    x = align_inputs(model, data.x, model_spec, data_spec)
    refuse_labels_outside(check_input_shape(model, x, model_spec, data_spec), data.y, data_spec, allow_mismatch)
    return data if x is data.x else Dataset(x, data.y)


def refuse_labels_outside(out: Any, y: torch.Tensor | None, data_spec: str = "the data", allow: bool = False) -> None:
    """Refuse integer class labels ``y`` that no output of the model can predict: ``out`` (the model's output on
    a few samples) holds class scores ``(N, K)``, ``K > 1``, and a label is negative or at least ``K``. The one
    rule of every command that reads labelled data (``compress``, ``run``, ``tune``, ``export``); outputs that
    are not class scores, and labels that are not integer classes, pass. With ``allow`` (``--allow-data-mismatch``
    of ``run`` and ``tune``) the same line is a WARNING and the command goes on.

    Raises
    ------
    SpecError
        One line naming ``data_spec``, how many labels lie outside and the first of them.
    """
    if y is None or y.ndim != 1 or y.dtype not in (torch.int64, torch.int32) or not isinstance(out, torch.Tensor):
        return
    if out.dim() != 2 or out.shape[1] < 2:
        return
    k = out.shape[1]
    outside = ((y < 0) | (y >= k)).nonzero().flatten()
    if len(outside):
        values = sorted({int(v) for v in y[outside[:1000]]})
        shown = ", ".join(map(str, values[:3])) + (", ..." if len(values) > 3 else "")
        message = (f"{data_spec}: {len(outside)} of {len(y)} labels ({shown}) lie outside the model's {k} outputs "
                   f"(0-{k - 1})")
        if allow:
            logger.warning("%s; going on (--allow-data-mismatch): accuracy on these labels means nothing", message)
            return
        raise SpecError(f"{message}; give class labels the model can output, in the order of its outputs")


def _shapes(x: Inputs) -> str:
    if isinstance(x, NamedInputs):
        return ", ".join(f"{n} {_shape(t)} {str(t.dtype).removeprefix('torch.')}" for n, t in x.items())
    return _shape(x)


def _input_hint(batch: Inputs, data_spec: str) -> str:
    if isinstance(batch, NamedInputs):
        return "check that each named input has the shape and dtype the model expects"
    if batch.is_floating_point():
        return "check that the data (or input_shape) matches what the model expects"
    return f"{data_spec} holds integers ({batch.dtype}); save float inputs if the model expects them"


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The floating tensors of a model output (none when it is not made of tensors)."""
    from minreal.compress.core.evaluate import flatten_outputs

    try:
        return [t for t in flatten_outputs(obj) if t.is_floating_point()]
    except TypeError:
        return []
