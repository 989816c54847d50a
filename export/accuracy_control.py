"""INT8 with accuracy control: the most sensitive layers fall back to float until the metric drop is met.

After NNCF's ``quantize_with_accuracy_control``: quantise everything; if the metric drops by more than allowed,
rank the quantised operations by how much of the drop reverting each one alone recovers, then revert them to
float one at a time, most harmful first, re-measuring after each, until the drop is within the limit. One that alone
recovers nothing is not reverted; where the limit is not reached, the shortest run of reverted operations with the
smallest drop is kept (none, when no step beat the plain INT8). Here an
operation is one Conv/Gemm/MatMul node of the graph ONNX Runtime's quantiser sees
(:func:`minreal.export.int8.quantizable_nodes`), reverting it is :func:`minreal.export.int8.quantize_int8`'s
``exclude``, and its sensitivity is measured exactly: the metric of the INT8 model with only that node in float (one
quantisation per ranked node, no proxy). The activation ranges do not depend on which nodes are in float, so the
model is calibrated once (:func:`minreal.export.int8.calibrate`) for all those quantisations.

Units (as in :class:`minreal.runtime_bench.metrics.ModelMetrics` and ``minreal check --max-accuracy-drop``): accuracy
(top-1 against integer labels) and agreement (top-1 agreement with the fp32 model) are fractions in [0, 1] and
their drops are percentage points; mse (against float targets; lower is better) is in squared output units and its
drop is its increase.
"""

from __future__ import annotations

import logging
import math
import operator
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np

from minreal.export.atomic import ensure_distinct
from minreal.export.errors import CalibrationError
from minreal.export.int8 import (
    Calibration,
    QuantConfig,
    QuantResult,
    calibrate,
    calibration_digest,
    quantizable_nodes,
    quantize_int8,
    reusable_calibration,
)
from minreal.export.int8.calibration import calibrations_kept
from minreal.runtime_bench import BenchInputError
from minreal.runtime_bench.atomic import atomic_write_bytes
from minreal.runtime_bench.inputs import Data, data_rows
from minreal.runtime_bench.metrics import ModelMetrics, evaluate_models, is_classification, reference_outputs_kept

__all__ = ["METRICS", "MetricSpec", "FallbackStep", "AccuracyControlResult", "metric_drop", "outside_in",
           "quantize_with_accuracy_control"]

logger = logging.getLogger(__name__)

EVAL_BATCH = 64
"""Evaluation batch size (a model with a fixed batch axis uses its own)."""


@dataclass(frozen=True)
class MetricSpec:
    """How one metric is read and compared.

    Attributes
    ----------
    read : Callable[[ModelMetrics], float | None]
        the value in a :class:`~minreal.runtime_bench.metrics.ModelMetrics` (``None`` if not computable).
    higher_is_better : bool
        accuracy-like (drop = decrease) or error-like (drop = increase).
    drop_scale : float
        drop units per metric unit: 100 turns fractions into percentage points.
    unit : str
        unit of the drop, for messages.
    labels : bool | None
        ``True`` needs integer labels, ``False`` float targets, ``None`` no labels.
    reference : bool
        measured against the fp32 model's outputs (computed once per call, read back for each candidate).
    """

    read: Callable[[ModelMetrics], float | None]
    higher_is_better: bool
    drop_scale: float
    unit: str
    labels: bool | None
    reference: bool


METRICS: dict[str, MetricSpec] = {
    "accuracy": MetricSpec(operator.attrgetter("accuracy"), True, 100.0, "pp", labels=True, reference=False),
    "agreement": MetricSpec(operator.attrgetter("top1_agreement"), True, 100.0, "pp", labels=None, reference=True),
    "mse": MetricSpec(operator.attrgetter("mse"), False, 1.0, "", labels=False, reference=False),
}
"""Metric name → :class:`MetricSpec`: the ``metric`` argument of :func:`quantize_with_accuracy_control`."""


@dataclass(frozen=True)
class FallbackStep:
    """One node returned to float, and the model's metric and drop (vs fp32) with it and all before it in float."""

    node: str
    metric: float
    drop: float


@dataclass(frozen=True)
class AccuracyControlResult:
    """What :func:`quantize_with_accuracy_control` wrote and how it got there.

    Attributes
    ----------
    path : str
        the written INT8 model.
    metric : str
        ``"accuracy"``, ``"agreement"`` or ``"mse"``.
    max_drop : float
        the allowed drop (percentage points for accuracy/agreement, absolute increase for mse).
    fp32_metric : float
        metric of the float model (agreement: 1.0).
    int8_metric : float
        metric of the fully quantised model.
    int8_drop : float
        its drop.
    final_metric : float
        metric of the written model.
    drop : float
        its drop.
    met : bool
        ``drop <= max_drop``.
    quant : QuantResult
        the written model's :class:`~minreal.export.int8.QuantResult`.
    excluded : list[FallbackStep]
        the nodes returned to float, in order, each with the metric after its exclusion.
    sensitivities : dict[str, float]
        ranked node → metric of the INT8 model with only that node in float, most harmful
        (largest recovery) first; empty when the full INT8 model met the target.
    quantizations : int
        quantisations run (intermediate models are written in a temporary folder; a plain INT8
        file given as ``int8`` is not one).
    seconds : float
        wall time.
    """

    path: str
    metric: str
    max_drop: float
    fp32_metric: float
    int8_metric: float
    int8_drop: float
    final_metric: float
    drop: float
    met: bool
    quant: QuantResult
    excluded: list[FallbackStep] = field(default_factory=list)
    sensitivities: dict[str, float] = field(default_factory=dict)
    quantizations: int = 0
    seconds: float = 0.0

    @property
    def excluded_nodes(self) -> list[str]:
        """The nodes left in float by accuracy control, in the order they were excluded."""
        return [step.node for step in self.excluded]


def metric_drop(reference: float, value: float, metric: str) -> float:
    """Drop of ``value`` from ``reference``: decrease for accuracy-like metrics (in percentage points for
    fractions), increase for error-like ones; positive is worse."""
    spec = METRICS[metric]
    change = reference - value if spec.higher_is_better else value - reference
    return spec.drop_scale * change


def outside_in(nodes: Sequence[str]) -> list[str]:
    """First, last, second, second-to-last, …: the order in which a capped ranking visits the nodes (the first
    and last layers of a network are the usual suspects of quantisation damage)."""
    order = []
    for i in range((len(nodes) + 1) // 2):
        order += [nodes[i]] if i == len(nodes) - 1 - i else [nodes[i], nodes[len(nodes) - 1 - i]]
    return order


def _check_arguments(spec_name: str, max_drop: float, max_fallback: int | None,
                     eval_x: Data, eval_y: np.ndarray | None) -> MetricSpec:
    """The metric's spec, after checking the options and that the labels suit the metric."""
    if spec_name not in METRICS:
        raise ValueError(f"metric={spec_name!r} is not one of {tuple(METRICS)}")
    if not math.isfinite(max_drop) or max_drop < 0:
        raise ValueError(f"max_drop={max_drop} must be finite and ≥ 0 (percentage points for accuracy/agreement, "
                         "absolute increase for mse)")
    if max_fallback is not None and max_fallback < 0:
        raise ValueError(f"max_fallback={max_fallback} must be ≥ 0 (or None: rank every quantised node)")
    try:
        data_rows(eval_x)
    except BenchInputError as exc:
        raise CalibrationError(f"evaluation data: {exc}; pass a few hundred held-out inputs as eval_x") from None
    spec = METRICS[spec_name]
    if spec.labels is not None and (eval_y is None or is_classification(eval_y) != spec.labels):
        wanted = "integer class labels" if spec.labels else "float regression targets"
        raise CalibrationError(f"metric={spec_name!r} needs {wanted} as eval_y; got "
                               f"{'none' if eval_y is None else np.asarray(eval_y).dtype}")
    return spec


def _measurer(spec: MetricSpec, fp32_path: Path, eval_x: Data, eval_y: np.ndarray | None,
              threads: int | None) -> Callable[[Path], float]:
    """``measure(path)``: the metric of one model on the evaluation data, through ONNX Runtime CPU sessions."""
    labels = eval_y if spec.labels is not None else None

    def measure(path: Path) -> float:
        reference = spec.reference and path != fp32_path  # the fp32 model's agreement with itself: one run
        names, paths = (["fp32", path.name], [fp32_path, path]) if reference else ([path.name], [path])
        try:
            value = spec.read(evaluate_models(names, paths, eval_x, labels, EVAL_BATCH, threads or 0)[-1])
        except BenchInputError as exc:
            raise CalibrationError(f"evaluation data: {exc}") from None
        if value is None:
            raise CalibrationError(f"the metric cannot be computed for {path.name}: top-1 agreement needs "
                                   "(batch, classes ≥ 2) outputs; use metric='mse' with targets")
        return float(value)

    return measure


class _Quantiser:
    """Quantises with a given set of float nodes into a work folder, measures, and remembers each set's result.

    Static mode calibrates once, at the first quantisation, for every set (where ONNX Runtime can reuse ranges,
    :func:`~minreal.export.int8.reusable_calibration`); ``plain``, the INT8 file with no node in float, is measured
    instead of quantised.
    """

    def __init__(self, fp32_path: Path, workdir: Path, calib: np.ndarray | None, config: QuantConfig,
                 measure: Callable[[Path], float], plain: QuantResult | None = None) -> None:
        self.fp32_path, self.workdir, self.calib, self.measure = fp32_path, workdir, calib, measure
        self.config, self.plain = config, plain
        self.calibration: Calibration | None = None
        self.done: dict[frozenset[str], tuple[QuantResult, float]] = {}
        self.runs = 0

    def __call__(self, exclude: Sequence[str]) -> tuple[QuantResult, float]:
        key = frozenset(exclude)
        if key not in self.done:
            quant = self.plain if not key and self.plain is not None else self._quantize(exclude)
            self.done[key] = quant, self.measure(Path(quant.out_path))
        return self.done[key]

    def _quantize(self, exclude: Sequence[str]) -> QuantResult:
        if self.calibration is None and self.config.mode == "static" and reusable_calibration():
            self.calibration = calibrate(self.fp32_path, self.calib, self.config)
        self.runs += 1
        out = self.workdir / f"int8-{self.runs}.onnx"
        return quantize_int8(self.fp32_path, out, self.calib, self.config, exclude=list(exclude),
                             calibration=self.calibration)


def _check_plain(int8: QuantResult, fp32_path: Path, config: QuantConfig, calib: Data | None) -> None:
    """``int8`` is a calibrated quantisation of ``fp32_path`` in ``config``'s format (its target explicit), on the rows
    of ``calib`` in their order (their digest, where ``int8`` records one; else their count), or on the seeded random
    rows of ``config`` where ``calib`` is None, and not on ranges trained by quantisation-aware recovery."""
    act_type, symmetric = config.activation() if config.mode == "static" else ("uint8", False)
    wanted = (fp32_path.resolve(), config.mode, config.target, act_type, symmetric, config.weight_type,
              config.per_channel)
    given = (Path(int8.fp32_path).resolve(), int8.mode, int8.target, int8.activation_type, int8.activation_symmetric,
             int8.weight_type, int8.per_channel)
    if given != wanted:
        raise ValueError(f"int8 is the {int8.mode} {int8.target} INT8 of {int8.fp32_path}, not this config's of "
                         f"{fp32_path}; pass the plain INT8 quantize_int8 wrote of this model with this config, "
                         "or none")
    samples = None if calib is None or config.mode != "static" else data_rows(calib)
    if int8.range_source != "calibrated" or (samples is not None and int8.calibration_samples != samples):
        raise ValueError(f"int8 ({int8.out_path}) has {int8.range_source} ranges from {int8.calibration_samples} "
                         f"samples, not ranges calibrated on this calibration data's {samples}; pass the plain INT8 "
                         "quantize_int8 wrote with this data, or none")
    # the rows themselves (random ones too: calib=None where the config allows them), where int8 records them
    checkable = config.mode == "static" and (calib is not None or config.allow_random_calibration)
    if checkable and int8.calibration_digest \
            and int8.calibration_digest != calibration_digest(fp32_path, calib, config):
        given = "random rows" if int8.random_calibration else f"{int8.calibration_samples} other rows"
        wanted = "this config's random rows" if calib is None else f"this calibration data's {samples} rows"
        raise ValueError(f"int8 ({int8.out_path}) was calibrated on {given}, not on {wanted} (or on them in another "
                         "order); pass the plain INT8 quantize_int8 wrote with this data, or none")


def _rank(quantiser: _Quantiser, nodes: Sequence[str], drop: Callable[[float], float], unit: str,
          say: Callable[[str], None]) -> dict[str, float]:
    """Node → metric with only that node in float, most harmful node (largest recovery) first; ties keep the
    order of ``nodes``."""
    metrics = {}
    for i, node in enumerate(nodes, 1):
        metrics[node] = quantiser([node])[1]
        say(f"sensitivity {i}/{len(nodes)}: {node} in float → drop {drop(metrics[node]):.4g}{unit}")
    return dict(sorted(metrics.items(), key=lambda item: drop(item[1])))


def _fall_back(quantiser: _Quantiser, ranked: Sequence[str], drop: Callable[[float], float], max_drop: float,
               unit: str, say: Callable[[str], None]) -> list[FallbackStep]:
    """Exclude ``ranked`` nodes cumulatively until the drop is at most ``max_drop`` (or all are in float)."""
    steps: list[FallbackStep] = []
    for node in ranked:
        value = quantiser([*(s.node for s in steps), node])[1]
        steps.append(FallbackStep(node, value, drop(value)))
        say(f"fallback {len(steps)}/{len(ranked)}: {node} in float → drop {steps[-1].drop:.4g}{unit}")
        if steps[-1].drop <= max_drop:
            break
    return steps


def _best_prefix(steps: list[FallbackStep], int8_drop: float, max_drop: float) -> list[FallbackStep]:
    """``steps`` when their last meets ``max_drop``; else (the target missed) the shortest prefix with the smallest
    drop, none where every step left a larger drop than the plain INT8's ``int8_drop``: more float kernels are worth
    it only where they bought accuracy."""
    if not steps or steps[-1].drop <= max_drop:
        return steps
    drops = [int8_drop, *(s.drop for s in steps)]
    return steps[:drops.index(min(drops))]


def quantize_with_accuracy_control(
    fp32_path: str | Path,
    out_path: str | Path,
    calib: np.ndarray | None,
    eval_x: Data,
    eval_y: np.ndarray | None,
    max_drop: float,
    config: QuantConfig | None = None,
    metric: str = "accuracy",
    max_fallback: int | None = None,
    progress: Callable[[str], None] | None = None,
    threads: int | None = None,
    int8: QuantResult | None = None,
) -> AccuracyControlResult:
    """INT8 quantisation that returns the most sensitive Conv/Gemm/MatMul nodes to float until the metric drop
    is within ``max_drop`` (NNCF's accuracy-control loop; see the module docstring).

    Parameters
    ----------
    fp32_path : str | Path
        float model (not modified).
    out_path : str | Path
        destination (must differ from ``fp32_path``); written atomically, also when the target is missed.
    calib : np.ndarray | None
        calibration inputs for :func:`~minreal.export.int8.quantize_int8`.
    eval_x : Data
        held-out inputs, batch along axis 0: one array, or arrays by graph input name.
    eval_y : np.ndarray | None
        integer labels (accuracy), float targets (mse), or ``None`` (agreement ignores it).
    max_drop : float
        allowed drop vs the fp32 model: percentage points for accuracy/agreement (a bare 1.0 = 1 pp,
        as ``minreal check --max-accuracy-drop``), absolute increase for mse.
    config : QuantConfig | None
        quantisation options; default :class:`~minreal.export.int8.QuantConfig`.
    metric : str
        a name in :data:`METRICS`.
    max_fallback : int | None
        most nodes ranked (so most returned to float), visited :func:`outside_in`; ``None`` ranks all.
    progress : Callable[[str], None] | None
        called with one line per ranked node and per fallback step (default: this module's logger).
    threads : int | None
        intra-op threads of the evaluation sessions; ``None`` leaves ONNX Runtime's default.
    int8 : QuantResult | None
        the plain INT8 of ``fp32_path`` (no node excluded) that :func:`~minreal.export.int8.quantize_int8`
        already wrote with this ``calib`` and ``config``: measured as the starting point instead of quantised again.

    Returns
    -------
    AccuracyControlResult
        An :class:`AccuracyControlResult`; ``met`` says whether the drop is within ``max_drop``.

    Raises
    ------
    ValueError
        unknown metric, negative ``max_drop`` or ``max_fallback``; ``int8`` of another model or format.
    CalibrationError
        evaluation data that does not fit the model or the metric (or bad calibration data).
    QuantizationError
        ONNX Runtime could not quantise the model.
    """
    start = time.perf_counter()
    spec = _check_arguments(metric, max_drop, max_fallback, eval_x, eval_y)
    ensure_distinct(fp32_path, out_path)
    fp32_path, out_path, say = Path(fp32_path), Path(out_path), progress or logger.info
    config = (config or QuantConfig()).resolved()  # once: every quantisation below receives the explicit target
    if int8 is not None:
        _check_plain(int8, fp32_path, config, calib)
    measure = _measurer(spec, fp32_path, eval_x if isinstance(eval_x, Mapping) else np.asarray(eval_x), eval_y,
                        threads)
    # agreement: the fp32 model's outputs are computed once and read back for every candidate (the other metrics
    # run each candidate alone: nothing to keep)
    kept = [fp32_path] if spec.reference else []
    # and the model is pre-processed and calibrated once for all its quantisations
    with reference_outputs_kept(*kept), calibrations_kept(), tempfile.TemporaryDirectory() as workdir:
        fp32_value = measure(fp32_path)
        drop = partial(metric_drop, fp32_value, metric=metric)
        quantiser = _Quantiser(fp32_path, Path(workdir), calib, config, measure, int8)
        int8_value = quantiser([])[1]
        say(f"fp32 {metric} {fp32_value:.4g}, INT8 {int8_value:.4g}: drop {drop(int8_value):.4g}{spec.unit} "
            f"(allowed {max_drop:g}{spec.unit})")
        ranking, steps = {}, []
        if drop(int8_value) > max_drop:
            ranking = _rank(quantiser, outside_in(quantizable_nodes(fp32_path))[:max_fallback], drop, spec.unit, say)
            # a node that recovers nothing alone is not worth its float kernel
            helpful = [n for n, v in ranking.items() if drop(v) < drop(int8_value)]
            tried = _fall_back(quantiser, helpful, drop, max_drop, spec.unit, say)
            steps = _best_prefix(tried, drop(int8_value), max_drop)
            if len(steps) < len(tried):
                best = steps[-1].drop if steps else drop(int8_value)
                say(f"drop not met: {len(steps)} of the {len(tried)} layers tried stay in float, the fewest with the "
                    f"smallest drop ({best:.4g}{spec.unit})")
        quant, final = quantiser([s.node for s in steps])  # every set was quantised before: cached
        atomic_write_bytes(out_path, Path(quant.out_path).read_bytes())
    return AccuracyControlResult(
        path=str(out_path), metric=metric, max_drop=max_drop, fp32_metric=fp32_value, int8_metric=int8_value,
        int8_drop=drop(int8_value), final_metric=final, drop=drop(final), met=drop(final) <= max_drop,
        excluded=steps, sensitivities=ranking, quantizations=quantiser.runs,
        seconds=time.perf_counter() - start, quant=replace(quant, out_path=str(out_path)),
    )  # fmt: skip
