"""What a tune finds: every deployable file it measured (:class:`Candidate`) and its versioned ``report.json``
(:class:`TuneReport`); plain data, no torch or ONNX, so output and reports read it without the heavy imports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate", "TuneReport", "TUNE_SCHEMA_VERSION", "BASELINES", "Progress", "cell_name"]

TUNE_SCHEMA_VERSION = 1
BASELINES = ("original", "original.int8", "original.int8-ac")
Progress = Callable[[str], None]
"""Where the tune's progress lines go (default: its logger's ``info``)."""


@dataclass
class Candidate:
    """One deployable file: a baseline or a searched candidate in one precision, with what was measured."""

    label: str
    kind: str
    """``baseline`` or ``structural``."""
    precision: str
    """``fp32``, ``int8`` (post-training) or ``int8-qat`` (ranges trained by quantisation-aware recovery)."""
    onnx: str
    onnx_bytes: int
    method: str = "none"
    mac_ratio: float = 1.0
    recover_epochs: int = 0
    quality: dict[str, Any] = field(default_factory=dict)
    """ONNX Runtime's metrics on the held-out data (accuracy, top1_agreement with the original, mse)."""
    loss: float | None = None
    """What it gives up against the original under the constraint (pp of accuracy, 1 − agreement, MSE)."""
    feasible: bool = False
    screen_ms: dict[str, float] = field(default_factory=dict)
    """p50 by ``provider/bBATCH`` with the short protocol."""
    confirm_ms: dict[str, float] = field(default_factory=dict)
    """p50 by cell with the release protocol (front and baselines only)."""
    confirm_range_ms: dict[str, list[float]] = field(default_factory=dict)
    """[lowest, highest] per-process p50 by cell in the confirmation (the spread over fresh processes)."""
    pt2: str | None = None
    gzip_bytes: int = 0
    """The file (with its external data) gzip-compressed (:func:`minreal.runtime_bench.model_info.gzip_bytes`)."""
    ort_bytes: int | None = None
    """``--format onnx,ort`` with ``--max-size`` or ``--objective size``: the size of its ORT-format file, which
    ``--max-size`` judges too and ``--objective size`` ranks by (converted in a scratch folder); None: not converted
    (no such options, or already infeasible)."""

    @property
    def shipped_bytes(self) -> int:
        """The bytes of the file that ships: the ``.ort`` file where it was converted, else the ``.onnx`` file."""
        return self.onnx_bytes if self.ort_bytes is None else self.ort_bytes


@dataclass
class TuneReport:
    """The versioned ``report.json`` of a tune directory (``kind: "tune"``)."""

    schema_version: int
    kind: str
    created_utc: str
    config: dict[str, Any]
    constraint: str
    reference: dict[str, Any]
    searches: list[dict[str, Any]]
    candidates: list[Candidate]
    front: dict[str, list[str]]
    chosen: str | None
    verdict: str
    counts: dict[str, int]
    wall_s: float
    screen: dict[str, Any] = field(default_factory=dict)
    confirm: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured_on: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Where each timing pass ran (``screen``, ``confirm``): ``host`` and ``pid`` of the process that timed it."""
    halving: dict[str, Any] | None = None
    """The recovered candidates' race (:meth:`.halving.Halving.record`): which candidate got which share of the
    recovery cap, its loss there, and whether it went on."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Wall time by phase: the candidates' ``prepare``, ``realise``, ``recover``, ``measure`` and ``export``
    (summed over candidates, so with several workers they can exceed the search's wall time), and the tune's own
    ``baselines`` (export, quantisation, accuracy control), ``search`` (wall time of all candidate rounds),
    ``structure_files`` and ``structure_screen`` (the race's structure screen: exporting the pool's zero-shot
    models, timing them; inside ``search``), ``ort_quality``, ``ort_sizes`` (``--format onnx,ort`` with
    ``--max-size``: the feasible files converted to judge their ``.ort`` size), ``screen`` and ``confirm``."""
    chosen_ort: dict[str, Any] | None = None
    """With ``--format onnx,ort`` and a chosen model: ``chosen.ort`` and its configuration
    (:func:`minreal.export.ort_format.ort_copy`'s record, with ``gzip_bytes``), checked against ``chosen.onnx``."""


def cell_name(provider: str, batch: int) -> str:
    """The key of a (provider, batch) cell in a candidate's latencies and the report's fronts: ``cpu/b1``."""
    return f"{provider}/b{batch}"
