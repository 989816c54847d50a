"""Registry of compression methods: built-ins found by iterating :mod:`minreal.compress.methods`, third-party ones
through the entry-point group ``minreal.methods``; :func:`compress` runs one and fills what every method reports."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
import pkgutil
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minreal.facts import error_line

from .core.errors import CompressionError, UnknownMethodError
from .core.lazy import LazyCallable
from .core.measuring import method_measurements
from .core.memory import release_freed_memory
from .core.options import BUDGET_FIELDS, field_clash, flag_of
from .core.recover_options import RecoveryConfig
from .core.report import UNSET, CompressionReport, Measured
from .core.spec import MethodFn, MethodSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .core.data import Dataset

__all__ = ["MethodRegistry", "ENTRY_POINT_GROUP", "register", "register_method", "get_method", "method_names",
           "compress", "compress_chain", "chain_label", "fill_costs", "apply_recovery", "state_points", "Prepared",
           "prepare", "realise", "prepared_key", "BUDGET_SLACK", "budget_shortfall", "OVERSHOOT",
           "budget_overshoot", "require_axes_hold", "require_budget"]

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "minreal.methods"
BUILTIN_PACKAGE = "minreal.compress.methods"
# torch's side, imported on first call: looking methods up (names, configs, the CLI's options) imports no torch
count_costs = LazyCallable("minreal.compress.core.costs:count_costs")
count_macs_torch = LazyCallable("minreal.compress.core.costs:count_macs_torch")
uncovered_modules = LazyCallable("minreal.compress.core.costs:uncovered_modules")
whole_model_macs = LazyCallable("minreal.compress.core.costs:whole_model_macs")
shapes_of_sample = LazyCallable("minreal.compress.core.inputs:shapes_of_sample")
compare_outputs = LazyCallable("minreal.compress.core.evaluate:compare_outputs")
require_tensor_outputs = LazyCallable("minreal.compress.core.evaluate:require_tensor_outputs")
untied_note = LazyCallable("minreal.compress.core.surgery:untied_note")
held_out_metrics = LazyCallable("minreal.compress.core.recover:held_out_metrics")
recover = LazyCallable("minreal.compress.core.recover:recover")


class MethodRegistry:
    """Method specs by name, loaded on first use. A built-in or run-time registration that duplicates a name, or
    declares apart a config field another method has, is an error (ValueError); such a third-party entry point is
    skipped with a one-line warning, so that it never breaks the built-ins."""

    def __init__(self) -> None:
        self._specs: dict[str, MethodSpec] | None = None

    def specs(self) -> dict[str, MethodSpec]:
        if self._specs is None:
            specs: dict[str, MethodSpec] = {}  # assigned only once complete: an error leaves nothing half-loaded
            for spec in _builtin_specs():
                _add(specs, spec)
            for ep, spec in _entry_point_specs():
                problem = _conflict(specs, spec)
                if problem is not None:
                    log.warning("skipping method entry point %r (%s): %s", ep.name, ep.value, problem)
                    continue
                specs[spec.name] = spec
            self._specs = specs
        return self._specs

    def add(self, spec: MethodSpec) -> None:
        _add(self.specs(), spec)


def _conflict(specs: dict[str, MethodSpec], spec: MethodSpec) -> str | None:
    """Why ``spec`` cannot join ``specs`` (a taken name, a config field declared apart), or None."""
    if spec.name in specs:
        return f"compression method {spec.name!r} is already registered"
    return field_clash({n: s.config_cls for n, s in specs.items()}, spec.name, spec.config_cls)


def _add(specs: dict[str, MethodSpec], spec: MethodSpec) -> None:
    if not isinstance(spec, MethodSpec):
        raise TypeError(f"a method registers a MethodSpec, got {type(spec).__name__}")
    problem = _conflict(specs, spec)
    if problem is not None:
        raise ValueError(problem)
    specs[spec.name] = spec


def _builtin_specs() -> list[MethodSpec]:
    """The ``SPEC`` of every package under :mod:`minreal.compress.methods` (a package without one is an error)."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    specs = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")
        if not hasattr(module, "SPEC"):
            raise ImportError(f"method package {module.__name__} exports no SPEC (a MethodSpec)")
        specs.append(module.SPEC)
    return specs


def _entry_point_specs() -> list[tuple[Any, MethodSpec]]:
    """(entry point, spec) of the ``minreal.methods`` entry points; a broken one is skipped with a one-line
    warning."""
    specs = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()
            spec = getattr(spec, "SPEC", spec)  # a module exporting SPEC, or the MethodSpec itself
            if not isinstance(spec, MethodSpec):
                raise TypeError(f"it loads a {type(spec).__name__}, not a MethodSpec")
        except Exception as exc:
            first = error_line(exc)
            log.warning("skipping method entry point %r (%s): %s", ep.name, ep.value, first)
            continue
        specs.append((ep, spec))
    return specs


_REGISTRY = MethodRegistry()


def register(spec: MethodSpec) -> MethodSpec:
    """Register ``spec`` at run time (packages and entry points need no call); a duplicate name is an error."""
    _REGISTRY.add(spec)
    return spec


def register_method(name: str, config_cls: type, summary: str) -> Callable[[MethodFn], MethodFn]:
    """Decorator form of :func:`register` for a plain function (no demo case, no provider defaults)."""

    def deco(fn: MethodFn) -> MethodFn:
        register(MethodSpec(name, summary, config_cls, fn))
        return fn

    return deco


def get_method(name: str) -> MethodSpec:
    """Look up a method by name."""
    try:
        return _REGISTRY.specs()[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown compression method {name!r}; choose one of: {', '.join(method_names())}") from None


def method_names() -> list[str]:
    """Registered method names, sorted."""
    return sorted(_REGISTRY.specs())


def fill_costs(report: CompressionReport, model: nn.Module, new: nn.Module, example: torch.Tensor) -> None:
    """Whole-model parameters and MACs before/after into ``report``: MACs counted by torch (FlopCounterMode),
    the per-layer rules' sums beside them, and what each of the two does not count; both on the first sample of
    ``example`` (the costs are per sample: 8 samples made the rules' count 8 forward passes, 4.0 of a ResNet-50's
    compress seconds against 1.4)."""
    example = example[:1]
    before, after = count_costs(model, example), count_costs(new, example)
    torch_before, torch_after = count_macs_torch(model, example), count_macs_torch(new, example)
    report.params_before, report.params_after = before.total_params, after.total_params
    report.macs_before = whole_model_macs(torch_before, before)
    report.macs_after = whole_model_macs(torch_after, after)
    report.rule_macs_before, report.rule_macs_after = before.macs, after.macs
    report.macs_at = shapes_of_sample(example)
    report.not_counted = after.not_counted
    report.not_covered_by_rules = sorted(set(uncovered_modules(model, torch_before))
                                         | set(uncovered_modules(new, torch_after)))
    report.not_counted_by_torch = sorted(set(torch_before.uncounted_ops) | set(torch_after.uncounted_ops))
    report.predicted.whole_model_mac_ratio = report.mac_ratio
    report.predicted.whole_model_param_ratio = report.param_ratio


def require_budget(method: str, cfg: Any) -> None:
    """CompressionError (one line, naming the flag) when ``cfg`` asks for a whole-model budget that ``method`` cannot
    meet: for callers that check options before any work (``minreal run`` builds every config first)."""
    _requested_budget(get_method(method), cfg)


def _requested_budget(spec: MethodSpec, cfg: Any) -> tuple[str, float] | None:
    """The whole-model budget ``cfg`` asks for (field, ratio), or None; CompressionError naming the flag when
    the method cannot meet that kind of budget."""
    given = [k for k in BUDGET_FIELDS if getattr(cfg, k, None) is not None]
    if not given:
        return None
    if given[0] not in spec.budgets:
        can = ", ".join(flag_of(k) for k in spec.budgets) or "none; use its own options (minreal methods)"
        raise CompressionError(f"`{given[0]}`: method {spec.name!r} does not support {flag_of(given[0])} (its "
                               f"budgets: {can})", fields=(given[0],))
    return given[0], getattr(cfg, given[0])


UNCHANGED_ACTIONS = ("kept", "skipped")

BUDGET_SLACK = 0.01
"""How far above its MAC or parameter budget a result's measured ratio may land before its report says the budget
was missed (``predicted.budget_missed`` and a note): methods budget their per-layer cost rules, and the ops those
rules do not cover (attention's matmuls, a shifted window's rolls) can leave the whole model above the budget."""


OVERSHOOT = 0.05
"""How far below its MAC or parameter budget a result's measured ratio may land before its report says so
(``predicted.budget_overshot`` and a note): a method whose steps are coarse (depth removes whole blocks, width
surgery keeps channel counts at multiples of ``--width-min``) can cut much more than asked."""


def budget_overshoot(report: CompressionReport, kind: str, requested: float, achieved: float) -> str | None:
    """The note saying that ``report``'s measured ``kind`` ratio landed more than :data:`OVERSHOOT` below its
    budget, naming the method; ``None`` otherwise (and for a latency budget, which the method measures itself)."""
    if kind not in ("mac_ratio", "param_ratio") or achieved >= requested - OVERSHOOT:
        return None
    return (f"budget overshot: `{kind}` {requested:g} was asked, {achieved:.3f} was reached: {report.method}'s "
            f"steps are coarser than the budget here (more was cut than asked); check the accuracy, or ask "
            f"for a larger `{kind}`")


def budget_shortfall(report: CompressionReport, kind: str, requested: float, achieved: float) -> str | None:
    """The note saying that ``report``'s measured ``kind`` ratio missed its budget, and why as far as the costs
    tell; ``None`` within :data:`BUDGET_SLACK` (or for a latency budget, which the method measures itself)."""
    if kind not in ("mac_ratio", "param_ratio") or achieved <= requested + BUDGET_SLACK:
        return None
    why = ""
    if kind == "mac_ratio" and report.rule_macs_before:
        rules = report.rule_macs_after / report.rule_macs_before
        outside = ", ".join(report.not_covered_by_rules[:3]) + (", ..." if len(report.not_covered_by_rules) > 3
                                                                 else "")
        why = (f": the method budgets the MACs of its per-layer rules, which reached {rules:.3f}"
               + (f"; MACs no rule covers (e.g. {outside}) stay" if outside else ""))
    return f"budget missed: `{kind}` {requested:g} was asked, {achieved:.3f} was reached{why}"


def state_points(report: CompressionReport) -> list[str]:
    """The layers (state points) the method changed, in report order: what ``--recover-features auto`` matches."""
    return [layer.name for layer in report.layers if layer.action not in UNCHANGED_ACTIONS]


def controls_interrupted(report: CompressionReport) -> bool:
    """Whether a Ctrl-C ended a training the method ran itself (cbalanced's controls: ``measured.variants``)."""
    variants = report.measured.get("variants") or {}
    return any(isinstance(v, dict) and v.get("interrupted") for v in variants.values())


def after_interrupts(recovery: RecoveryConfig | None, report: CompressionReport) -> RecoveryConfig | None:
    """``recovery``, made to let the next Ctrl-C stop the command where one already ended a training of the method's
    own (:func:`controls_interrupted`): that Ctrl-C was the first."""
    if recovery is None or not controls_interrupted(report):
        return recovery
    return dataclasses.replace(recovery, catch_interrupt=False)


def apply_recovery(report: CompressionReport, model: nn.Module, new: nn.Module, data: Dataset,
                   recovery: RecoveryConfig | None, held_out: Dataset | None = None, measure: bool = True
                   ) -> nn.Module:
    """Recover ``new`` from ``model`` on ``data`` when ``recovery`` is enabled: ``report.recovery`` and
    ``report.measured.recovered`` filled (without ``measure``, which a caller that measures on its own data
    turns off, ``measured.recovered`` stays UNSET), the zero-shot measurements kept. With ``held_out`` (data
    neither the method nor the recovery saw), ``measured.held_out_zero_shot`` and
    ``measured.held_out_recovered`` hold :func:`~minreal.compress.core.recover.held_out_metrics` of both models on
    it. Returns the model to use (a copy when the method returned ``model`` itself, which is never trained)."""
    if recovery is None or not recovery.enabled:
        return new
    if new is model:
        new = copy.deepcopy(model)
    if held_out is not None:
        report.measured.held_out_zero_shot = held_out_metrics(model, new, held_out, task=recovery.task)
    result = recover(model, new, data, recovery, state_points(report))
    report.recovery = dataclasses.asdict(result)
    report.timings_s["recover"] = result.wall_s
    if measure:
        report.measured.recovered = compare_outputs(model, new, data)
    if held_out is not None:
        report.measured.held_out_recovered = held_out_metrics(model, new, held_out, task=recovery.task)
    bound = report.predicted.output_deviation_bound  # the one whole-model bound a method predicts
    predicted_bounds = {} if bound is None or bound is UNSET else {"output_deviation_bound": bound}
    if predicted_bounds or any(v is not None for v in report.bounds.values()):
        report.predicted.bounds_zero_shot = {**report.bounds, **predicted_bounds}
        report.bounds = {k: None for k in report.bounds}
        if predicted_bounds:
            report.predicted.output_deviation_bound = None
        report.notes.append("no bound: recovery moves the weights by data-driven steps the error bounds do not cover; "
                            "predicted.bounds_zero_shot holds them for the model before recovery")
    if result.interrupted:
        report.notes.append(f"recovery interrupted after {result.steps} steps; the best weights so far were kept")
    return new


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` computed for one model, data and config, whatever the budget.

    ``state`` is the method's own (``None`` for a method without two phases: :func:`realise` then runs it whole);
    ``key`` is :func:`prepared_key` of the config; ``seconds`` the time ``prepare`` took (hashing the inputs and
    reading the file, when ``cached``: the state was loaded from ``prepare``'s ``cache_dir``).
    """

    method: str
    model: nn.Module
    data: Dataset
    key: tuple[tuple[str, str], ...]
    state: Any
    seconds: float
    cached: bool = False


def _checked_config(spec: MethodSpec, config: Any) -> Any:
    """The method's config (its defaults for ``None``), validated again on a copy."""
    cfg = spec.config_cls() if config is None else config
    if not isinstance(cfg, spec.config_cls):
        raise TypeError(f"method {spec.name!r} expects a {spec.config_cls.__name__}, got {type(cfg).__name__}")
    return dataclasses.replace(cfg) if dataclasses.is_dataclass(cfg) else cfg


def prepared_key(method: str, config: Any) -> tuple[tuple[str, str], ...]:
    """The config's fields that a prepared state depends on: all but the whole-model budgets and the method's
    ``realise_fields`` (each as ``(name, repr(value))``)."""
    spec = get_method(method)
    skip = {*BUDGET_FIELDS, *spec.realise_fields}
    cfg = _checked_config(spec, config)
    if not dataclasses.is_dataclass(cfg):
        return (("config", repr(cfg)),)
    return tuple((f.name, repr(getattr(cfg, f.name))) for f in dataclasses.fields(cfg) if f.name not in skip)


def prepare(model: nn.Module, data: Dataset, method: str, config: Any = None,
            cache_dir: str | Path | None = None) -> Prepared:
    """The budget-free phase of ``method`` (statistics, bases, importances, partitions): compute it once, then
    :func:`realise` it for every budget. For a method without two phases it only records its inputs.

    With ``cache_dir``, the state is read from there when a file of the same method, config minus the budgets,
    model, data and package versions exists (``Prepared.cached``), else computed and written there
    (:mod:`minreal.compress.core.prepared_cache`; collective under a process group, written by the writer rank only).
    """
    from .core.prepared_cache import load_prepared, prepared_cache_key, save_prepared

    spec = get_method(method)
    cfg = _checked_config(spec, config)
    _requested_budget(spec, cfg)  # a budget the method cannot meet is refused before any statistics pass
    key = prepared_key(method, cfg)
    t0 = time.perf_counter()
    require_tensor_outputs(model, data)  # so is a model whose outputs no comparison can read (one sample's forward)
    if spec.prepare is None:
        return Prepared(method, model, data, key, None, time.perf_counter() - t0)
    file_key = prepared_cache_key(method, key, model, data) if cache_dir is not None else None
    if file_key is not None:
        state = load_prepared(cache_dir, file_key, model)
        if state is not None:
            return Prepared(method, model, data, key, state, time.perf_counter() - t0, cached=True)
    state = spec.prepare(model, data, cfg)
    if file_key is not None:
        save_prepared(cache_dir, file_key, state, model)
    return Prepared(method, model, data, key, state, time.perf_counter() - t0)


def realise(prepared: Prepared, config: Any = None, recovery: RecoveryConfig | None = None,
            held_out: Dataset | None = None, measure: bool = True, recover_after: bool = True
            ) -> tuple[nn.Module, CompressionReport]:
    """The per-budget phase: the compressed module for ``config``'s budget from ``prepared``, with the shared cost
    fields, the output comparison on the prepared data and an optional recovery, as :func:`compress` gives.
    ``measure=False`` skips the output comparison on the prepared data (a pass of both models over all of it) for a
    caller that measures the result on its own held-out data (``tune``), and a method's optional measurements on
    that data (:func:`~minreal.compress.core.measuring.measuring`: fde's float64 output deviation on the graph path);
    the measurements a method's result rests on (fde's bound on an MLP) stay.

    Raises
    ------
    ValueError
        ``config`` differs from the prepared one in a field the prepared state depends on.
    """
    budget, new, report = _realised(prepared, config, recovery, measure)
    return _finished(budget, prepared.model, prepared.data, new, report, recovery, held_out, measure, recover_after)


def _realised(prepared: Prepared, config: Any, recovery: RecoveryConfig | None, measure: bool
              ) -> tuple[tuple[str, float] | None, nn.Module, CompressionReport]:
    """The method's own per-budget step of :func:`realise`: the requested budget (:func:`_requested_budget`), the
    new module and the method's report."""
    spec = get_method(prepared.method)
    cfg = _checked_config(spec, config)
    key = prepared_key(prepared.method, cfg)
    if key != prepared.key:
        changed = sorted({n for n, _ in set(prepared.key) ^ set(key)})
        raise ValueError(f"{prepared.method}: the config differs from the prepared one in {', '.join(changed)}; "
                         "prepare again")
    model, data = prepared.model, prepared.data
    budget = _requested_budget(spec, cfg)
    t0 = time.perf_counter()
    with method_measurements(measure):
        if spec.two_phase:
            new, report = spec.realise(prepared.state, cfg)
        elif spec.takes_recovery:
            new, report = spec.run(model, data, cfg, recovery if recovery is not None and recovery.enabled else None)
        else:
            new, report = spec.run(model, data, cfg)
    if spec.two_phase:
        report.timings_s.update(prepare=prepared.seconds, realise=time.perf_counter() - t0)
    return budget, new, report


def _finished(budget: tuple[str, float] | None, model: nn.Module, data: Dataset, new: nn.Module,
              report: CompressionReport, recovery: RecoveryConfig | None, held_out: Dataset | None, measure: bool,
              recover_after: bool) -> tuple[nn.Module, CompressionReport]:
    """What :func:`realise` does after the method: the shared cost fields, the budget check, the output
    comparison and the optional recovery."""
    t0 = time.perf_counter()
    fill_costs(report, model, new, data.x[: min(len(data), 8)])
    report.timings_s["costs"] = time.perf_counter() - t0
    if note := untied_note(model, new):
        log.warning("%s", note)
        report.notes.append(note)
    if budget is not None:
        achieved = {"mac_ratio": report.mac_ratio, "param_ratio": report.param_ratio,
                    "latency_ratio": report.predicted.get("whole_model_latency_ratio")}.get(budget[0])
        report.predicted.budget = {"kind": budget[0], "requested": budget[1], "achieved": achieved}
        if achieved is not None and (note := budget_shortfall(report, budget[0], budget[1], achieved)):
            report.predicted.budget_missed = note
            report.notes.append(note)
        if achieved is not None and (note := budget_overshoot(report, budget[0], budget[1], achieved)):
            report.predicted.budget_overshot = note
            report.notes.append(note)
    if measure and "relative_output_error" not in report.measured:
        t0 = time.perf_counter()
        report.measured = dataclasses.replace(report.measured, **compare_outputs(model, new, data))
        report.timings_s["measure"] = time.perf_counter() - t0
    if not recover_after:
        return new, report
    return apply_recovery(report, model, new, data, after_interrupts(recovery, report), held_out, measure), report


def require_axes_hold(model: nn.Module, data: Dataset, report: CompressionReport,
                      dynamic_axes: Mapping[str, Mapping[int, str]]) -> str:
    """Where ``report`` holds decisions a width or depth trace fixed at the data's shape
    (``predicted.traced_decisions``) and ``dynamic_axes`` names an axis besides the batch, check they hold at half its
    length
    (:func:`~minreal.compress.core.width.tracing.require_decisions_hold`: a one-line CompressionError otherwise); its
    note goes to ``report.notes`` (and is returned; "" when there was nothing to check) and its time to
    ``report.timings_s["axes_check"]``."""
    decisions = report.predicted.get("traced_decisions")
    if not decisions or not dynamic_axes:
        return ""
    from .core.width.tracing import require_decisions_hold

    t0 = time.perf_counter()
    if note := require_decisions_hold(model, data.x[:2], decisions, dynamic_axes):
        report.notes.append(note)
    report.timings_s["axes_check"] = time.perf_counter() - t0
    return note


def compress(model: nn.Module, data: Dataset, method: str, config: Any = None,
             recovery: RecoveryConfig | None = None, held_out: Dataset | None = None, measure: bool = True,
             recover_after: bool = True, dynamic_axes: Mapping[str, Mapping[int, str]] | None = None
             ) -> tuple[nn.Module, CompressionReport]:
    """Run a registered method (:func:`prepare`, then :func:`realise`), then fill the shared cost fields and the
    output comparison on ``data`` (unless ``measure`` is off: a caller that measures on its own held-out data
    saves a pass of both models over ``data``).

    ``config`` defaults to the method's config defaults; a given config is validated again (its
    ``__post_init__``), so fields changed after construction are checked too. A method that measured the
    comparison itself (on a held-out split, or before fine-tuning) keeps its own numbers. An enabled
    ``recovery`` then distils ``model`` into the result on ``data`` (:func:`apply_recovery`, which also measures
    both models on ``held_out`` when given). ``recover_after=False`` only hands ``recovery`` to a method that takes it
    (a chain's last step: the chain recovers once, at its end).

    ``dynamic_axes`` (``{input: {axis: dimension name}}``): the axes besides the batch the compressed model is to
    keep dynamic; where the method's trace fixed decisions on sizes at the data's shape, they are checked at half
    those lengths before any recovery (:func:`require_axes_hold`).
    """
    prepared = prepare(model, data, method, config)
    budget, new, report = _realised(prepared, config, recovery, measure)
    # one budget only: the method's state (statistics, bases) is freed before the measuring passes and whatever the
    # caller does next (an export), instead of living as long as this call
    del prepared
    release_freed_memory()
    require_axes_hold(model, data, report, dynamic_axes or {})
    return _finished(budget, model, data, new, report, recovery, held_out, measure, recover_after)


def chain_label(methods: Sequence[str]) -> str:
    """The default label of a chain: its method names joined by ``+`` (e.g. ``fde+factorize``)."""
    return "+".join(methods)


def compress_chain(model: nn.Module, data: Dataset, steps: Sequence[tuple[str, Any]],
                   recovery: RecoveryConfig | None = None, held_out: Dataset | None = None,
                   dynamic_axes: Mapping[str, Mapping[int, str]] | None = None, recover_after: bool = True
                   ) -> tuple[nn.Module, CompressionReport]:
    """Run registered methods in sequence through :func:`compress`, each on the previous result.

    The report is the last step's layers, with the whole-model costs and the output comparison against the
    original ``model``; ``predicted.steps`` keeps each step's method, config, cost ratios and budget (each
    step's budget is relative to the model it received), and ``predicted.budget`` is the last budgeted step's,
    with that step's method under ``"step"``. An enabled ``recovery`` runs once, after the last step, from the
    original ``model``. ``dynamic_axes``: as :func:`compress`'s, checked at each step. ``recover_after=False``: as
    :func:`compress`'s (the caller recovers with :func:`apply_recovery`).
    """
    current, summaries, reports = model, [], []
    for i, (method, config) in enumerate(steps):
        # the recovery trains the last step's result: a method that takes it (cbalanced) sees it there alone
        last = i == len(steps) - 1 and get_method(method).takes_recovery
        current, rep = compress(current, data, method, config, recovery if last else None, recover_after=False,
                                dynamic_axes=dynamic_axes)
        reports.append(rep)
        summaries.append({"method": method, "config": rep.config, "mac_ratio": rep.mac_ratio,
                          "param_ratio": rep.param_ratio, "budget": rep.predicted.get("budget")})
    last = reports[-1]
    budgets = [{**s["budget"], "step": s["method"]} for s in summaries if s["budget"] is not None]
    decided = [f"{m}: {d}" for (m, _), r in zip(steps, reports) for d in r.predicted.get("traced_decisions") or []]
    predicted = dataclasses.replace(last.predicted, steps=summaries, budget=budgets[-1] if budgets else UNSET,
                                    traced_decisions=decided or UNSET)  # every step's, each checked at its step
    report = dataclasses.replace(last, method=chain_label([m for m, _ in steps]),
                                 config={m: r.config for (m, _), r in zip(steps, reports)},
                                 predicted=predicted,
                                 notes=[f"{m}: {n}" for (m, _), r in zip(steps, reports) for n in r.notes],
                                 spectra={k: v for r in reports for k, v in r.spectra.items()},
                                 bounds={f"{m}:{k}": v for (m, _), r in zip(steps, reports)
                                         for k, v in r.bounds.items()},
                                 measured=Measured())
    fill_costs(report, model, current, data.x[: min(len(data), 8)])
    t0 = time.perf_counter()
    kept = {k: last.measured.get(k) for k in ("variants", "projected") if last.measured.get(k) is not None}
    report.measured = Measured(**compare_outputs(model, current, data), **kept)  # the last step's controls kept
    if kept:
        report.notes.append(f"{steps[-1][0]}: its {' and '.join(kept)} compare with the model that step received "
                            "(the previous step's result), not with the original")
    report.timings_s = {f"{m}:{k}": v for (m, _), r in zip(steps, reports) for k, v in r.timings_s.items()}
    report.timings_s["measure"] = time.perf_counter() - t0
    if not recover_after:
        return current, report
    return apply_recovery(report, model, current, data, after_interrupts(recovery, report), held_out), report
