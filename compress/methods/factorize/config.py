"""Options of ``factorize`` (torch-free: the registry and the command line read them without importing the
method)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import CompressionError, field_error
from ...core.options import DEFAULT_STATS_DTYPE, STATS_DTYPE_NAMES, Budget, BudgetOptions

__all__ = ["FactorizeConfig"]


@dataclass
class FactorizeConfig(BudgetOptions):
    """Options of ``factorize``. Give one whole-model budget (``mac_ratio``/``param_ratio``/``latency_ratio``), or
    one of ``layer_mac_ratio``/``layer_param_ratio``/``layer_latency_ratio`` (cost ratio of the factorisable
    layers) or ``rank_fraction``; with none, ``layer_mac_ratio=0.5``. Latency budgets rank by measured
    per-layer latency and need ``latency_table`` (a JSON table written by ``minreal latency-table``).

    ``eig_threshold`` zeroes eigenvalues of each layer's statistic below that fraction of the largest (the input
    moment, or the output Gram of a layer with fewer outputs than inputs per group); ``stats_dtype`` is the
    precision of the per-chunk products (accumulation is always float64; an output Gram's rows are the model's
    own forward outputs, so they carry the model's precision whatever this is); ``cache_dir`` caches statistics and
    bases per layer, keyed by model, data and layer.
    """

    eig_threshold: float = field(
        default=1e-10,
        metadata={"help": "Drop eigenvalues of each layer's statistic (input moment, or output Gram where "
                          "outputs < inputs) below this fraction of the largest, in [0, 1); default 1e-10."})
    memory_cap_bytes: int = field(
        default=1 << 30,
        metadata={"help": "Bound in bytes on the activation rows held at once per layer, >= 1 MiB; default 1 GiB."})
    calib_batch_size: int = field(
        default=32,
        metadata={"help": "Calibration samples per forward pass while collecting statistics, >= 1; default 32."})
    stats_dtype: str = field(
        default=DEFAULT_STATS_DTYPE,
        metadata={"help": "Precision of the per-chunk products (output Grams keep the model's own precision), "
                          "accumulated in float64; default "
                          f"{DEFAULT_STATS_DTYPE} (benchmarks/stats_precision.json: the same ranks, half the time; "
                          "float64 for identity checks).",
                  "choices": STATS_DTYPE_NAMES})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Directory caching statistics and bases per layer, keyed by model, data and layer; "
                          "default no cache."})
    layer_latency_ratio: float | None = field(
        default=None,
        metadata={"help": "Target ratio of the factorisable layers' measured latency (not the whole model's: see "
                          "--latency-ratio), in (0, 1]; needs --latency-table."})

    def _layer_targets(self) -> tuple[str, ...]:
        return (*super()._layer_targets(), "layer_latency_ratio")

    def budget(self, latency: float | None = None) -> Budget:
        """The validated :class:`Budget`, with the configured ``layer_latency_ratio`` unless one is given."""
        return super().budget(self.layer_latency_ratio if latency is None else latency)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.calib_batch_size < 1:
            raise field_error(self, "calib_batch_size", f"must be >= 1, got {self.calib_batch_size}")
        if not 0.0 <= self.eig_threshold < 1.0:
            raise field_error(self, "eig_threshold", f"must lie in [0, 1), got {self.eig_threshold}")
        if self.memory_cap_bytes < 1 << 20:
            raise field_error(self, "memory_cap_bytes", f"must be at least 1 MiB, got {self.memory_cap_bytes}")
        if self.stats_dtype not in STATS_DTYPE_NAMES:
            raise field_error(self, "stats_dtype", f"must be one of {sorted(STATS_DTYPE_NAMES)}, "
                                                   f"got {self.stats_dtype!r}")
        if self.layer_latency_ratio is not None and not self.latency_table:
            raise CompressionError("`layer_latency_ratio` (--layer-latency-ratio) needs `latency_table` "
                                   "(--latency-table) (per-layer latencies measured on the target provider); build "
                                   "one with `minreal latency-table MODEL --out table.json`",
                                   fields=("layer_latency_ratio", "latency_table"))
