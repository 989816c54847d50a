"""Benchmark configuration and model entries."""

from __future__ import annotations

import itertools
import numbers
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .errors import BenchInputError
from .provider_options import ProviderSettings
from .providers import provider_name

__all__ = ["ModelEntry", "BenchConfig", "default_threads", "shape_label", "shape_grid"]


@dataclass(frozen=True)
class ModelEntry:
    """One ONNX model to benchmark; the first entry of a run is the reference for ratios."""

    name: str
    path: Path

    def __post_init__(self) -> None:
        if not self.name:
            raise BenchInputError(f"model entry for {self.path} has an empty name")
        object.__setattr__(self, "path", Path(self.path))


@dataclass(frozen=True)
class BenchConfig:
    """What to time and how.

    Validation messages name each field with the CLI flag that sets it, e.g. ``repeats (--repeats)``.

    Attributes
    ----------
    providers : tuple[str, ...]
        Provider short names (see :data:`minreal.facts.PROVIDERS`).
    batch_sizes : tuple[int, ...]
        Batch sizes; each (provider, batch size) is timed in fresh processes.
    warmup : int
        Runs per model discarded before measuring.
    min_runs : int
        Minimum measured runs per model.
    min_seconds : float
        Minimum wall time of the measurement window (runs continue until both
        ``min_runs`` and ``min_seconds`` are met).
    repeats : int
        Fresh worker processes per (provider, batch size); ratios report median and spread.
    intra_op_threads : int | None
        onnxruntime intra-op threads; None means the physical core count.
    eval_batch_size : int
        Batch size for the accuracy/agreement pass.
    seed : int
        Seed for random timing inputs when no data is given.
    worker_timeout_s : float
        Wall-clock limit of one worker process.
    axis_values : Mapping[str, tuple[int, ...]]
        Values for symbolic input dimensions beyond batch, by ONNX ``dim_param`` name, e.g.
        ``{"seq": (32, 128)}``; every combination is timed as its own shape (label ``"seq=32"``). With
        data, inputs are cut to these lengths along those axes; without data, random inputs take them.
    provider_settings : Mapping[str, ProviderSettings]
        Per provider short name, what the user set (device, TensorRT precision flags, caches,
        optimisation profiles; :mod:`minreal.runtime_bench.provider_options`). TensorRT's engine and timing caches
        default to a directory shared by the run's timing processes, its profile to one covering every
        timed batch size and axis value.
    io_binding : bool
        On GPU providers, also time each model with inputs and outputs bound on the device
        (device-only latency) beside the host-copy latency.
    """

    providers: tuple[str, ...] = ("cpu",)
    batch_sizes: tuple[int, ...] = (1,)
    warmup: int = 10
    min_runs: int = 50
    min_seconds: float = 2.0
    repeats: int = 3
    intra_op_threads: int | None = None
    eval_batch_size: int = 64
    seed: int = 0
    worker_timeout_s: float = 600.0
    axis_values: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    provider_settings: Mapping[str, ProviderSettings] = field(default_factory=dict, hash=False)
    io_binding: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(self.providers))
        unused = sorted(set(self.provider_settings) - set(self.providers))
        _require(not unused, f"provider settings for {unused} (--provider-option/--provider-config), which "
                             f"--providers does not request ({', '.join(self.providers)})")
        object.__setattr__(self, "axis_values", _axis_values(self.axis_values))
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        for short in self.providers:
            provider_name(short)
        _require(bool(self.providers), "providers (--providers) must not be empty")
        _require(bool(self.batch_sizes), "batch_sizes (--batch) must not be empty")
        _require(all(b >= 1 for b in self.batch_sizes), f"batch_sizes (--batch) must be >= 1, got {self.batch_sizes}")
        _require(self.warmup >= 0, f"warmup (--warmup) must be >= 0, got {self.warmup}")
        _require(self.min_runs >= 1, f"min_runs (--min-runs) must be >= 1, got {self.min_runs}")
        _require(self.min_seconds >= 0, f"min_seconds (--min-seconds) must be >= 0, got {self.min_seconds}")
        _require(self.repeats >= 1, f"repeats (--repeats) must be >= 1, got {self.repeats}")
        _require(0 < self.worker_timeout_s <= threading.TIMEOUT_MAX,  # inf and nan fail too
                 f"worker_timeout_s (--worker-timeout) must be > 0 and at most {threading.TIMEOUT_MAX:g} s, got "
                 f"{self.worker_timeout_s}")
        _require(self.eval_batch_size >= 1, f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        threads = self.intra_op_threads
        _require(threads is None or threads >= 1, f"intra_op_threads (--threads) must be >= 1, got {threads}")

    def threads(self) -> int:
        """The intra-op thread count this run uses (explicit, or the physical core count)."""
        return self.intra_op_threads if self.intra_op_threads is not None else default_threads()

    def shapes(self) -> tuple[dict[str, int], ...]:
        """Every combination of :attr:`axis_values` (one empty assignment when there are none)."""
        return shape_grid(self.axis_values)


def shape_grid(axis_values: Mapping[str, Sequence[int]]) -> tuple[dict[str, int], ...]:
    """All assignments ``{dim_param: value}`` of ``axis_values``, in key order then value order."""
    names = list(axis_values)
    return tuple(dict(zip(names, combo)) for combo in itertools.product(*(axis_values[n] for n in names)))


def shape_label(values: Mapping[str, int]) -> str:
    """The label of one shape assignment, e.g. ``"seq=32"`` or ``"seq=32,tgt=16"``; ``""`` when empty."""
    return ",".join(f"{name}={value}" for name, value in values.items())


def default_threads() -> int:
    """Physical core count (falls back to logical cores, then 1)."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def _axis_values(values: Mapping[str, int | Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Copy ``values`` as ``{name: (int, ...)}`` (a bare int is one value); names and values are checked."""
    _require(isinstance(values, Mapping), f"axis_values must map dim names to sizes, got {type(values).__name__}")
    out = {}
    for name, sizes in values.items():
        sizes = (sizes,) if isinstance(sizes, numbers.Integral) else tuple(sizes)
        _require(isinstance(name, str) and bool(name) and not any(c in name for c in "=,"),
                 f"axis_values names must be non-empty dim_param names without '=' or ',', got {name!r}")
        _require(bool(sizes) and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1
                                     for v in sizes),
                 f"axis_values[{name!r}] must be integers >= 1, got {sizes}")
        out[name] = tuple(int(v) for v in sizes)
    return out


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise BenchInputError(message)
