"""On-disk cache of methods' prepared states (what ``prepare`` computes once, whatever the budget).

A state is a tree of dataclasses, dicts, lists, tuples and sets whose leaves are tensors, numpy arrays and
scalars, numbers, strings, None, dtypes, devices, :class:`~minreal.compress.core.inputs.NamedInputs` and references to
the model given to ``prepare`` (the model itself, one of its submodules, parameters or buffers, found by
identity). It is written as plain data -- each dataclass as ``{"__dataclass__": "module:QualName", "fields":
{...}}``, each model reference as its qualified name -- with ``torch.save`` and read with
``torch.load(weights_only=True)``: nothing is unpickled, a dataclass is rebuilt only when its class lies under
this package (imported by name, never by pickle) and is a dataclass, and references are resolved against the model
given to :func:`load_prepared`. A state holding anything else (a copy of a module, a function, another class) is
not cached; a corrupt, truncated or foreign file is a miss, overwritten by the next save.

Sharing among non-tensor objects is not kept (an object reached twice loads as two equal copies); tensors that
are views of a larger storage are saved as compact copies.

Keys (:func:`prepared_cache_key`) hash the method, its config minus the budgets, the model (class, architecture,
weights, buffers, training flags, devices), the data (inputs and labels) and the versions of minreal, torch and
numpy. Under a process group (:mod:`minreal.compress.core.distributed`) only the writer saves, and :func:`load_prepared`
is collective like :func:`~minreal.compress.core.cache.load_entry`: a state counts as found only when every rank read
it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
import types
from collections.abc import Callable, Sequence
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from .cache import data_key, model_key
from .data import Dataset
from .distributed import all_agree, is_writer
from .inputs import NamedInputs
from .report import UNSET
from .surgery import shared_parameters

__all__ = ["SCHEMA", "prepared_cache_key", "prepared_path", "package_versions", "save_prepared", "load_prepared"]

log = logging.getLogger(__name__)

SCHEMA = 1
"""Version of the file layout and encoding; a change makes every older file a miss."""
PACKAGE_ROOT = __name__.rsplit(".", 2)[0]  # minreal.compress
"""The only package whose dataclasses a file may name."""
VERSIONED = ("minreal", "torch", "numpy")
_TENSOR_TYPES = (torch.Tensor, nn.Parameter)
_PLAIN = (int, float, bool, str, type(None))


class _Refused(Exception):
    """The state holds something this encoding does not write (and the state is not cached)."""


class _Foreign(Exception):
    """The file does not hold a state this encoding wrote (and counts as a miss)."""


def package_versions() -> tuple[tuple[str, str], ...]:
    """``(distribution, version)`` of :data:`VERSIONED`, ``"-"`` for one not installed, and ``("code", digest)``
    of this package's own sources (:func:`source_digest`: the version number stays put while the code changes)."""
    out = []
    for name in VERSIONED:
        try:
            out.append((name, version(name)))
        except PackageNotFoundError:
            out.append((name, "-"))
    return (*out, ("code", source_digest("minreal.compress", "minreal.facts")))


_DIGESTS: dict[str, str] = {}


def source_digest(*packages: str) -> str:
    """sha256 of the ``.py`` files of ``packages`` (importable packages or modules), by relative path and bytes:
    a cache keyed by it never serves what older code computed. Read once per process (a few milliseconds)."""
    key = ",".join(packages)
    if key not in _DIGESTS:
        import importlib.util

        h = hashlib.sha256()
        for package in packages:
            spec = importlib.util.find_spec(package)
            if spec is None or not (spec.submodule_search_locations or spec.origin):
                raise ImportError(f"source_digest: no module {package!r} to hash")
            roots = list(spec.submodule_search_locations or [])
            files = [(Path(root), path) for root in roots for path in sorted(Path(root).rglob("*.py"))]
            if not roots:  # a plain module (minreal.facts)
                files = [(Path(spec.origin).parent, Path(spec.origin))]
            for root, path in files:
                h.update(f"{package}/{path.relative_to(root).as_posix()}\n".encode())
                h.update(path.read_bytes())
        _DIGESTS[key] = h.hexdigest()[:16]
    return _DIGESTS[key]


def _model_part(model: nn.Module) -> tuple[str, ...]:
    """Class, architecture and weights (:func:`~minreal.compress.core.cache.model_key`), plus what that leaves out:
    non-persistent buffers, training flags, devices and which parameters are one (tied weights: a state dict is the
    same whether a head holds its embedding's parameter or a copy, but the methods leave a tied layer whole)."""
    persistent = set(model.state_dict())
    h = hashlib.sha256()
    for name, b in model.named_buffers():
        if name not in persistent:
            h.update(name.encode())
            h.update(data_key(b).encode())
    flags = "".join("1" if m.training else "0" for m in model.modules())
    devices = sorted({str(t.device) for t in (*model.parameters(), *model.buffers())})
    tied = ";".join(sorted(",".join(names) for names in shared_parameters(model)))
    cls = type(model)
    return (f"{cls.__module__}:{cls.__qualname__}", model_key(model), h.hexdigest()[:24], flags, ",".join(devices),
            tied)


def prepared_cache_key(method: str, config_key: Sequence[tuple[str, str]], model: nn.Module, data: Dataset) -> str:
    """Hash of what a prepared state depends on: the method, ``config_key`` (its config minus the budgets:
    :func:`minreal.compress.registry.prepared_key`), the model, the data's inputs and labels, :func:`package_versions`
    and :data:`SCHEMA`."""
    labels = "-" if data.y is None else data_key(data.y)
    parts = (SCHEMA, method, tuple(config_key), _model_part(model), data_key(data.x), labels, package_versions())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:40]


def prepared_path(cache_dir: str | Path, key: str) -> Path:
    """The file holding the state of ``key``."""
    return Path(cache_dir) / "prepared" / f"{key}.pt"


class _Refs(NamedTuple):
    """The model's objects a state may refer to, by identity: ``id → qualified name``."""

    modules: dict[int, str]
    tensors: dict[int, str]


def _refs(model: nn.Module) -> _Refs:
    tensors = {id(t): n for n, t in (*model.named_parameters(remove_duplicate=False),
                                     *model.named_buffers(remove_duplicate=False))}
    return _Refs({id(m): n for n, m in model.named_modules(remove_duplicate=False)}, tensors)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _dataclass_class(name: str) -> type:
    """The dataclass ``name`` (``module:QualName``) under :data:`PACKAGE_ROOT`, imported by name; _Foreign for
    any other name (nothing outside the package is imported)."""
    module, _, qual = name.partition(":")
    parts = qual.split(".")
    if not (module == PACKAGE_ROOT or module.startswith(PACKAGE_ROOT + ".")) or not all(p.isidentifier()
                                                                                        for p in parts):
        raise _Foreign(f"class {name!r} is not a dataclass of {PACKAGE_ROOT}")
    try:
        obj: Any = import_module(module)
        for p in parts:
            obj = getattr(obj, p)
    except (ImportError, AttributeError) as exc:
        raise _Foreign(f"class {name!r} cannot be found: {exc}") from None
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise _Foreign(f"{name!r} is not a dataclass")
    return obj


# ---------------------------------------------------------------------------------------------------- encoding


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a compact copy when it views a larger storage (a slice of the data, say)."""
    if t.layout != torch.strided or t.untyped_storage().nbytes() <= t.numel() * t.element_size():
        return t
    return t.clone()


def _encode_array(a: np.ndarray, path: str) -> dict[str, Any]:
    try:
        return {"__ndarray__": torch.from_numpy(a.copy(order="C"))}
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _Refused(f"{path}: numpy array of dtype {a.dtype} ({exc})") from None


def _encode_dataclass(obj: Any, refs: _Refs, path: str, active: set[int]) -> dict[str, Any]:
    cls = type(obj)
    name = _class_name(cls)
    try:
        found = _dataclass_class(name)
    except _Foreign:
        found = None
    if found is not cls:
        raise _Refused(f"{path}: dataclass {name} is not importable by name from {PACKAGE_ROOT}")
    names = [f.name for f in dataclasses.fields(obj)]
    extra = set(getattr(obj, "__dict__", {})) - set(names)
    if extra:
        raise _Refused(f"{path}: {name} holds attributes that are not fields ({', '.join(sorted(extra))})")
    return {"__dataclass__": name,
            "fields": {n: _encode(getattr(obj, n), refs, f"{path}.{n}", active) for n in names}}


def _encode_container(obj: Any, refs: _Refs, path: str, active: set[int]) -> Any:
    if type(obj) in (list, tuple):
        items = [_encode(v, refs, f"{path}[{i}]", active) for i, v in enumerate(obj)]
        return items if type(obj) is list else tuple(items)
    if type(obj) is dict:
        return {"__dict__": [(_encode(k, refs, f"{path}<key>", active), _encode(v, refs, f"{path}[{k!r}]", active))
                             for k, v in obj.items()]}
    if type(obj) in (set, frozenset):
        return {f"__{type(obj).__name__}__": [_encode(v, refs, f"{path}<item>", active) for v in obj]}
    if type(obj) is NamedInputs:
        return {"__named_inputs__": [(n, _compact(t)) for n, t in obj.items()]}
    raise _Refused(f"{path}: {type(obj).__module__}.{type(obj).__qualname__} object")


def _encode_leaf(obj: Any, path: str) -> Any:
    """Plain values, tensors, numpy arrays and scalars, dtypes, devices; _Refused for anything else."""
    if type(obj) in _PLAIN:
        return obj
    if type(obj) in _TENSOR_TYPES:
        return _compact(obj)
    if type(obj) is np.ndarray:
        return _encode_array(obj, path)
    if isinstance(obj, np.generic):
        return {"__npscalar__": _encode_array(np.asarray(obj), path)["__ndarray__"]}
    if type(obj) is torch.dtype:
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if type(obj) is torch.device:
        return {"__device__": str(obj)}
    if obj is UNSET:  # a report field nothing set
        return {"__unset__": None}
    return None


def _encode(obj: Any, refs: _Refs, path: str, active: set[int]) -> Any:
    """The plain-data form of ``obj`` (a subtree of the state at ``path``)."""
    if isinstance(obj, nn.Module):
        if id(obj) not in refs.modules:
            raise _Refused(f"{path}: a module that is not the model given nor one of its submodules")
        return {"__model__": refs.modules[id(obj)]}
    if isinstance(obj, torch.Tensor) and id(obj) in refs.tensors:
        return {"__model_tensor__": refs.tensors[id(obj)]}
    leaf = _encode_leaf(obj, path)
    if leaf is not None or obj is None:
        return leaf
    if id(obj) in active:
        raise _Refused(f"{path}: a cycle")
    active.add(id(obj))
    try:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return _encode_dataclass(obj, refs, path, active)
        return _encode_container(obj, refs, path, active)
    finally:
        active.discard(id(obj))


# ---------------------------------------------------------------------------------------------------- decoding


def _decode_dataclass(node: dict[str, Any], model: nn.Module) -> Any:
    cls = _dataclass_class(node["__dataclass__"])
    values = node.get("fields")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(node) != {"__dataclass__", "fields"} or type(values) is not dict or set(values) != names:
        raise _Foreign(f"the fields of {node['__dataclass__']} do not match the class")
    obj = cls.__new__(cls)  # the saved field values as they were: __init__/__post_init__ ran when they were made
    for n, v in values.items():
        object.__setattr__(obj, n, _decode(v, model))
    return obj


def _tensor(value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _Foreign(f"expected a tensor, found {type(value).__name__}")
    return value


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise _Foreign(f"{name!r} is not a torch dtype")
    return dtype


_DECODERS: types.MappingProxyType[str, Callable[[Any, nn.Module], Any]] = types.MappingProxyType({
    "__model__": lambda v, model: model.get_submodule(v),
    "__model_tensor__": lambda v, model: _model_tensor(model, v),
    "__dict__": lambda v, model: {_decode(k, model): _decode(x, model) for k, x in v},
    "__set__": lambda v, model: {_decode(x, model) for x in v},
    "__frozenset__": lambda v, model: frozenset(_decode(x, model) for x in v),
    "__named_inputs__": lambda v, model: NamedInputs({n: _tensor(t) for n, t in v}),
    "__ndarray__": lambda v, model: _tensor(v).numpy(),
    "__npscalar__": lambda v, model: _tensor(v).numpy()[()],
    "__dtype__": lambda v, model: _dtype(v),
    "__device__": lambda v, model: torch.device(v),
    "__unset__": lambda v, model: UNSET,
})


def _model_tensor(model: nn.Module, name: str) -> torch.Tensor:
    found = dict((*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)))
    if name not in found:
        raise _Foreign(f"the model has no parameter or buffer {name!r}")
    return found[name]


def _decode(node: Any, model: nn.Module) -> Any:
    """The object ``node`` encodes (references resolved against ``model``); _Foreign for an unknown form."""
    if type(node) in _PLAIN or type(node) in _TENSOR_TYPES:
        return node
    if type(node) in (list, tuple):
        items = [_decode(v, model) for v in node]
        return items if type(node) is list else tuple(items)
    if type(node) is not dict:
        raise _Foreign(f"unexpected {type(node).__name__} in the file")
    if "__dataclass__" in node:
        return _decode_dataclass(node, model)
    if len(node) != 1 or next(iter(node)) not in _DECODERS:
        raise _Foreign(f"unexpected entry {sorted(map(str, node))[:3]} in the file")
    tag, value = next(iter(node.items()))
    return _DECODERS[tag](value, model)


# ---------------------------------------------------------------------------------------------------- files


def save_prepared(cache_dir: str | Path, key: str, state: Any, model: nn.Module) -> bool:
    """Write ``state`` (computed for ``model``) under ``key``, atomically (a temporary file, then a rename).

    Only the writer rank writes (:func:`~minreal.compress.core.distributed.is_writer`). A state holding what the
    encoding refuses is not written (one log line says what and where); nor, with a warning, when the disk refuses.
    Returns whether the file was written.
    """
    if not is_writer():
        return False
    try:
        payload = {"schema": SCHEMA, "key": key, "state": _encode(state, _refs(model), "state", set())}
    except _Refused as exc:
        log.info("prepared state not cached: %s", exc)
        return False
    path = prepared_path(cache_dir, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        os.close(fd)
        try:
            torch.save(payload, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        log.warning("could not cache the prepared state in %s: %s", path, exc)
        return False
    return True


def _read(path: Path, key: str, model: nn.Module) -> Any:
    """The state in ``path``, or None when absent, unreadable or not one this encoding wrote for ``key``."""
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, weights_only=True)
        if type(payload) is not dict or payload.get("schema") != SCHEMA or payload.get("key") != key:
            raise _Foreign("not a prepared state of this schema and key")
        return _decode(payload["state"], model)
    except Exception as exc:
        log.warning("ignoring unreadable prepared state %s: %s", path, str(exc).splitlines()[0] if str(exc) else exc)
        return None


def load_prepared(cache_dir: str | Path, key: str, model: nn.Module) -> Any:
    """The state saved under ``key``, its model references resolved against ``model`` (the model it was
    prepared for, by the key); None on a miss. Collective under a process group: every rank calls it with the same
    key, and it is found only when every rank read it."""
    state = _read(prepared_path(cache_dir, key), key, model)
    return state if all_agree(state is not None) else None
