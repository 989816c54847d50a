"""Config fields that several methods share, each declared once (one name, one type, one meaning).

A method config inherits the bases whose fields it has; the CLI (``minreal.app.method_options``) refuses two
methods declaring the same field name apart. Every config inherits :class:`CostBudget`: budgets are always a
ratio of the **whole model's** cost after/before, and :attr:`minreal.compress.core.spec.MethodSpec.budgets` names the
kinds a method can meet (``compress()`` refuses the others, naming the flag).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from minreal.facts import PROVIDERS

from .errors import CompressionError, field_error

__all__ = ["CostBudget", "BUDGET_FIELDS", "SeedOption", "ExcludeOption", "StateBudgetOption", "WidthMultipleOption",
           "flag_of", "field_clash", "BUDGET_HELPERS", "PruneOptions", "Budget",
           "BudgetOptions", "STATS_DTYPE_NAMES", "DEFAULT_STATS_DTYPE", "ALLOCATOR_NAMES",
           "RANK_MULTIPLE_BY_PROVIDER", "rank_multiple_defaults", "WIDTH_MULTIPLE_BY_PROVIDER", "WIDTH_MIN_BY_PROVIDER",
           "width_multiple_defaults",
           "IMPORTANCE_WEIGHTINGS", "IMPORTANCE_WEIGHTING_AUTO"]

#: The whole-model budget fields of :class:`CostBudget`, in the order the CLI shows them.
BUDGET_FIELDS = ("mac_ratio", "param_ratio", "latency_ratio")
#: Fields of :class:`CostBudget` that serve one budget only (not offered for a method without that budget).
BUDGET_HELPERS = MappingProxyType({"latency_ratio": ("latency_table",)})
#: Rank allocators (``--allocator``), in the order ``--help`` lists them
#: (:data:`minreal.compress.core.allocate.ALLOCATORS`).
ALLOCATOR_NAMES = ("lagrangian", "energy", "uniform")
#: Precisions of the per-chunk statistics products (``--stats-dtype``;
#: :data:`minreal.compress.core.stats.STATS_DTYPES`).
STATS_DTYPE_NAMES = ("float64", "float32")
#: The default of those: float32 products, float64 accumulation. ``benchmarks/stats_precision.json``: no rank
#: ``factorize`` chooses changes on the four benchmark models (pretrained ResNet-32 on CIFAR-10 included) at MAC
#: 0.9-0.3, and the statistics pass takes 0.34-0.46 of the float64 time on the ResNets. Tests that check identities
#: ask for float64 explicitly.
DEFAULT_STATS_DTYPE = "float32"


def flag_of(field_name: str) -> str:
    """The CLI flag of a config field (``mac_ratio`` -> ``--mac-ratio``)."""
    return "--" + field_name.replace("_", "-")


def field_clash(configs: Mapping[str, type], name: str, cls: type) -> str | None:
    """Why method ``name`` (config ``cls``) clashes with the methods in ``configs``, or None: a config field whose
    name another method declares apart (not inherited from the same base here) would give one flag two meanings."""
    if not dataclasses.is_dataclass(cls):
        return f"the config of method {name!r} ({cls!r}) is not a dataclass"
    own = {f.name: f for f in dataclasses.fields(cls)}
    for other, other_cls in configs.items():
        for f in dataclasses.fields(other_cls):
            if f.name in own and own[f.name] is not f:
                return (f"config field {f.name!r} ({flag_of(f.name)}) of method {name!r} is declared apart by method "
                        f"{other!r}: give the knob its own name, or inherit the shared field from a base in "
                        "minreal.compress.core.options")
    return None


@dataclass
class CostBudget:
    """Whole-model budget shared by every method: at most one of MACs, parameters or measured latency."""

    mac_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model MAC budget: MACs after / before, in (0, 1]."})
    param_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model parameter budget: parameters after / before, in (0, 1]."})
    latency_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model latency budget from a measured table: latency after / before, in (0, 1]; "
                          "needs --latency-table."})
    latency_table: str | None = field(
        default=None,
        metadata={"help": "JSON latency table written by `minreal latency-table` (per-layer and whole-model "
                          "latencies on the target provider)."})

    def __post_init__(self) -> None:
        given = self.budget_given
        if len(given) > 1:
            raise CompressionError(f"give only one of {', '.join(f'`{k}`' for k in given)}", fields=given)
        for k in given:
            if not 0.0 < getattr(self, k) <= 1.0:
                raise field_error(self, k, f"must lie in (0, 1], got {getattr(self, k)}")
        if self.latency_ratio is not None and not self.latency_table:
            raise CompressionError("`latency_ratio` needs `latency_table` (latencies measured on the target "
                                   "provider); build one with `minreal latency-table MODEL --out table.json` (add "
                                   "`--kind width` for magnitude/wanda, `--kind depth` for depth)",
                                   fields=("latency_ratio", "latency_table"))

    @property
    def budget_given(self) -> list[str]:
        """The whole-model budget fields that were set (at most one in a valid config)."""
        return [k for k in BUDGET_FIELDS if getattr(self, k) is not None]


@dataclass
class SeedOption:
    """The random seed of methods that sample, split or train."""

    seed: int = field(
        default=0,
        metadata={"help": "Random seed (sampling, data split, initialisation, training); default 0."})


@dataclass
class ExcludeOption:
    """Layers a method leaves unchanged."""

    exclude: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Qualified name of a layer to leave unchanged (e.g. fc or blocks.0.ssm); default none."})


@dataclass
class StateBudgetOption:
    """A total state count shared among the reduced layers (neurons for cbalanced, SSM states for ssm)."""

    state_budget: int | None = field(
        default=None,
        metadata={"help": "Total states kept across the reduced layers (cbalanced: neurons at the state points; ssm: "
                          "SSM states, shared at equal energy), >= 1; default none."})

    def __post_init__(self) -> None:
        if self.state_budget is not None and self.state_budget < 1:
            raise CompressionError(f"`state_budget` (--state-budget) must be a positive state count, got "
                                   f"{self.state_budget}", fields=("state_budget",))


@dataclass
class WidthMultipleOption:
    """Channel widths on the fast multiple of the target kernels, and no narrower than their fast minimum (width
    methods on channel groups)."""

    width_multiple: int = field(
        default=8,
        metadata={"help": "Channel groups keep widths on this multiple (the kernels' fast channel block; a group of "
                          "one segment no wider than it halves it), >= 1; in compress, run and tune the --providers "
                          "provider's (16 on the CPU, 8 on GPUs); 8 in the Python API."})
    width_min: int = field(
        default=0,
        metadata={"help": "No channel segment is cut narrower than this (one no wider stays whole; a minimum off "
                          "the multiple acts as the next multiple up), >= 0; in compress, run and tune the --providers "
                          "provider's (16 on the CPU: ONNX Runtime's x86 int8 convolutions leave their fast kernel "
                          "below 16 output channels; 0 on GPUs); 0 in the Python API."})

    def __post_init__(self) -> None:
        if self.width_multiple < 1:
            raise field_error(self, "width_multiple", f"must be >= 1, got {self.width_multiple}")
        if self.width_min < 0:
            raise field_error(self, "width_min", f"must be >= 0, got {self.width_min}")


#: How the width allocator compares channel importance across channel groups
#: (:func:`minreal.compress.core.width.allocate.allocate_widths`); ``auto`` is :data:`IMPORTANCE_WEIGHTING_AUTO`'s
#: choice.
IMPORTANCE_WEIGHTINGS = ("auto", "cost", "none")
#: The measured best weighting of each width method (``benchmarks/width_allocation.json``, the pretrained CIFAR-10
#: ResNet-32 after one recovery epoch): magnitude 82.5/77.7/73.2 % at 0.9/0.7/0.5 of the MACs with ``cost`` against
#: 69.2/69.2/61.4 % with ``none`` (whose allocator overshot 0.9 to 0.697 of the MACs); wanda 81.25 % at 0.9 with
#: ``none`` against 78.1 % with ``cost`` (``cost`` was ahead by 4-8 pp at 0.7 and 0.5, where no tune within a few
#: points of the original lands: one seed, so the choice for wanda is the narrower one).
IMPORTANCE_WEIGHTING_AUTO: Mapping[str, str] = MappingProxyType({"magnitude": "cost", "wanda": "none"})


@dataclass
class PruneOptions(SeedOption, CostBudget, WidthMultipleOption):
    """Options of the neuron-pruning baselines: a whole-model budget (``param_ratio``, default 0.5, or
    ``mac_ratio``; uniform keep-fraction per hidden layer) or exact hidden ``widths``. The pruned MLP chain is the
    whole model, so its ratios are the whole model's."""

    widths: tuple[int, ...] = field(
        default=(),
        metadata={"help": "Exact hidden width per hidden layer of an MLP, instead of a budget; default none."})
    importance_weighting: str = field(
        default="auto",
        metadata={"help": "How channel importance compares across channel groups (traced models): cost (each "
                          "group's relative importance weighted by its cost per channel, so the least important "
                          "channels go first wherever they are), none (relative importance alone, which cuts the "
                          "costliest channels first, e.g. a ResNet's residual stream) or auto (the measured best "
                          "of the method: cost for magnitude, none for wanda); default auto.",
                  "choices": IMPORTANCE_WEIGHTINGS})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        WidthMultipleOption.__post_init__(self)
        if any(w < 1 for w in self.widths):
            raise field_error(self, "widths", f"must be positive neuron counts, got {self.widths}")
        if self.importance_weighting not in IMPORTANCE_WEIGHTINGS:
            raise field_error(self, "importance_weighting", f"must be one of {', '.join(IMPORTANCE_WEIGHTINGS)}, "
                                                            f"got {self.importance_weighting!r}")
        if self.widths and self.budget_given:
            budget = self.budget_given[0]
            raise CompressionError(f"give `widths` or `{budget}`, not both", fields=("widths", budget))

    def target(self) -> tuple[str, float]:
        """(budget field, ratio): the configured whole-model budget, ``param_ratio`` 0.5 when none is given."""
        given = self.budget_given
        return (given[0], getattr(self, given[0])) if given else ("param_ratio", 0.5)


#: Config field of each :class:`Budget` target, by scope (``layers``: the factorisable layers' cost; ``model``:
#: the whole model's).
_FIELDS = {"layers": {"flops": "layer_mac_ratio", "params": "layer_param_ratio",
                      "latency": "layer_latency_ratio", "rank_fraction": "rank_fraction"},
           "model": {"flops": "mac_ratio", "params": "param_ratio", "latency": "latency_ratio",
                     "rank_fraction": "rank_fraction"}}


@dataclass(frozen=True)
class Budget:
    """How ranks are chosen: a cost target (``flops``, ``params`` or measured ``latency`` ratio) or a plain
    rank fraction. ``scope`` says whose cost the ratio is of: the factorisable layers' (``layers``) or the
    whole model's (``model``; :func:`plan_ranks` then needs the whole-model cost)."""

    flops: float | None = None
    params: float | None = None
    rank_fraction: float | None = None
    allocator: str = "lagrangian"
    rank_multiple: int = 1
    latency: float | None = None
    scope: str = "layers"

    def __post_init__(self) -> None:
        given = self.given
        if len(given) > 1:
            names = [self.field(k) for k in given]
            raise CompressionError("give only one of " + ", ".join(f"`{n}`" for n in names), fields=names)
        for k in given:
            v = getattr(self, k)
            if not 0.0 < v <= 1.0:
                raise CompressionError(f"`{self.field(k)}` ({self.flag(k)}) must lie in (0, 1], got {v}",
                                       fields=(self.field(k),))
        if self.rank_multiple < 1:
            raise CompressionError(f"`rank_multiple` must be >= 1, got {self.rank_multiple}", fields=("rank_multiple",))
        if self.allocator not in ALLOCATOR_NAMES:
            raise CompressionError(f"`allocator` must be one of {sorted(ALLOCATOR_NAMES)}, got {self.allocator!r}",
                                   fields=("allocator",))

    def flag(self, key: str) -> str:
        """The CLI flag of target ``key`` in this budget's scope."""
        return flag_of(self.field(key))

    def field(self, key: str) -> str:
        """The config field of target ``key`` in this budget's scope (``flops`` -> ``layer_mac_ratio``)."""
        return _FIELDS[self.scope][key]

    @property
    def given(self) -> list[str]:
        """The targets that were set (at most one in a valid budget)."""
        return [k for k in ("flops", "params", "latency", "rank_fraction") if getattr(self, k) is not None]

    @property
    def cost_kind(self) -> str:
        if self.latency is not None:
            return "latency"
        return "params" if self.params is not None else "macs"

    @property
    def ratio(self) -> float | None:
        """The cost ratio asked for (None for a rank-fraction budget)."""
        return next((v for v in (self.flops, self.params, self.latency) if v is not None), None)


@dataclass
class BudgetOptions(CostBudget, ExcludeOption):
    """Config fields shared by the low-rank methods: the whole-model budget (:class:`CostBudget`), the
    factorisable-layer budget the allocator works in (see :class:`Budget`) and excluded layers."""

    layer_mac_ratio: float | None = field(
        default=None,
        metadata={"help": "Target ratio of the factorisable layers' MACs (not the whole model's: see --mac-ratio), in "
                          "(0, 1]; default 0.5 when no budget is given."})
    layer_param_ratio: float | None = field(
        default=None,
        metadata={"help": "Target ratio of the factorisable layers' parameters (not the whole model's: see "
                          "--param-ratio), in (0, 1]."})
    rank_fraction: float | None = field(
        default=None,
        metadata={"help": "Fraction of each layer's full rank kept, in (0, 1]; alternative to a cost target."})
    allocator: str = field(
        default="lagrangian",
        metadata={"help": "Rank allocator that shares the budget among the layers; default lagrangian.",
                  "choices": ALLOCATOR_NAMES})
    rank_multiple: int = field(
        default=1,
        metadata={"help": "Round every rank to a multiple of this, >= 1; default 1, or the providers' fast-path "
                          "multiple (16 CPU, 8 CUDA/TensorRT)."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        layer = [k for k in self._layer_targets() if getattr(self, k) is not None]
        if self.budget_given and layer:
            both = (self.budget_given[0], layer[0])
            raise CompressionError(f"give only one of `{both[0]}` and `{both[1]}`", fields=both)
        self.budget()  # validates the budget fields, naming them

    def _layer_targets(self) -> tuple[str, ...]:
        return ("layer_mac_ratio", "layer_param_ratio", "rank_fraction")

    def budget(self, latency: float | None = None) -> Budget:
        """The validated :class:`Budget` of these options: the whole-model budget when one is given, else the
        factorisable-layer one (``layer_mac_ratio=0.5`` when no target is given); ``latency`` from configs
        that offer a factorisable-layer latency target."""
        common = {"allocator": self.allocator, "rank_multiple": self.rank_multiple}
        if self.budget_given:
            return Budget(self.mac_ratio, self.param_ratio, latency=self.latency_ratio, scope="model", **common)
        budget = Budget(self.layer_mac_ratio, self.layer_param_ratio, self.rank_fraction, latency=latency, **common)
        return budget if budget.given else Budget(flops=0.5, **common)


#: Rank granularity that keeps factorised layers on the provider's fast paths: measured on resnet18 with the
#: CPU provider, multiples of 16 turned a 1.31x latency/MAC gap into 1.03x (benchmarks/factorize_latency.json);
#: GPU tensor cores want multiples of 8.
RANK_MULTIPLE_BY_PROVIDER: Mapping[str, int] = MappingProxyType(
    {name: 16 if name == "cpu" else 8 for name in PROVIDERS})


def rank_multiple_defaults(providers: Sequence[str]) -> dict[str, Any]:
    """Provider defaults of the low-rank methods: the coarsest rank multiple the target providers ask for."""
    multiples = [RANK_MULTIPLE_BY_PROVIDER[p] for p in providers if p in RANK_MULTIPLE_BY_PROVIDER]
    return {"rank_multiple": max(multiples)} if multiples else {}


#: Channel granularity of the providers' fast convolution kernels. CPU: 16, which is ONNX Runtime's NCHWc block on
#: AVX-512F (a multiple of AVX2's 8) and the output-channel pack of its x86 int8 convolution kernel; on the
#: pretrained CIFAR-10 ResNet-32, cuts on multiples of 16 (at least 16) ran at 0.82-0.91x the latency of cuts on
#: multiples of 8 at equal MACs in fp32 and INT8, batch 1 and 32 (benchmarks/int8_width.json, ``multiples``).
#: GPU tensor cores want multiples of 8.
WIDTH_MULTIPLE_BY_PROVIDER: Mapping[str, int] = MappingProxyType(
    {name: 16 if name == "cpu" else 8 for name in PROVIDERS})
#: Narrowest segment width: 16 on the CPU, where MLAS's symmetric int8 convolution needs at least 16 output
#: channels (``MlasConvSymPackWSize``; 8-channel convs fall back to im2col and a GEMM: the ResNet-32 cuts with
#: 8-channel stages ran 1.21-1.24x the original's INT8 latency at batch 32, benchmarks/int8_width.json); none on GPUs.
WIDTH_MIN_BY_PROVIDER: Mapping[str, int] = MappingProxyType({name: 16 if name == "cpu" else 0 for name in PROVIDERS})


def width_multiple_defaults(providers: Sequence[str]) -> dict[str, Any]:
    """Provider defaults of the width methods: the coarsest width multiple and the largest minimum width the
    target providers ask for."""
    known = [p for p in providers if p in WIDTH_MULTIPLE_BY_PROVIDER]
    if not known:
        return {}
    return {"width_multiple": max(WIDTH_MULTIPLE_BY_PROVIDER[p] for p in known),
            "width_min": max(WIDTH_MIN_BY_PROVIDER[p] for p in known)}
