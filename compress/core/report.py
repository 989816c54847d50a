"""Typed results of a compression run, and their versioned JSON form: the one module that reads and writes a
:class:`CompressionReport` (a ``--report`` file of ``minreal compress``, a run's ``variants[].compression``).

What a method predicts and what was measured are typed records (:class:`Predicted`, :class:`Measured`): one field per
quantity a method or the registry sets, left :data:`UNSET` (and absent from the JSON) when nothing set it. Both are
read-only mappings too (``report.predicted["mac_ratio"]``, ``"recovered" in report.measured``), keyed as the JSON is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["LayerReport", "CompressionReport", "Predicted", "Measured", "UNSET", "REPORT_SCHEMA_VERSION",
           "ReportVersionError"]

REPORT_SCHEMA_VERSION = 2
"""Version of :meth:`CompressionReport.to_json`'s layout. A report written before the ``schema_version`` key existed
has the same layout and loads as version 1; version 2 adds ``macs_at`` (a minreal reading version 1 refuses it in one
line, naming the version, instead of an unknown key)."""


class ReportVersionError(ValueError):
    """A report written by a newer minreal, whose layout this one does not know."""


class _Unset:
    """The value of a field nothing set (absent from the JSON); falsy, one instance, kept by copies and pickles."""

    _instance: ClassVar[_Unset | None] = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False

    def __copy__(self) -> _Unset:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Unset:
        return self

    def __reduce__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""A :class:`Predicted` or :class:`Measured` field nothing set (``None`` is a value: "no bound holds")."""


def _unset() -> Any:
    return field(default=UNSET)


class _Record(Mapping[str, Any]):
    """A typed record that is also a read-only mapping of its set fields (the JSON's keys), plus ``extra``: keys
    no field names (a third-party method's own, a newer minreal's), kept as they are so that a report round-trips.

    ``_per_layer`` maps a field holding ``{layer: value}`` to the JSON suffix of its flat keys (``"fc1.bound"``).
    """

    _per_layer: ClassVar[dict[str, str]] = {}
    extra: dict[str, Any]

    def _set_fields(self) -> Iterator[tuple[str, Any]]:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra" or value is UNSET:
                continue
            if f.name in self._per_layer:
                yield from ((f"{k}{self._per_layer[f.name]}", v) for k, v in value.items())
            else:
                yield f.name, value

    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        for name, suffix in self._per_layer.items():
            values = getattr(self, name)
            if key.endswith(suffix) and values is not UNSET and key[: -len(suffix)] in values:
                return values[key[: -len(suffix)]]
        if key in _field_names(type(self)) and key not in self._per_layer and getattr(self, key) is not UNSET:
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (k for k, _ in self._set_fields())
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _field_names(type(self)):  # a misspelt key would vanish from the JSON
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; a key of your own goes in .extra")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def to_json(self) -> dict[str, Any]:
        """The set fields and ``extra`` as one flat JSON object (per-layer fields as ``"LAYER.suffix"`` keys)."""
        return {**dict(self._set_fields()), **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Any:
        """The record of a JSON object: each key into its field (per-layer keys gathered), any other into ``extra``."""
        names = _field_names(cls) - {"extra"} - set(cls._per_layer)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            suffix_field = next((n for n, s in cls._per_layer.items() if key.endswith(s) and len(key) > len(s)), None)
            if key in names:
                known[key] = value
            elif suffix_field is not None:
                known.setdefault(suffix_field, {})[key[: -len(cls._per_layer[suffix_field])]] = value
            else:
                extra[key] = value
        return cls(**known, extra=extra)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@dataclass(eq=False, repr=False)
class Predicted(_Record):
    """What a method predicts before any data is measured (costs, bounds, widths, budgets); UNSET when not set.

    The first fields are set by :mod:`minreal.compress.registry` for every method (costs, budget, a chain's steps),
    the others by the methods named in the comments above them.
    """

    whole_model_mac_ratio: float = _unset()
    whole_model_param_ratio: float = _unset()
    whole_model_latency_ratio: float = _unset()
    """The latency ratio a method predicts from a latency table (``latency_ratio`` budgets)."""
    budget: dict[str, Any] = _unset()
    """``{"kind", "requested", "achieved"}`` of the whole-model budget (a chain adds ``"step"``)."""
    budget_missed: str = _unset()
    budget_overshot: str = _unset()
    """The note that the measured ratio landed well below the budget (:data:`~minreal.compress.registry.OVERSHOOT`):
    more was cut than asked, which costs accuracy the budget did not ask to spend."""
    bounds_zero_shot: dict[str, float | None] = _unset()
    """The error bounds of the model before recovery (recovery voids them)."""
    steps: list[dict[str, Any]] = _unset()
    """A chain's (or a tune candidate's) steps: method, config, cost ratios, budget."""
    # low-rank (svd, factorize)
    factorizable_mac_ratio: float = _unset()
    factorizable_param_ratio: float = _unset()
    factorizable_table_latency_ratio: float = _unset()
    cache_hits: int = _unset()
    # width pruning (magnitude, wanda, the channel-group surgery)
    importance_weighting: str = _unset()
    allocator_mac_ratio: float = _unset()
    allocator_param_ratio: float = _unset()
    allocator_latency_ratio: float = _unset()
    latency_table_precision: str = _unset()
    group_widths: dict[str, list[int]] = _unset()
    """Per channel group: ``[width before, width after]``."""
    traced_decisions: list[str] = _unset()
    """Width methods and depth: the decisions on sizes the trace took as the calibration data's (``file:line: what =
    value``), where the model's own ``forward`` decides on sizes in Python
    (:mod:`~minreal.compress.core.width.concrete`)."""
    segment_widths: dict[str, list[list[int]]] = _unset()
    hidden_widths: list[int] = _unset()
    hidden_widths_before: list[int] = _unset()
    # depth
    criterion: str = _unset()
    blocks_found: int = _unset()
    blocks_removable: int = _unset()
    blocks_removed: int = _unset()
    removed: list[str] = _unset()
    order: list[str] = _unset()
    block_budget: dict[str, Any] = _unset()
    divergence_on_scoring_samples: float | None = _unset()
    # cbalanced
    realisation: str = _unset()
    ranks_a: list[int] = _unset()
    ranks_b: list[int] = _unset()
    ranks_c: list[int] = _unset()
    widths: list[int] = _unset()
    width_multiple: int = _unset()
    width_min: int = _unset()
    state_order: int = _unset()
    state_order_full: int = _unset()
    state_compression: float = _unset()
    go_method: str = _unset()
    energy_kept_c: dict[str, float] = _unset()
    # fde
    output_deviation_bound: float | None = _unset()
    """None on the graph path (the interval bound is MLP-only) and after recovery."""
    bound_dead_step: float = _unset()
    bound_compensation_step: float = _unset()
    input_box: dict[str, list[float]] = _unset()
    dead_removed: int = _unset()
    merged_channels: int = _unset()
    sweeps: int = _unset()
    block_splits: int = _unset()
    block_merges: int = _unset()
    merge_eps: float = _unset()
    merge_eps_reached: float = _unset()
    merge_eps_per_layer: list[float] = _unset()
    budget_widths: list[int] = _unset()
    budget_cost_ratio: float = _unset()
    groups_left_whole: dict[str, str] = _unset()
    compensation: dict[str, Any] = _unset()
    compensation_tried: bool = _unset()
    representative: str = _unset()
    # ssm
    state_bounds: dict[str, float] = _unset()
    """Per SSM layer, the balanced-truncation bound 2Σσ_tail (JSON keys ``"LAYER.bound"``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    _per_layer: ClassVar[dict[str, str]] = {"state_bounds": ".bound"}


@dataclass(eq=False, repr=False)
class Measured(_Record):
    """What was measured on data; UNSET when not measured. The comparison of the compressed model with the original on
    the method's data (:func:`~minreal.compress.core.evaluate.compare_outputs`) sits at the top level."""

    relative_output_error: float = _unset()
    max_abs_diff: float = _unset()
    top1_agreement: float = _unset()
    accuracy_original: float = _unset()
    accuracy_compressed: float = _unset()
    mse_original: float = _unset()
    mse_compressed: float = _unset()
    recovered: dict[str, float] = _unset()
    """:func:`compare_outputs` of the recovered model on the method's data."""
    held_out_zero_shot: dict[str, float] = _unset()
    held_out_recovered: dict[str, float] = _unset()
    held_out: dict[str, float] | None = _unset()
    """The compressed (or recovered) model against the original on held-out data; None when there was none."""
    data_check: dict[str, Any] = _unset()
    """The original's accuracy on the labelled data against chance (``minreal compress``)."""
    # cbalanced
    variants: dict[str, dict[str, Any]] = _unset()
    projected: dict[str, float] | None = _unset()
    # fde
    max_output_deviation_box_float64: float = _unset()
    max_output_deviation_data_float64: float = _unset()
    max_output_deviation_data: float = _unset()
    # ssm
    gain_errors: dict[str, float] = _unset()
    """Per SSM layer, the measured gain error (JSON keys ``"LAYER.gain_error"``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    _per_layer: ClassVar[dict[str, str]] = {"gain_errors": ".gain_error"}


@dataclass
class LayerReport:
    """What happened to one layer (or state point) of the model."""

    name: str
    kind: str
    action: str  # e.g. "factorized", "kept", "skipped", "merged", "reduced", "resized"
    reason: str = ""
    params_before: int = 0
    params_after: int = 0
    macs_before: int = 0
    macs_after: int = 0
    rank: int | None = None
    full_rank: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _layer_report(layer: Mapping[str, Any], source: str) -> LayerReport:
    """A layer of a compression report's JSON; an unknown key or a missing name is refused (ValueError naming
    ``source``, the layer and the key), as is a layer that is not a JSON object, not left to the constructor's
    TypeError."""
    if not isinstance(layer, Mapping):
        raise ValueError(f"{source}: a layer of the compression report is {type(layer).__name__}, not an object")
    unknown = sorted(set(layer) - _field_names(LayerReport))
    if unknown or "name" not in layer:
        problem = f"unknown layer key(s) {', '.join(map(str, unknown))}" if unknown else "a layer without a name"
        raise ValueError(f"{source}: {problem} (layer {layer.get('name', '?')!r}) in the compression report")
    return LayerReport(**{"kind": "", "action": "", **layer})


@dataclass
class CompressionReport:
    """Result of one method on one model: costs before/after, per-layer actions, predicted vs measured."""

    method: str
    config: dict[str, Any]
    params_before: int = 0
    params_after: int = 0
    macs_before: int = 0
    """Whole-model MACs of one sample as torch's FlopCounterMode counts them, SSM layers by their rule, and the
    innermost ruled layer around an op torch has no formula for (``not_counted_by_torch``) by its rule where that is
    more (:func:`~minreal.compress.core.costs.model_macs`: what MAC budgets count too)."""
    macs_after: int = 0
    macs_at: dict[str, list[int]] = field(default_factory=dict)
    """The per-sample input shapes (batch axis dropped) at which ``macs_*`` were counted: the first sample of the
    data the method was given (with a dynamic length, other lengths run other counts); empty in reports written
    before."""
    rule_macs_before: int = 0
    """Sum of the per-layer MAC rules (:func:`~minreal.compress.core.costs.count_costs`), the cost allocators budget."""
    rule_macs_after: int = 0
    layers: list[LayerReport] = field(default_factory=list)
    predicted: Predicted = field(default_factory=Predicted)
    measured: Measured = field(default_factory=Measured)
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    not_counted: list[str] = field(default_factory=list)
    """Modules with parameters but no per-layer MAC rule (BatchNorm, ...), in the compressed model."""
    not_covered_by_rules: list[str] = field(default_factory=list)
    """Modules (before or after) whose own torch-counted MACs no per-layer rule covers (attention, matmuls)."""
    not_counted_by_torch: list[str] = field(default_factory=list)
    """Heavy ops torch ran without a MAC formula (FFTs): missing from ``macs_*`` except inside a layer a rule counts."""
    spectra: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per layer (or state point): named spectra, descending (e.g. cbalanced's Gramian tests A, B, C)."""
    bounds: dict[str, float | None] = field(default_factory=dict)
    """Predicted error bounds by name: a layer name, or ``"output"`` for a whole-model bound."""
    recovery: dict[str, Any] | None = None
    """``asdict`` of the :class:`~minreal.compress.core.recover.RecoveryResult` when recovery ran after the method, else
    None; ``measured.recovered`` then compares the recovered model, the other measurements the zero-shot one."""
    schema_version: int = REPORT_SCHEMA_VERSION

    @property
    def param_ratio(self) -> float:
        return self.params_after / max(self.params_before, 1)

    @property
    def mac_ratio(self) -> float:
        return self.macs_after / max(self.macs_before, 1)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object (:data:`REPORT_SCHEMA_VERSION`; UNSET predictions and measurements absent)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["layers"] = [dataclasses.asdict(layer) for layer in self.layers]
        data["predicted"], data["measured"] = self.predicted.to_json(), self.measured.to_json()
        data["schema_version"] = REPORT_SCHEMA_VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "compression report") -> CompressionReport:
        """The report of :meth:`to_json`'s object. A report without ``schema_version`` is version 1 (it loads); a
        newer version is refused (:class:`ReportVersionError`, one line naming ``source`` and the version). Keys a
        report predates take their defaults; unknown keys of ``predicted``/``measured`` are kept in their ``extra``
        (they are open: a third-party method adds its own), an unknown top-level key is refused (ValueError naming
        ``source`` and the key), as is a layer with an unknown key or no name."""
        version = data.get("schema_version", 1)
        if not isinstance(version, int) or version > REPORT_SCHEMA_VERSION:
            raise ReportVersionError(f"{source}: compression report schema_version {version!r} is newer than this "
                                     f"minreal reads ({REPORT_SCHEMA_VERSION}); upgrade minreal to read it")
        names = _field_names(cls) - {"layers", "predicted", "measured", "schema_version"}
        unknown = sorted(set(data) - names - {"layers", "predicted", "measured", "schema_version"})
        if unknown:
            raise ValueError(f"{source}: unknown compression report key(s) {', '.join(unknown)} in schema_version "
                             f"{version}")
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("method", "")
        known.setdefault("config", {})
        layers = [_layer_report(layer, source) for layer in data.get("layers") or ()]
        return cls(**known, layers=layers,
                   predicted=Predicted.from_json(data.get("predicted") or {}),
                   measured=Measured.from_json(data.get("measured") or {}))

    @classmethod
    def load(cls, path: str | Path) -> CompressionReport:
        """The report in a JSON file (:meth:`from_json`; errors name the file)."""
        return cls.from_json(json.loads(Path(path).read_text()), str(path))
