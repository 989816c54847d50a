"""What `minreal tune` searches for and under which constraint: :class:`Constraint`, :class:`TuneConfig`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from minreal.export.settings import OrtConfig, VariantConfig
from minreal.runtime_bench.config import BenchConfig

__all__ = ["Constraint", "Quality", "TuneConfig", "TuneError", "Protocol", "parse_duration", "SCREEN", "DEFAULT_GRID"]

DEFAULT_GRID = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
"""Whole-model MAC ratios a method's budget is searched over (descending)."""


class TuneError(ValueError):
    """A tune cannot run as asked (bad options, nothing to search): a usage error."""


@dataclass(frozen=True)
class Quality:
    """A model's quality on the held-out data: accuracy (fraction, with labels), top-1 agreement with the original
    (fraction, classifiers) and MSE (with float targets); None where it does not apply."""

    accuracy: float | None = None
    agreement: float | None = None
    mse: float | None = None

    @classmethod
    def from_metrics(cls, m: Mapping[str, Any]) -> "Quality":
        """From :func:`minreal.compress.core.recover.held_out_metrics` (``agreement``) or ORT metrics
        (``top1_agreement``)."""
        agreement = m.get("agreement", m.get("top1_agreement"))
        return cls(m.get("accuracy"), agreement, m.get("mse"))


@dataclass(frozen=True)
class Constraint:
    """The quality a candidate must keep, against the original on the same held-out data; exactly one of:

    ``max_accuracy_drop`` in percentage points (``0.5`` = half a point, as ``minreal check --max-accuracy-drop``),
    ``min_agreement`` as a fraction (top-1 agreement with the original), ``max_mse_increase`` in the targets'
    squared units (regressors).
    """

    max_accuracy_drop: float | None = None
    min_agreement: float | None = None
    max_mse_increase: float | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("max_accuracy_drop", "min_agreement", "max_mse_increase") if getattr(self, k) is not None]
        if len(given) != 1:
            raise TuneError("give exactly one constraint: --max-accuracy-drop PP, --min-agreement FRACTION or "
                            f"--max-mse-increase VALUE (got {len(given)})")
        value = getattr(self, given[0])
        if not math.isfinite(value) or value < 0:
            raise TuneError(f"--{given[0].replace('_', '-')} must be a finite number >= 0, got {value}")
        if self.min_agreement is not None and self.min_agreement > 1:
            raise TuneError(f"--min-agreement is a fraction in [0, 1], got {self.min_agreement}")

    @property
    def metric(self) -> str:
        """The quality the constraint reads: ``accuracy``, ``agreement`` or ``mse``."""
        return ("accuracy" if self.max_accuracy_drop is not None else
                "agreement" if self.min_agreement is not None else "mse")

    def describe(self) -> str:
        if self.max_accuracy_drop is not None:
            return f"accuracy drop <= {self.max_accuracy_drop:g} pp"
        if self.min_agreement is not None:
            return f"top-1 agreement >= {self.min_agreement:g}"
        return f"MSE increase <= {self.max_mse_increase:g}"

    def score(self, q: Quality) -> float | None:
        """The constrained metric as a higher-is-better number (MSE negated); None when ``q`` lacks it."""
        value = getattr(q, self.metric)
        return None if value is None else (-value if self.metric == "mse" else value)

    def loss(self, q: Quality, reference: Quality) -> float | None:
        """How much ``q`` gives up against ``reference``: accuracy drop in pp, 1 − agreement, MSE increase."""
        if self.metric == "agreement":
            return None if q.agreement is None else 1.0 - q.agreement
        value, ref = getattr(q, self.metric), getattr(reference, self.metric)
        if value is None or ref is None:
            return None
        return 100.0 * (ref - value) if self.metric == "accuracy" else value - ref

    def holds(self, q: Quality, reference: Quality) -> bool:
        """Whether ``q`` meets the constraint against ``reference`` (a missing metric never does)."""
        if self.metric == "agreement":
            return q.agreement is not None and q.agreement >= self.min_agreement - 1e-12
        loss = self.loss(q, reference)
        limit = self.max_accuracy_drop if self.metric == "accuracy" else self.max_mse_increase
        return loss is not None and loss <= limit + 1e-9


@dataclass(frozen=True)
class Protocol:
    """A timing protocol of :class:`minreal.runtime_bench.BenchConfig` (fresh processes each repeat)."""

    min_seconds: float
    repeats: int
    min_runs: int
    warmup: int

    @classmethod
    def of(cls, bench: BenchConfig) -> Protocol:
        """The protocol ``bench`` times with."""
        return cls(*(getattr(bench, f.name) for f in fields(cls)))


SCREEN = Protocol(min_seconds=0.25, repeats=1, min_runs=20, warmup=5)
"""Short protocol: ranks candidates that met the constraint; only the front goes on to the release protocol
(:attr:`TuneConfig.confirm`)."""


@dataclass(frozen=True)
class TuneConfig:
    """Options of :func:`minreal.app.tune.tune`.

    It composes the settings of the stages it drives rather than repeating their fields: the timing settings are one
    :class:`~minreal.runtime_bench.BenchConfig` (``bench``; :meth:`with_bench` changes it, :meth:`bench_config` gives
    one pass's settings), the export, parity and INT8 settings of every file one
    :class:`~minreal.export.settings.VariantConfig` (``variant``; :meth:`with_variant` changes it).

    ``methods`` empty: every registered method with a whole-model MAC budget. ``recover_epochs``: the recovery cap;
    every method is bisected without recovery and, when > 0, its budgets just below that search's boundary race
    for this many epochs by successive halving (``halving_*``; quantisation-aware recovery for the INT8 of the
    winners when ``qat``). ``time_budget_s``: no new search step starts after it (what was measured
    is still reported).
    """

    constraint: Constraint
    bench: BenchConfig = BenchConfig()
    """What is timed and how (``minreal bench``'s defaults): the cells, ``providers`` x ``batch_sizes`` (the first
    decides the choice), and the release protocol the fronts and the baselines are confirmed with (``min_seconds``,
    ``repeats``, ``min_runs``, ``warmup``: :attr:`confirm`). The screening pass times the same cells with
    :attr:`screen`."""
    objective: str = "latency"
    methods: tuple[str, ...] = ()
    grid: tuple[float, ...] = DEFAULT_GRID
    recover_epochs: int = 0
    max_size_kb: float | None = None
    """Largest deployable file in KiB (on disk, external data included; ``--max-size``): a constraint beside the
    quality one, judged on every file, the original's included (with ``ort``, on its ``.onnx`` and its ``.ort``
    file); None: no limit."""
    int8: bool = True
    qat: bool = True
    accuracy_control: bool = True
    variant: VariantConfig = VariantConfig()
    """How every file is exported, checked and quantised, the baselines' and the candidates' alike: opset, parity
    tolerances, the INT8 target (``--quant-target``; ``cpu`` is resolved on the machine that times the files when the
    tune starts), calibration samples; the mode is static (what accuracy control and quantisation-aware recovery
    work on). ``report.json``'s config records its ``quant_target`` in this
    field's place."""
    time_budget_s: float | None = None
    screen: Protocol = SCREEN
    """The short protocol that ranks the files that met the constraint (one process each)."""
    workers: int = 1
    plan: tuple[Any, ...] = ()
    """Fixed variants from a plan file (:class:`minreal.compress.core.run_case.VariantSpec`, e.g. chains such as
    width then factorise), each evaluated as it is at every recovery budget, next to the searched methods."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Method options applied to every candidate where the method has them (e.g. ``rank_multiple``)."""
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    """Dynamic axes besides the batch by input name (``--dynamic-axes``), kept by every exported file."""
    stats_samples: int = 1024
    """Calibration samples the methods' statistics (``prepare``) see: a seeded subsample of at most this many (0:
    all). Recovery and the judgement always use all the data. Second moments of a few thousand feature maps are
    already well estimated, and the statistics pass grows with the samples. ``benchmarks/stats_samples.py``, on the
    pretrained ResNet-32 and real CIFAR-10 images: factorize's prepare took 24.5 s on 1,024 images and 189 s on
    all 7,000; at MAC ratios 0.9, 0.7 and 0.5 every layer's rank is the same, at 0.3 two of 31 differ by one, and
    held-out top-1 differs by at most 0.7 pp (0.2 pp above a ratio of 0.5)."""
    ort: OrtConfig | None = None
    """``--format onnx,ort``: the converter's settings for ``chosen.ort`` (ONNX Runtime's ORT format of the chosen
    file, with ``chosen.required_operators.config``); None: ``chosen.onnx`` only."""
    halving_eta: int = 3
    """Successive halving of the recovered candidates (:mod:`.halving`): each rung keeps ``1/eta`` of its
    candidates and gives them ``eta`` times the recovery."""
    halving_rungs: int = 3
    """Rungs up to the full recovery cap (3 with eta 3: 1/9, 1/3 and all of it)."""
    halving_per_method: int = 2
    """Grid budgets per method that enter the first rung (the largest below its zero-shot boundary)."""
    structure_screen: bool = True
    """With the latency objective, time each method's fastest structure in the race's pool (its smallest budget's
    zero-shot model) beside the baselines first, and race only the methods faster than a baseline that meets the
    constraint in some cell (:mod:`.halving`); False: every budget of the pool races."""

    def __post_init__(self) -> None:
        if self.objective not in ("latency", "size"):
            raise TuneError(f"--objective must be latency or size, got {self.objective!r}")
        grid = tuple(sorted({float(g) for g in self.grid}, reverse=True))
        if not grid or any(not 0 < g <= 1 for g in grid):
            raise TuneError(f"--grid takes MAC ratios in (0, 1], got {list(self.grid)}")
        object.__setattr__(self, "grid", grid)
        if self.recover_epochs < 0:
            raise TuneError(f"`TuneConfig.recover_epochs` must be >= 0, got {self.recover_epochs}")
        if self.max_size_kb is not None and not (math.isfinite(self.max_size_kb) and self.max_size_kb > 0):
            raise TuneError(f"--max-size must be a positive number of KiB, got {self.max_size_kb}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise TuneError(f"--time-budget must be positive, got {self.time_budget_s} s")
        if self.stats_samples < 0:
            raise TuneError(f"--stats-samples must be >= 0 (0: all the calibration data), got {self.stats_samples}")
        if self.halving_eta < 2 or self.halving_rungs < 1 or self.halving_per_method < 1:
            raise TuneError("successive halving needs eta >= 2, at least one rung and one budget per method, got "
                            f"eta {self.halving_eta}, {self.halving_rungs} rung(s), "
                            f"{self.halving_per_method} per method")
        if self.workers < 0:
            raise TuneError(f"--workers must be >= 0 (0: candidates in this process), got {self.workers}")
        if self.int8 and self.variant.quant_mode != "static":
            raise TuneError("a tune writes static INT8 files (accuracy control and quantisation-aware recovery work "
                            "on calibrated ranges): `TuneConfig.variant.quant_mode` must be 'static', got "
                            f"{self.variant.quant_mode!r} (or int8=False)")

    @property
    def quant_target(self) -> str:
        """The INT8 target of every file: :attr:`variant`'s."""
        return self.variant.quant_target

    @property
    def confirm(self) -> Protocol:
        """The release protocol of the fronts and the baselines, in fresh processes: :attr:`bench`'s."""
        return Protocol.of(self.bench)

    def with_bench(self, **changes: Any) -> TuneConfig:
        """This config with ``changes`` made to :attr:`bench` (checked by :class:`~minreal.runtime_bench.BenchConfig`,
        whose errors name the field and its flag)."""
        return replace(self, bench=replace(self.bench, **changes))

    def with_variant(self, **changes: Any) -> TuneConfig:
        """This config with ``changes`` made to :attr:`variant` (checked by
        :class:`~minreal.export.settings.VariantConfig`)."""
        return replace(self, variant=replace(self.variant, **changes))

    def bench_config(self, protocol: Protocol) -> BenchConfig:
        """Timing settings of one pass: :attr:`bench` timed with ``protocol`` (:attr:`screen` or :attr:`confirm`)."""
        return replace(self.bench, **asdict(protocol))

    def to_json(self) -> dict[str, Any]:
        """``report.json``'s config, laid out as before the config composed :attr:`bench` and :attr:`variant`:
        ``providers`` and ``batch_sizes`` in the place of :attr:`bench`, ``quant_target`` in that of :attr:`variant`,
        ``confirm`` (the release protocol) after ``screen``; values still to pass through
        :func:`~minreal.export.json_safe.to_jsonable`."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "bench":
                out.update(providers=self.bench.providers, batch_sizes=self.bench.batch_sizes)
            elif f.name == "variant":
                out["quant_target"] = self.variant.quant_target
            else:
                out[f.name] = getattr(self, f.name)
            if f.name == "screen":
                out["confirm"] = self.confirm
        return out

    def describe_limits(self) -> str:
        """The quality constraint, and the size limit when there is one, in words."""
        files = " (.onnx and .ort)" if self.ort is not None else ""
        size = f" and file <= {self.max_size_kb:g} KB{files}" if self.max_size_kb is not None else ""
        return self.constraint.describe() + size

    def fits(self, size_bytes: int) -> bool:
        """Whether a file of ``size_bytes`` bytes (an ``.onnx`` or an ``.ort`` file) meets ``max_size_kb``."""
        return self.max_size_kb is None or size_bytes <= self.max_size_kb * 1024

    @property
    def recovery_budgets(self) -> tuple[int, ...]:
        return (0, self.recover_epochs) if self.recover_epochs else (0,)


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``20m``, ``1.5h``; TuneError naming ``--time-budget`` otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h)?\s*", text or "")
    if not match:
        raise TuneError(f"--time-budget takes a duration such as 90s, 20m or 1h, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]
