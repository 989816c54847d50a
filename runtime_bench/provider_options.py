"""Execution-provider settings: what a user may set per provider, and the ONNX Runtime options they become.

Settings come from the CLI (``--provider-option tensorrt.fp16=true``, repeatable) and from a TOML file
(``--provider-config FILE``), one table per provider::

    [cuda]
    device_id = 0

    [tensorrt]
    device_id = 0
    fp16 = true                 # trt_fp16_enable
    int8 = true                 # trt_int8_enable (explicit Q/DQ graphs)
    engine_cache = "trt-cache"  # trt_engine_cache_enable + trt_engine_cache_path
    timing_cache = "trt-cache"  # trt_timing_cache_enable + trt_timing_cache_path
    opt_level = 3               # trt_builder_optimization_level (0-5)
    workspace = "4G"            # trt_max_workspace_size, bytes (K/M/G suffixes)

    [tensorrt.profiles]         # optimisation profile per input: min, opt, max shapes
    input = ["1x3x224x224", "32x3x224x224", "32x3x224x224"]

A TensorRT engine is built when a session first sees a shape, which takes seconds to minutes: with a profile
covering every timed shape one engine per (model, precision) serves every batch size, and the engine cache lets
the later timing processes of a run load it instead of building it again. :func:`trt_profiles` derives such a
profile from the benchmark's batch sizes and axis values when the user gives none; :func:`ort_options` fills in
a shared cache directory. Session creation and the first run (where the build happens) are timed apart from the
latency by the worker.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from minreal.facts import PROVIDERS

from .errors import BenchInputError

__all__ = [
    "ProviderSettings",
    "parse_provider_option",
    "load_provider_config",
    "merge_settings",
    "trt_profiles",
    "ort_options",
]

_GPU = ("cuda", "tensorrt")
_TRT_ONLY = ("fp16", "int8", "engine_cache", "timing_cache", "opt_level", "workspace", "profiles")
_SIZE = re.compile(r"^(\d+)([KMG]?)$", re.IGNORECASE)
_SHAPE = re.compile(r"^\d+(x\d+)*$")


@dataclass(frozen=True)
class ProviderSettings:
    """What a user may set for one provider (``None``: ONNX Runtime's default).

    Attributes
    ----------
    device_id : int | None
        GPU ordinal (cuda, tensorrt).
    fp16 : bool | None
        let TensorRT choose fp16 kernels.
    int8 : bool | None
        let TensorRT run int8 (needed for Q/DQ graphs).
    engine_cache : str | None
        directory of TensorRT's engine cache (shared by a run's timing processes).
    timing_cache : str | None
        directory of TensorRT's timing cache.
    opt_level : int | None
        TensorRT builder optimisation level, 0-5.
    workspace : int | None
        TensorRT workspace limit in bytes.
    profiles : Mapping[str, tuple[str, str, str]]
        input name -> (min, opt, max) shapes, each ``"1x3x224x224"``.
    """

    device_id: int | None = None
    fp16: bool | None = None
    int8: bool | None = None
    engine_cache: str | None = None
    timing_cache: str | None = None
    opt_level: int | None = None
    workspace: int | None = None
    profiles: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)


def _fail(where: str, message: str, fields: tuple[str, ...] = ()) -> None:
    raise BenchInputError(f"{where}: {message}", fields=fields)


def _bool(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    _fail(where, f"expected true or false, got {value!r}")
    raise AssertionError  # unreachable


def _int(where: str, value: Any, low: int, high: int | None = None) -> int:
    try:
        number = int(str(value), 10) if not isinstance(value, int) or isinstance(value, bool) else value
    except ValueError:
        number = None
    if number is None or isinstance(value, bool) or number < low or (high is not None and number > high):
        _fail(where, f"expected an integer in [{low}, {high if high is not None else '...'}], got {value!r}")
    return int(number)  # type: ignore[arg-type]


def _bytes(where: str, value: Any) -> int:
    match = _SIZE.match(str(value).strip())
    if not match or isinstance(value, bool):
        _fail(where, f"expected bytes such as 4294967296, 512M or 4G, got {value!r}")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]  # type: ignore[union-attr]
    return int(match.group(1)) * scale  # type: ignore[union-attr]


def _profiles(where: str, value: Any) -> dict[str, tuple[str, str, str]]:
    if not isinstance(value, Mapping):
        _fail(where, "expected a table: input name = [min, opt, max] shapes")
    out = {}
    for name, shapes in value.items():
        if isinstance(shapes, str) or not isinstance(shapes, Sequence) or len(shapes) != 3 \
                or not all(isinstance(s, str) and _SHAPE.match(s) for s in shapes):
            _fail(f"{where}.{name}", f"expected three shapes [min, opt, max] such as '1x3x224x224', got {shapes!r}")
        dims = [[int(d) for d in s.split("x")] for s in shapes]
        if len({len(d) for d in dims}) != 1 or not all(a <= b <= c for a, b, c in zip(*dims)):
            _fail(f"{where}.{name}", f"min <= opt <= max must hold on every axis of one rank, got {list(shapes)}")
        out[str(name)] = (shapes[0], shapes[1], shapes[2])
    return out


_CONVERT = {
    "device_id": lambda w, v: _int(w, v, 0),
    "fp16": _bool,
    "int8": _bool,
    "engine_cache": lambda w, v: str(v),
    "timing_cache": lambda w, v: str(v),
    "opt_level": lambda w, v: _int(w, v, 0, 5),
    "workspace": _bytes,
    "profiles": _profiles,
}


def _settings(provider: str, values: Mapping[str, Any], where: str) -> ProviderSettings:
    """Validated :class:`ProviderSettings` of ``provider`` from raw ``values`` (``where`` names their origin)."""
    if provider not in PROVIDERS:
        _fail(where, f"unknown provider {provider!r}; choose one of: {', '.join(PROVIDERS)}")
    allowed = () if provider not in _GPU else ("device_id", *(_TRT_ONLY if provider == "tensorrt" else ()))
    converted = {}
    for key, value in values.items():
        if key not in allowed:
            _fail(f"{where} {provider}.{key}", f"not a setting of {provider}; settings: "
                  f"{', '.join(allowed) or 'none (its thread count is a benchmark setting, not a provider one)'}")
        converted[key] = _CONVERT[key](f"{where} {provider}.{key}", value)
    return ProviderSettings(**converted)


def parse_provider_option(text: str) -> tuple[str, str, str]:
    """``"tensorrt.fp16=true"`` -> ``("tensorrt", "fp16", "true")``; ``profiles`` only come from a config file.

    Raises
    ------
    BenchInputError
        not of the form ``PROVIDER.KEY=VALUE``.
    """
    head, sep, value = text.partition("=")
    provider, dot, key = head.strip().partition(".")
    if not sep or not dot or not provider or not key or not value.strip():
        _fail(f"--provider-option {text!r}", "expected PROVIDER.KEY=VALUE, e.g. tensorrt.fp16=true")
    if key.strip() == "profiles":
        _fail(f"--provider-option {text!r}", "optimisation profiles are tables: give them in --provider-config")
    return provider.strip(), key.strip(), value.strip()


def load_provider_config(path: str | Path) -> dict[str, ProviderSettings]:
    """Read a TOML file of one table per provider (module docstring) into validated settings.

    Raises
    ------
    BenchInputError
        the file is missing, not TOML, or has an unknown provider, key or bad value.
    """
    path = Path(path)
    where = f"provider config {path}"  # the file named, as the Python API and --provider-config alike give it
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        _fail(where, f"cannot read it: {exc.strerror or exc}")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        _fail(where, f"not valid TOML: {exc}")
    out = {}
    for provider, values in doc.items():
        if not isinstance(values, Mapping):
            _fail(where, f"{provider!r} must be a table, e.g. [{provider}]")
        out[provider] = _settings(provider, values, where)
    return out


def merge_settings(config: Mapping[str, ProviderSettings] | None,
                   options: Iterable[str] = ()) -> dict[str, ProviderSettings]:
    """The config file's settings with the CLI's ``--provider-option`` values on top (they win)."""
    merged = dict(config or {})
    by_provider: dict[str, dict[str, str]] = {}
    for text in options:
        provider, key, value = parse_provider_option(text)
        by_provider.setdefault(provider, {})[key] = value
    for provider, values in by_provider.items():
        given = _settings(provider, values, "--provider-option")
        base = merged.get(provider, ProviderSettings())
        merged[provider] = dataclasses.replace(base, **{k: getattr(given, k) for k in values})
    return merged


def _dims(shape: Sequence[int | str | None], batch: int, axis_values: Mapping[str, int]) -> str | None:
    """One input's concrete shape ``"AxBxC"`` (the first symbolic axis is the batch), or None when an axis is
    symbolic and not given a value."""
    out = []
    for i, dim in enumerate(shape):
        if isinstance(dim, int):
            out.append(dim)
        elif i == 0:
            out.append(batch)
        elif isinstance(dim, str) and dim in axis_values:
            out.append(axis_values[dim])
        else:
            return None
    return "x".join(map(str, out))


def trt_profiles(inputs: Mapping[str, Sequence[int | str | None]], batch_sizes: Sequence[int],
                 axis_values: Mapping[str, Sequence[int]]) -> dict[str, tuple[str, str, str]]:
    """One optimisation profile covering every timed shape: per dynamic input, min = the smallest batch and
    axis values, opt = max = the largest (TensorRT tunes kernels for opt). Static inputs and inputs with a
    symbolic axis that has no value are left out (TensorRT then builds for the shapes it sees)."""
    low = {k: min(v) for k, v in axis_values.items()}
    high = {k: max(v) for k, v in axis_values.items()}
    out = {}
    for name, shape in inputs.items():
        if all(isinstance(d, int) for d in shape):
            continue
        small, large = _dims(shape, min(batch_sizes), low), _dims(shape, max(batch_sizes), high)
        if small is not None and large is not None:
            out[name] = (small, large, large)
    return out


def _profile_string(profiles: Mapping[str, tuple[str, str, str]], which: int) -> str:
    return ",".join(f"{name}:{shapes[which]}" for name, shapes in profiles.items())


def ort_options(provider: str, settings: ProviderSettings | None, cache_dir: Path | None = None,
                default_profiles: Mapping[str, tuple[str, str, str]] | None = None) -> dict[str, str]:
    """The ONNX Runtime provider options (strings) for ``provider``.

    For TensorRT the engine and timing caches default to ``cache_dir`` (a directory shared by the timing
    processes of one run) and the profiles to ``default_profiles`` (:func:`trt_profiles`) when not set.
    """
    s = settings or ProviderSettings()
    if provider not in _GPU:
        return {}
    out = {} if s.device_id is None else {"device_id": str(s.device_id)}
    if provider == "cuda":
        return out
    flags = {"trt_fp16_enable": s.fp16, "trt_int8_enable": s.int8}
    out.update({k: "1" if v else "0" for k, v in flags.items() if v is not None})
    engine = s.engine_cache or (str(cache_dir) if cache_dir else None)
    timing = s.timing_cache or (str(cache_dir) if cache_dir else None)
    if engine:
        out.update(trt_engine_cache_enable="1", trt_engine_cache_path=engine)
    if timing:
        out.update(trt_timing_cache_enable="1", trt_timing_cache_path=timing)
    if s.opt_level is not None:
        out["trt_builder_optimization_level"] = str(s.opt_level)
    if s.workspace is not None:
        out["trt_max_workspace_size"] = str(s.workspace)
    profiles = s.profiles or default_profiles or {}
    if profiles:
        for which, key in enumerate(("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")):
            out[key] = _profile_string(profiles, which)
    return out
