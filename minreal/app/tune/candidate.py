"""One tune candidate: a method at a MAC budget with a recovery budget, evaluated and cached.

:func:`evaluate_candidate` is what an executor runs (a plain function of a picklable :class:`Job`): it compresses,
recovers, measures on the held-out data in torch and, when the constraint holds there, exports the fp32 ONNX, its
INT8 copy (with the trained ranges for a quantisation-aware candidate) and a ``.pt2`` program into the cache.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from minreal.compress.core.cache import model_key
from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import NamedInputs
from minreal.export.json_safe import to_jsonable
from minreal.export.settings import Int8Policy, VariantConfig

from .config import Constraint, Quality, TuneError

__all__ = ["CandidateSpec", "CandidateResult", "Job", "Source", "SpecSource", "LoadedSource", "evaluate_candidate",
           "fingerprint", "cache_key", "cached_file", "export_settings"]

RESULT_FILE = "result.json"
FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "pt2": "model.pt2"}


@dataclass(frozen=True)
class CandidateSpec:
    """A method at a whole-model MAC ratio, with ``recover_epochs`` of recovery (quantisation-aware when ``qat``)."""

    method: str
    mac_ratio: float
    recover_epochs: int = 0
    qat: bool = False
    variant: Any = None
    """A plan file's variant (:class:`minreal.compress.core.run_case.VariantSpec`, e.g. a chain of methods)
    evaluated as it is: then ``method`` is its label and ``mac_ratio`` is not a search budget."""
    fraction: float = 1.0
    """Share of the recovery cap (successive halving's short rungs): the same epochs on a seeded subsample of this
    fraction of the calibration data. One that meets the constraint is a candidate like any other (exported)."""
    files_only: bool = False
    """Not a candidate: the zero-shot model's deployable files (fp32, and INT8 when the tune makes INT8 files),
    exported whatever its quality and with no quality measured, so that the race can time its structure before
    recovering it (recovery changes the weights, not the structure, so it does not change what the file costs)."""

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"a candidate's recovery fraction is in (0, 1], got {self.fraction}")
        if self.files_only and (self.recover_epochs or self.qat or self.variant is not None or self.fraction < 1):
            raise ValueError("files_only is for a searched method's zero-shot model (no recovery, no plan variant)")

    @property
    def short(self) -> bool:
        """A successive-halving rung below the full recovery budget (ranking only)."""
        return self.fraction < 1 and self.recover_epochs > 0

    @property
    def label(self) -> str:
        rec = f"+r{self.recover_epochs}" if self.recover_epochs else ""
        part = f"~{self.fraction:.2g}" if self.short else ""
        budget = "" if self.variant is not None else f"@{self.mac_ratio:g}"
        return f"{self.method}{budget}{rec}{part}{'+qat' if self.qat else ''}{'~structure' if self.files_only else ''}"


@dataclass
class CandidateResult:
    """What evaluating a :class:`CandidateSpec` gave (``error``: the method's one-line refusal)."""

    spec: CandidateSpec
    key: str
    quality: dict[str, float] = field(default_factory=dict)
    """Torch metrics on the held-out data (:func:`minreal.compress.core.recover.held_out_metrics`)."""
    feasible: bool = False
    error: str | None = None
    mac_ratio: float | None = None
    param_ratio: float | None = None
    params: int = 0
    macs: int = 0
    files: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time by phase: ``prepare`` and ``realise`` (0 when the worker had them already), ``recover``,
    ``measure`` (held-out quality in torch), ``export`` (fp32, INT8, .pt2); ``compress`` for a plan variant."""
    recovery: dict[str, Any] | None = None
    cached: bool = False
    skipped: bool = False
    """Not evaluated: the tune's time budget had run out when the job came up (never cached)."""
    weights_digest: str | None = None
    """A zero-shot model's :func:`minreal.compress.core.cache.model_key` (architecture and every parameter and buffer;
    None for a recovered candidate or a plan variant): two budgets of a method with the same digest realised one
    model."""
    warnings: list[str] = field(default_factory=list)
    """The compression's warnings the tune states: decisions of a width trace that rest on a dynamic axis's length
    (:data:`~minreal.compress.core.width.tracing.AXES_WARNING`: the graph holds only where they keep their outcome)."""


class Source(Protocol):
    """Where a worker gets the original model and the data: ``load() -> (model, calibration, held-out)``."""

    def load(self) -> tuple[nn.Module, Dataset, Dataset]: ...


@dataclass(frozen=True)
class SpecSource:
    """The CLI's inputs as specs, loaded again in each worker process (so nothing needs pickling)."""

    model: str
    data: str
    eval_data: str | None = None
    weights: str | None = None
    trust_pickle: bool = False
    preprocess: Any = None
    """How an image folder becomes inputs (:class:`minreal.app.preprocess.ImagePreprocess`; None: the defaults)."""
    allow_mismatch: bool = False
    """``--allow-data-mismatch``: labels outside the model's outputs pass with a warning, as in the parent."""

    def load(self) -> tuple[nn.Module, Dataset, Dataset]:
        return _load_specs(self)


_LOADED: dict[SpecSource, tuple[nn.Module, Dataset, Dataset]] = {}


def _load_specs(src: SpecSource) -> tuple[nn.Module, Dataset, Dataset]:
    """Load once per process (a worker serves many jobs of one tune)."""
    if src not in _LOADED:
        from minreal.app.data import load_data
        from minreal.app.models import checked_dataset, load_model, packed_model

        net = load_model(src.model, weights=src.weights, trust_pickle=src.trust_pickle).eval()
        loaded = load_data(src.data, eval_spec=src.eval_data, preprocess=src.preprocess)
        _LOADED.clear()
        net = packed_model(net, loaded.calib.x, src.model)
        held = None if loaded.evaluation is None else checked_dataset(net, loaded.evaluation, src.model, src.data,
                                                                      src.allow_mismatch)
        _LOADED[src] = (net, checked_dataset(net, loaded.calib, src.model, src.data, src.allow_mismatch), held)
    return _LOADED[src]


@dataclass(frozen=True)
class LoadedSource:
    """Objects already in memory (the Python API; in-process executors)."""

    model: nn.Module
    calib: Dataset
    held_out: Dataset

    def load(self) -> tuple[nn.Module, Dataset, Dataset]:
        return self.model, self.calib, self.held_out


@dataclass(frozen=True)
class Job:
    """Everything :func:`evaluate_candidate` needs (picklable when ``source`` is a :class:`SpecSource`)."""

    spec: CandidateSpec
    source: Any
    fingerprint: str
    cache_dir: Path
    constraint: Constraint
    reference: Quality
    providers: tuple[str, ...]
    quant_target: str
    int8: bool
    extra: tuple[tuple[str, Any], ...] = ()
    graph: str = ""
    """sha256 of the original's exported ONNX file: the forward computation, not only the weights."""
    dynamic_axes: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()
    """Dynamic axes besides the batch by input name (hashable form of ``{name: {axis: dim}}``)."""
    stats_samples: int = 0
    """At most this many calibration samples (a seeded subsample) for the methods' statistics; 0: all."""
    deadline: float | None = None
    """Wall-clock time (``time.time()``) after which the job is skipped instead of started (``--time-budget``:
    checked before every job, in whichever process runs it); not part of the cache key."""
    export: tuple[tuple[str, Any], ...] = ()
    """The tune's export settings besides the target, where they differ from
    :class:`~minreal.export.settings.VariantConfig`'s defaults (``(field, value)`` pairs, :func:`export_settings`);
    part of the cache key only when there is one, so the keys of the defaults stay what they were."""

    def axes(self) -> dict[str, dict[int, str]]:
        """:attr:`dynamic_axes` as ``{name: {axis: dim}}``."""
        return {name: dict(per) for name, per in self.dynamic_axes}

    def variant(self) -> VariantConfig:
        """The export, parity and INT8 settings of the candidate's files: :attr:`quant_target` and :attr:`export`."""
        return VariantConfig(quant_target=self.quant_target, **dict(self.export))


_INT8_ONLY = frozenset({"quant_mode", "calib_samples", *(f.name for f in dataclasses.fields(Int8Policy))})
"""The :class:`~minreal.export.settings.VariantConfig` fields that only an INT8 file depends on."""


def export_settings(variant: VariantConfig, int8: bool = True) -> tuple[tuple[str, Any], ...]:
    """``variant``'s fields that differ from :class:`~minreal.export.settings.VariantConfig`'s defaults, but its
    ``quant_target`` (a :class:`Job` holds the resolved target apart) and, without ``int8``, those only INT8 files
    depend on (they change no file then, so no cache key either), as :attr:`Job.export` holds them."""
    default = VariantConfig()
    return tuple((f.name, getattr(variant, f.name)) for f in dataclasses.fields(variant)
                 if f.name != "quant_target" and (int8 or f.name not in _INT8_ONLY)
                 and getattr(variant, f.name) != getattr(default, f.name))


def fingerprint(model: nn.Module, calib: Dataset, held_out: Dataset) -> str:
    """sha256 over the model's class, architecture and weights and the bytes of both datasets."""
    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}\n{model}".encode())
    for name, t in model.state_dict().items():
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    for data in (calib, held_out):
        named = data.x.tensors if isinstance(data.x, NamedInputs) else {"x": data.x}
        for key, t in (*named.items(), ("y", data.y)):
            if t is not None:
                h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def cache_key(job: Job) -> str:
    """Key of a candidate's cache entry: the inputs, the candidate and what shapes its files (not the constraint).

    Bump ``v`` when a default that shapes the files changes, a
    :class:`~minreal.export.settings.VariantConfig` default above all: :attr:`Job.export` holds only the settings
    that differ from the defaults of the day, so an entry written under an old default would be found again."""
    blob = json.dumps({"v": 2, "versions": _versions(), "inputs": job.fingerprint, "graph": job.graph,
                       "spec": _spec_key(job.spec), "stats_samples": job.stats_samples,
                       "providers": list(job.providers), "quant_target": job.quant_target, "int8": job.int8,
                       "axes": [[n, [list(a) for a in per]] for n, per in job.dynamic_axes],
                       "extra": [list(kv) for kv in job.extra],
                       **({"export": [list(kv) for kv in job.export]} if job.export else {})},
                      sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _spec_key(spec: CandidateSpec) -> dict[str, Any]:
    """The spec's fields in the cache key; ``files_only`` only when set, so the keys of candidates cached before
    the field existed stay what they were."""
    out = dataclasses.asdict(spec)
    if not out["files_only"]:
        del out["files_only"]
    return out


def _versions() -> dict[str, str]:
    """minreal, torch and onnxruntime versions and a digest of minreal's own sources (its version number stays put
    while the code changes): a fix in any of them must not be hidden by old entries."""
    from importlib.metadata import PackageNotFoundError, version

    from minreal.compress.core.prepared_cache import source_digest

    out = {}
    for name in ("minreal", "torch", "onnxruntime", "onnx"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    out["code"] = source_digest("minreal.compress", "minreal.export", "minreal.runtime_bench", "minreal.facts")
    return out


def _from_cache(entry: Path, job: Job) -> CandidateResult | None:
    """The cached result, re-judged against this job's constraint; None when absent, or when it now needs files
    the entry lacks."""
    try:
        data = json.loads((entry / RESULT_FILE).read_text())
        data["spec"] = job.spec  # the key is derived from it
        result = CandidateResult(**data)
    except (OSError, ValueError, TypeError):  # absent, torn or from another schema: computed again
        return None
    if not _well_typed(result):  # damaged or edited by hand: computed again
        return None
    result.feasible = (result.error is None and not job.spec.files_only
                       and job.constraint.holds(Quality.from_metrics(result.quality), job.reference))
    if job.spec.files_only and result.error is None and not all((entry / FILES[k]).is_file() for k in _needed(job)):
        return None
    if result.feasible and not all((entry / FILES[k]).is_file() for k in _needed(job)):
        return None
    result.files = {k: str(entry / f) for k, f in FILES.items() if (entry / f).is_file()}
    result.cached = True
    return result


def _well_typed(result: CandidateResult) -> bool:
    """Whether a cached result's fields hold what a fresh one would (numbers where numbers go, and so on)."""
    def numbers(d: Any) -> bool:
        return isinstance(d, dict) and all(isinstance(v, (int, float)) or v is None for v in d.values())

    return (numbers(result.quality) and numbers(result.seconds) and isinstance(result.files, dict)
            and isinstance(result.error, (str, type(None))) and isinstance(result.recovery, (dict, type(None)))
            and isinstance(result.weights_digest, (str, type(None)))
            and isinstance(result.warnings, list) and all(isinstance(w, str) for w in result.warnings)
            and all(isinstance(getattr(result, f), (int, float, type(None))) for f in ("mac_ratio", "param_ratio"))
            and all(isinstance(getattr(result, f), int) for f in ("params", "macs")))


def _needed(job: Job) -> list[str]:
    return ["fp32", *([] if job.spec.files_only else ["pt2"]), *(["int8"] if job.int8 else [])]


SUBSAMPLE_SEED = 0
MIN_SUBSAMPLE = 64
"""Fewest calibration samples a short rung recovers on (one default batch)."""


def subsample(data: Dataset, fraction: float) -> Dataset:
    """A seeded subsample of ``fraction`` of ``data`` (at least :data:`MIN_SUBSAMPLE` samples, in the original
    order), the same for every candidate of a tune; ``data`` itself at fraction 1."""
    return first_of_shuffle(data, subsample_size(len(data), fraction))


def subsample_size(n: int, fraction: float) -> int:
    """Samples :func:`subsample` draws from ``n`` (all of them when that is no fewer)."""
    import math

    return min(n, max(MIN_SUBSAMPLE, math.ceil(fraction * n)))


def first_of_shuffle(data: Dataset, count: int) -> Dataset:
    """``count`` samples of ``data`` drawn without replacement (seed :data:`SUBSAMPLE_SEED`, so a smaller draw is
    part of a larger one), in their original order; ``data`` itself when it has no more."""
    return data.sample(count, SUBSAMPLE_SEED)


def evaluate_candidate(job: Job) -> CandidateResult:
    """Compress, recover, measure; export when feasible; cache. Never raises for a method's refusal."""
    key = cache_key(job)
    entry = Path(job.cache_dir) / key
    cached = _from_cache(entry, job)
    if cached is not None:
        return cached
    if job.deadline is not None and time.time() > job.deadline:
        return CandidateResult(job.spec, key, error="skipped: the time budget ran out before it started",
                               skipped=True)
    result = _evaluate(job, key)
    _store(entry, result)
    result.files = {k: str(entry / f) for k, f in FILES.items() if (entry / f).is_file()}
    return result


def _compress_candidate(job: Job, model: nn.Module, calib: Dataset) -> tuple[nn.Module, Any, dict[str, float]]:
    """The candidate's module, its report and the seconds of its phases (none for a plan variant): compressed,
    then recovered where the spec says."""
    from minreal.app.method_options import build_config, provider_defaults
    from minreal.compress.core.recover_options import RecoveryConfig

    spec = job.spec
    recovery = (RecoveryConfig(epochs=spec.recover_epochs, int8=job.quant_target if spec.qat else None,
                               catch_interrupt=False)  # a tune's Ctrl-C aborts; never cache a cut-short run
                if spec.recover_epochs else None)
    if spec.variant is not None:
        from minreal.app.plan import run_variant

        small, report = run_variant(model, calib, spec.variant, recovery, dynamic_axes=job.axes())
        return small, report, {}
    train = subsample(calib, spec.fraction) if spec.short else calib
    if "+" in spec.method:
        return _chained(job, model, calib, recovery, train)
    config = build_config(spec.method, {"mac_ratio": spec.mac_ratio, **dict(job.extra)},
                          provider_defaults(job.providers))
    return _compressed(job, model, calib, config, recovery, train)


_KEPT_PREDICTIONS: dict[str, Any] = {}


def release_outputs() -> None:
    """Drop the original's outputs this process keeps for a tune's candidates (the kept predictions and the held-out
    teacher outputs), at the end of a tune run in this process (``--workers 0``, the Python API). The prepared states
    and zero-shot models stay, on purpose: a later tune of the same inputs starts from them."""
    _KEPT_PREDICTIONS.clear()
    _TEACHER.clear()


def _kept_predictions(job: Job) -> Any:
    """The store of the original's :func:`~minreal.compress.core.evaluate.predict` outputs in this worker for these
    tune inputs (every recovered candidate distils from the same teacher outputs on the same splits)."""
    from minreal.compress.core.evaluate import KeptPredictions

    store = _KEPT_PREDICTIONS.get(job.fingerprint)
    if store is None:
        _KEPT_PREDICTIONS.clear()
        store = _KEPT_PREDICTIONS[job.fingerprint] = KeptPredictions()
    return store


class InputsChangedError(RuntimeError):
    """A worker loaded a model or data that differ from what the tune measured its baselines on."""


def _evaluate(job: Job, key: str) -> CandidateResult:
    from minreal.app.field_flags import flag_spelled
    from minreal.app.method_options import MethodOptionError
    from minreal.compress import CompressionError
    from minreal.compress.core.evaluate import predictions_kept
    from minreal.compress.core.recover import held_out_metrics

    model, calib, held_out = job.source.load()
    if not isinstance(job.source, LoadedSource) and fingerprint(model, calib, held_out) != job.fingerprint:
        raise InputsChangedError("a worker process loaded a different model or data than the tune started with (an "
                                 "unseeded factory without --weights, random data, or a file changed meanwhile); "
                                 "seed them, or run the candidates in this process with --workers 0")
    spec, result = job.spec, CandidateResult(job.spec, key)
    t0 = time.perf_counter()
    try:
        with predictions_kept(model, store=_kept_predictions(job)):  # the teacher's passes, once per worker
            small, report, phases = _compress_candidate(job, model, calib)
        result.seconds.update(phases)
    except (CompressionError, MethodOptionError) as exc:  # a refusal, in the command line's words (its flags)
        result.error = flag_spelled(exc).splitlines()[0]
        return result
    from minreal.compress.core.width.tracing import AXES_WARNING

    result.warnings = [note for note in report.notes if AXES_WARNING in note]  # a chain's name their step first
    recovered = report.timings_s.get("recover", 0.0)
    if spec.variant is not None:
        result.seconds["compress"] = time.perf_counter() - t0 - recovered
    result.seconds["recover"] = recovered
    result.mac_ratio, result.param_ratio = report.mac_ratio, report.param_ratio
    result.params, result.macs, result.recovery = report.params_after, report.macs_after, report.recovery
    if spec.variant is None and not spec.recover_epochs:
        result.weights_digest = model_key(small)
    if spec.files_only:  # the structure's files, to time: no quality, no .pt2 program, never a candidate
        _export_files(result, small, report, calib, held_out, job, program=False)
        return result
    t0 = time.perf_counter()
    result.quality = held_out_metrics(model, small, held_out, teacher_outputs=_teacher_outputs(job, model, held_out))
    result.seconds["measure"] = time.perf_counter() - t0
    result.feasible = job.constraint.holds(Quality.from_metrics(result.quality), job.reference)
    if result.feasible:
        _export_files(result, small, report, calib, held_out, job)
    return result


def _require_axes_hold(job: Job, model: nn.Module, calib: Dataset, report: Any, model_id: str = "") -> float:
    """Where the width trace decided on sizes at the data's shape and the tune keeps dynamic axes besides the batch,
    the decisions must hold at half their length (:func:`minreal.compress.registry.require_axes_hold`: a refusal
    otherwise); checked once per worker for these inputs (``model_id``: the model's fingerprint, the tune's by
    default) and decisions (every budget of a method shares them: a refusal is remembered as its line, no traceback,
    no model copy). Returns the seconds spent."""
    from minreal.compress import CompressionError
    from minreal.compress.registry import require_axes_hold

    decisions = report.predicted.get("traced_decisions")
    if not decisions or not job.axes():
        return 0.0
    t0 = time.perf_counter()
    key = (model_id or job.fingerprint, tuple(decisions), json.dumps(job.axes(), sort_keys=True))

    def check() -> tuple[str, str]:  # (the note, "") or ("", the refusal's line)
        try:
            return require_axes_hold(model, calib, report, job.axes()), ""
        except CompressionError as exc:
            return "", str(exc)

    (note, refused), made = _remember(_AXES_CHECKED, key, check, _ZERO_SHOT_SIZE)
    if refused:
        raise CompressionError(refused)
    if note and not made:  # every candidate's report says it, not only the first one's
        report.notes.append(note)
    return time.perf_counter() - t0


def _export_files(result: CandidateResult, small: nn.Module, report: Any, calib: Dataset, held_out: Dataset,
                  job: Job, program: bool = True) -> None:
    """``result``'s files (:func:`_export`) and their seconds; an export the exporter refuses makes ``result`` a
    refusal (not feasible) in one line."""
    from minreal.export.errors import CalibrationError, ExportError, ParityError, QuantizationError

    t0 = time.perf_counter()
    try:
        result.files = _export(small, report, calib, held_out, job, program)
    except (ExportError, ParityError, QuantizationError, CalibrationError) as exc:
        result.error, result.feasible = f"export failed: {str(exc).splitlines()[0]}", False
    result.seconds["export"] = time.perf_counter() - t0


_MEMO_SIZE = 8
"""Prepared states a worker keeps (the oldest goes first): one per method searched."""
_ZERO_SHOT_SIZE = 64
"""Zero-shot models a worker keeps: every budget of every method's search and race (a default tune realises
about 30)."""
_PREPARED: dict[tuple[Any, ...], Any] = {}
_ZERO_SHOT: dict[tuple[Any, ...], tuple[nn.Module, Any]] = {}
_AXES_CHECKED: dict[tuple[Any, ...], tuple[str, str]] = {}
"""Per tune inputs, decisions and axes: the note and the refusal of :func:`_require_axes_hold` (one is "")."""


def _remember(store: dict[tuple[Any, ...], Any], key: tuple[Any, ...], make: Any, size: int = _MEMO_SIZE
              ) -> tuple[Any, bool]:
    """``store[key]``, made by ``make()`` when absent (evicting the oldest entry beyond ``size``), and whether it
    was made now."""
    if key in store:
        return store[key], False
    while len(store) >= size:
        store.pop(next(iter(store)))
    store[key] = make()
    return store[key], True


def _compressed(job: Job, model: nn.Module, calib: Dataset, config: Any, recovery: Any, train: Dataset
                ) -> tuple[nn.Module, Any, dict[str, float]]:
    """The candidate's module and report: the method prepared once per worker for these inputs and options (every
    budget realises from it; the state is also kept in the tune's cache folder, so another worker, a later tune or
    a resumed one loads it instead of computing it), its zero-shot model realised once per budget (the recovered
    and quantisation-aware candidates of that budget start from a copy), then the recovery on ``train`` (the
    calibration data, or a short rung's subsample of it). Also the seconds this job spent preparing and realising
    (0 when it found them done)."""
    from minreal.compress.registry import apply_recovery

    small, report, phases = _zero_shot(job, model, job.fingerprint, calib, job.spec.method, config)
    phases["axes_check"] = _require_axes_hold(job, model, calib, report)  # before the recovery: never train in vain
    return apply_recovery(report, model, small, train, recovery, measure=False), report, phases


def _zero_shot(job: Job, model: nn.Module, model_id: str, calib: Dataset, method: str, config: Any
               ) -> tuple[nn.Module, Any, dict[str, float]]:
    """A copy of ``method``'s zero-shot model of ``model`` (``model_id``: its fingerprint) at ``config``, prepared
    and realised once per worker (:func:`_compressed`), and the seconds spent preparing and realising now."""
    from minreal.compress.registry import realise

    t0 = time.perf_counter()
    key, prepared, made = _prepared(job, model, model_id, calib, method, config)
    t1 = time.perf_counter()
    zero_shot, realised = _remember(_ZERO_SHOT, (*key, repr(config)),
                                    lambda: _outcome(lambda: realise(_value(prepared), config, measure=False)),
                                    _ZERO_SHOT_SIZE)
    phases = {"prepare": t1 - t0 if made else 0.0, "realise": time.perf_counter() - t1 if realised else 0.0}
    small, report = copy.deepcopy(_value(zero_shot))
    return small, report, phases


def _prepared(job: Job, model: nn.Module, model_id: str, calib: Dataset, method: str, config: Any
              ) -> tuple[tuple[Any, ...], tuple[Any, Exception | None], bool]:
    """The memo key, the :func:`_outcome` of ``method``'s ``prepare`` (once per worker), and whether it ran now."""
    from minreal.compress.registry import prepare, prepared_key

    key = (model_id, job.stats_samples, method, prepared_key(method, config))
    stats = first_of_shuffle(calib, job.stats_samples) if job.stats_samples else calib
    prepared, made = _remember(_PREPARED, key, lambda: _outcome(
        lambda: prepare(model, stats, method, config, cache_dir=job.cache_dir)))
    return key, prepared, made


def _least_mac_ratio(state: Any) -> float | None:
    """The smallest MAC ratio a prepared depth state reaches (every removable block gone); None for other states."""
    if not all(hasattr(state, k) for k in ("macs", "total_macs", "removable")):
        return None
    return (state.total_macs - sum(state.macs[n] for n in state.removable)) / max(state.total_macs, 1)


CHAIN_FIRST_SHARE = 0.5
"""Share of a chain candidate's MAC cut its first method (depth) takes; the second method takes the rest of it, on
the model the first one left (:func:`_chained`)."""


def _chained(job: Job, model: nn.Module, calib: Dataset, recovery: Any, train: Dataset
             ) -> tuple[nn.Module, Any, dict[str, float]]:
    """A chain candidate (``depth+magnitude`` at MAC ratio ``r``): the first method cuts the MACs to
    ``1 - CHAIN_FIRST_SHARE * (1 - r)`` (or as far as it can, when less) from its one preparation (shared with its
    own search), the second cuts what that left to ``r`` of the original (prepared once per first model), then one
    recovery from the original."""
    import dataclasses as dc

    from minreal.app.method_options import build_config, provider_defaults
    from minreal.compress.registry import apply_recovery, fill_costs

    first, second = job.spec.method.split("+")
    r, defaults, extra = job.spec.mac_ratio, provider_defaults(job.providers), dict(job.extra)
    own = {m: {k: v for k, v in extra.items() if k in _fields(m)} for m in (first, second)}
    config = build_config(first, {"mac_ratio": 1 - CHAIN_FIRST_SHARE * (1 - r), **own[first]}, defaults)
    _, prepared, _ = _prepared(job, model, job.fingerprint, calib, first, config)
    least = _least_mac_ratio(_value(prepared).state)
    if least is not None and least > config.mac_ratio:  # the first method cannot take its share: all it can
        config = build_config(first, {"mac_ratio": min(1.0, least * (1 + 1e-9)), **own[first]}, defaults)
    mid, head, phases = _zero_shot(job, model, job.fingerprint, calib, first, config)
    phases["axes_check"] = _require_axes_hold(job, model, calib, head)  # each step's trace, before the recovery
    steps = [{"method": first, "mac_ratio": head.mac_ratio}]
    small, report = mid, head
    if head.mac_ratio > r:
        config = build_config(second, {"mac_ratio": min(1.0, r / head.mac_ratio), **own[second]}, defaults)
        small, report, more = _zero_shot(job, mid, model_key(mid), calib, second, config)
        more["axes_check"] = _require_axes_hold(job, mid, calib, report, model_key(mid))
        phases = {k: phases[k] + more[k] for k in phases}
        steps.append({"method": second, "mac_ratio": report.mac_ratio})
    report = dc.replace(report, method=job.spec.method, predicted=dc.replace(report.predicted, steps=steps),
                        notes=[*head.notes, *report.notes] if report is not head else list(head.notes))
    fill_costs(report, model, small, calib.x[: min(len(calib), 8)])
    return apply_recovery(report, model, small, train, recovery, measure=False), report, phases


def _fields(method: str) -> set[str]:
    import dataclasses as dc

    from minreal.compress import get_method

    return {f.name for f in dc.fields(get_method(method).config_cls)}


_TEACHER: dict[str, Any] = {}


def _teacher_outputs(job: Job, model: nn.Module, held_out: Dataset) -> Any:
    """The original's outputs on the held-out data, predicted once per worker and tune inputs (every candidate is
    judged against them)."""
    from minreal.compress.core.evaluate import predict

    outputs = _TEACHER.get(job.fingerprint)
    if outputs is None:
        _TEACHER.clear()
        outputs = _TEACHER[job.fingerprint] = predict(model, held_out, 256)
    return outputs


def _outcome(make: Any) -> tuple[Any, Exception | None]:
    """``(make(), None)``, or ``(None, error)`` for a method's refusal (a budget it cannot reach), which is as
    much a result to remember as a model."""
    from minreal.compress import CompressionError

    try:
        return make(), None
    except CompressionError as exc:
        return None, exc


def _value(outcome: tuple[Any, Exception | None]) -> Any:
    """The value of an :func:`_outcome`, or its refusal raised again."""
    value, error = outcome
    if error is not None:
        raise error
    return value


def _export(small: nn.Module, report: Any, calib: Dataset, held_out: Dataset, job: Job, program: bool = True
            ) -> dict[str, str]:
    """fp32 ONNX (parity verified), INT8 copy, .pt2 program (``program``) into a temporary folder; ``{kind:
    path}``."""
    Path(job.cache_dir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".export-", dir=job.cache_dir))  # in the cache: never litters /tmp
    try:
        return _export_into(folder, small, report, calib, held_out, job, program)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _export_into(folder: Path, small: nn.Module, report: Any, calib: Dataset, held_out: Dataset, job: Job,
                 program: bool = True) -> dict[str, str]:
    from minreal.export.serialize import save_program
    from minreal.export.variant import export_variant, layer_weights, quantize_variant

    cfg = job.variant()
    record = export_variant(small, held_out.x, folder / FILES["fp32"], cfg, job.spec.label, job.spec.method,
                            dynamic_axes=job.axes() or None)
    files = {"fp32": str(folder / FILES["fp32"])}
    if job.int8:
        record.compression = report
        ranges = (report.recovery or {}).get("activation_ranges") or {}
        q = quantize_variant(record, folder, calib.x, cfg, layer_weights(small, ranges) if ranges else None)
        os.replace(folder / q.onnx, folder / FILES["int8"])
        files["int8"] = str(folder / FILES["int8"])
    if program:
        save_program(small, held_out.x[:2], folder / FILES["pt2"], dynamic_axes=job.axes())
        files["pt2"] = str(folder / FILES["pt2"])
    return files


def _store(entry: Path, result: CandidateResult) -> None:
    """Write the entry atomically: files and result.json into a sibling temporary folder, then rename it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for kind, path in result.files.items():
            shutil.move(path, tmp / FILES[kind])
        for folder in {Path(p).parent for p in result.files.values()}:  # the export's temporary folder
            shutil.rmtree(folder, ignore_errors=True)
        data = dataclasses.asdict(result)
        data["files"], data["cached"] = {}, False
        (tmp / RESULT_FILE).write_text(json.dumps(to_jsonable(data), indent=1, default=repr))
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_file(res: CandidateResult, kind: str) -> str:
    """A result's file in the candidate cache, which a worker on another machine may have written."""
    path = res.files[kind]
    if not Path(path).is_file():
        raise TuneError(f"{res.spec.label}'s {kind} file {path} is not visible on this machine: a worker elsewhere "
                        "wrote it, so --cache-dir must be on storage that every node mounts at the same path")
    return path
