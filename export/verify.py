"""Parity between a torch module and its ONNX file, measured with ONNX Runtime.

An element passes when ``|onnx - torch| <= atol + rtol * |torch|`` (``numpy.allclose``'s rule); torch-against-ONNX
parity (:func:`verify_parity`) adds ``atol_scale * max|torch|`` of that output to ``atol``
(:data:`DEFAULT_ATOL_SCALE`): float32 roundoff grows with the magnitudes a graph carries, not with each element, so
a logit near zero beside logits of 4 carries the roundoff of the whole graph (a seeded ResNet-101, BatchNorm
statistics estimated, outputs up to 4.0: ONNX Runtime's differ from torch's by 1.6e-4 at an element of 1e-3, 4e-5
of the output's largest magnitude, at batch 16). Defaults ``rtol=1e-4,
atol=1e-5`` suit float32 graphs whose ops were fused or reordered by the exporter and ORT; failing parity raises
:class:`ParityError`, never warns.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from minreal.compress.core.evaluate import eval_mode, flatten_outputs
from minreal.compress.core.inputs import Inputs, NamedInputs, as_floating, call, sample_shapes
from minreal.compress.core.width.tracing import is_exported_program
from minreal.export.errors import ParityError
from minreal.facts import PROVIDERS, error_line
from minreal.runtime_bench.sessions import create_session

if TYPE_CHECKING:  # the runtime wheel is imported on first use (minreal.runtime_bench.runtime)
    import onnxruntime as ort

__all__ = [
    "COMPARE_CHUNK",
    "DEFAULT_ATOL",
    "DEFAULT_ATOL_SCALE",
    "DEFAULT_RTOL",
    "ROUNDOFF_FACTOR",
    "ROUNDOFF_MAX_SHARE",
    "OutputParity",
    "ParityResult",
    "Feeds",
    "compare_output",
    "feed_rows",
    "feeds_of",
    "finite_abs_max",
    "MASK_VALUES",
    "output_scale",
    "ort_errors",
    "run_ort",
    "verify_files",
    "verify_parity",
    "output_agreement",
]

logger = logging.getLogger(__name__)

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
DEFAULT_ATOL_SCALE = 1e-4
"""Part of an output's largest magnitude added to ``atol`` by :func:`verify_parity` (0.01 %: 2.5 x what moved a
seeded ResNet-101's near-zero logit, about 1 % of one int8 step of the same output), so near-zero elements of
a large output are held to that output's roundoff, not to ``atol`` alone."""
ROUNDOFF_FACTOR = 2.0
"""Where an output misses the rule above, :func:`verify_parity` runs the module in float64 and widens that output's
tolerance by this many times torch's own float32 error (its largest ``|torch32 - torch64|``): when ONNX Runtime is
no further from the exact (float64) result than torch is, ``|onnx - torch32| <= |onnx - torch64| + |torch32 -
torch64| <= 2 x`` torch's error (the triangle inequality). A seeded ResNet-152's batch-1 output differed by 2.75e-4
in ONNX Runtime, 1 % beyond the rule, while torch's own float32 result was 3.1e-4 from float64."""
ROUNDOFF_MAX_SHARE = 1e-3
"""Torch's float32 error on an output counts as roundoff up to this share of the output's largest magnitude (16,000
float32 units): beyond it, the float64 run took another discrete branch (a near-tie picked by an argmax, top-k or
NMS, the others' values gathered by it), and its difference bounds nothing; the rule alone stands. A seeded
ResNet-152's was 2.2e-4 of its output's largest magnitude."""


@dataclass(frozen=True)
class OutputParity:
    """One output at one batch size.

    Attributes
    ----------
    output : str
        graph output name.
    batch_size : int
        batch size of the input.
    max_abs_err : float
        max ``|onnx - torch|``.
    max_rel_err : float
        max ``|onnx - torch| / max(|torch|, atol)`` (the floor keeps zeros finite; the ``atol`` given, without the
        ``atol_scale`` part, so the figure reads as before that part existed).
    worst_measured : float
        ``|onnx - torch|`` at the element that breaks the tolerance most.
    worst_allowed : float
        ``atol + atol_scale * max|torch| + rtol * |torch|`` at that element (no scale part where
        :func:`compare_output` was given no ``atol_scale``).
    top1_agreement : float | None
        share of rows whose argmax over the last axis agrees (``None`` for <2-d outputs).
    passed : bool
        every element within tolerance and shapes equal.
    roundoff : float
        torch's own float32 error on this output, ``max |torch32 - torch64|``, of which :data:`ROUNDOFF_FACTOR`
        times was added to the tolerance; 0 where the rule held without it (no float64 run) and for an integer output.
    """

    output: str
    batch_size: int
    max_abs_err: float
    max_rel_err: float
    worst_measured: float
    worst_allowed: float
    top1_agreement: float | None
    passed: bool
    roundoff: float = 0.0


@dataclass(frozen=True)
class ParityResult:
    """Parity of an ONNX file against its module over several batch sizes.

    Attributes
    ----------
    onnx_path : str
        the file checked.
    rtol, atol : float
        tolerances used.
    batch_sizes : list[int]
        batch sizes checked, in input order.
    checks : list[OutputParity]
        one :class:`OutputParity` per output and batch size.
    max_abs_err, max_rel_err : float
        worst values over all checks.
    top1_agreement : dict[int, float | None]
        batch size → top-1 agreement of the first output (``None`` if not 2-d+).
    passed : bool
        all checks passed.
    atol_scale : float
        part of each output's largest reference magnitude added to ``atol`` (0: ``numpy.allclose``'s rule).
    """

    onnx_path: str
    rtol: float
    atol: float
    batch_sizes: list[int]
    checks: list[OutputParity] = field(default_factory=list)
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    top1_agreement: dict[int, float | None] = field(default_factory=dict)
    passed: bool = True
    atol_scale: float = 0.0


Feeds = np.ndarray | Mapping[str, np.ndarray]
"""ONNX Runtime inputs: one array for a one-input graph, or arrays by graph input name."""


def feeds_of(x: Inputs) -> Feeds:
    """Numpy feeds for torch inputs: an array, or ``name → array`` for named inputs."""
    return x.numpy() if isinstance(x, NamedInputs) else x.detach().cpu().numpy()


def feed_rows(x: Feeds) -> int:
    """Rows (batch size) of a feed."""
    return len(next(iter(x.values()))) if isinstance(x, Mapping) else len(x)


def ort_errors() -> tuple[type[Exception], ...]:
    """The exception types ONNX Runtime raises when it cannot load or run a graph (``Fail``, ``InvalidArgument``,
    ...: each derives from ``Exception`` alone, so none can be caught by a built-in type short of ``Exception``)."""
    from minreal.runtime_bench.runtime import onnxruntime_module

    state = vars(onnxruntime_module().capi.onnxruntime_pybind11_state)
    return tuple(v for v in state.values() if isinstance(v, type) and issubclass(v, Exception))


def run_ort(session: ort.InferenceSession, x: Feeds) -> list[np.ndarray]:
    """Run a session on ``x`` (one array for a one-input graph, or arrays by input name); all outputs in graph
    order."""
    inputs = [i.name for i in session.get_inputs()]
    if not isinstance(x, Mapping):
        if len(inputs) != 1:
            raise ValueError(f"expected a graph with one input, got {inputs}; feed arrays by input name")
        return session.run(None, {inputs[0]: x})
    if sorted(x) != sorted(inputs):
        raise ValueError(f"the graph's inputs are {inputs} but the feeds name {list(x)}")
    return session.run(None, dict(x))


def _top1(onnx_out: np.ndarray, torch_out: np.ndarray) -> float | None:
    """Share of rows whose argmax over the last axis agrees; ``None`` for outputs under 2-d."""
    if torch_out.ndim < 2:
        return None
    return float(np.mean(onnx_out.argmax(-1) == torch_out.argmax(-1)))


COMPARE_CHUNK = 1 << 22
"""Elements of one output compared at a time by :func:`compare_output` (its float64 temporaries are 32 MiB each, not
the size of the output: a segmentation model's batch-16 parity output at 520×520 is 91 M elements)."""


def finite_abs_max(x: np.ndarray) -> float:
    """Largest finite ``|x|`` (0 when none is finite), :data:`COMPARE_CHUNK` elements at a time."""
    best = 0.0
    for start in range(0, x.size, COMPARE_CHUNK):
        part = np.abs(x[start:start + COMPARE_CHUNK].astype(np.float64))
        part = part[np.isfinite(part)]
        if part.size:
            best = max(best, float(part.max()))
    return best


MASK_VALUES = 16
"""At most this many distinct constants past :func:`output_scale`'s bound are read as masks; more are an output's
own values, and the scale is its largest finite magnitude as before."""


def output_scale(got: np.ndarray, want: np.ndarray, atol_scale: float) -> float:
    """The magnitude ``atol_scale`` multiplies for one output: the largest finite ``|want|``, except a constant the
    runtime wrote exactly at several positions of a sample whose share ``atol_scale * |want|`` exceeds every element
    that differs.

    Such a value is a mask a graph writes (``torch.finfo(dtype).min`` or ``-1e9`` beside logits of about 10): it needs
    no tolerance itself, and counted it made the tolerance 3.4e34 or 1e5, so a runtime 1.0 off on every kept logit
    passed. An element that differs always counts, and so does an exact one within that bound or found at one
    position of the sample (axis 0 is the batch: a large output whose largest element agrees exactly still holds its
    near-zero ones to its roundoff, in repeated rows too). Not a mask here: one masked position only, and a mask
    added to computed values (``-1e4 + logit``), which rounds like any value; more than :data:`MASK_VALUES` constants
    past the bound (then the largest finite ``|want|``); 0 where nothing differs. ``got`` and ``want`` have the same
    shape; :data:`COMPARE_CHUNK` elements at a time."""
    if not atol_scale:  # no scale part to bound
        return finite_abs_max(want)
    row = max(1, int(np.prod(want.shape[1:])))  # elements per sample (axis 0 the batch): a position is index % row
    got, want = got.reshape(-1), want.reshape(-1)
    chunks = [(i, want[i:i + COMPARE_CHUNK], got[i:i + COMPARE_CHUNK]) for i in range(0, want.size, COMPARE_CHUNK)]
    largest, differs = 0.0, False
    for _, ref, out in chunks:
        moved = np.abs(ref[(out != ref) & np.isfinite(ref)].astype(np.float64))
        if moved.size:
            largest, differs = max(largest, float(moved.max())), True
    if not differs:  # no tolerance needed
        return 0.0
    bound = largest / atol_scale
    first: dict[float, int] = {}  # a constant past the bound: the first position it was found at, -1 once at two
    for start, ref, out in chunks:
        exact = (out == ref) & np.isfinite(ref)
        values = ref[exact].astype(np.float64)
        within = np.abs(values[np.abs(values) <= bound])
        largest = max(largest, float(within.max())) if within.size else largest
        past = np.abs(values) > bound
        if not past.any():
            continue
        values, where = values[past], (start + np.flatnonzero(exact)[past]) % row
        distinct = np.unique(values)
        if len(distinct) > MASK_VALUES:  # not a few constants: the output's own values
            return finite_abs_max(want)
        for value in distinct:
            at = where[values == value]
            seen = first.setdefault(float(value), int(at[0]))
            first[float(value)] = -1 if seen == -1 or bool((at != seen).any()) else seen
        if len(first) > MASK_VALUES:  # not a few constants: the output's own values
            return finite_abs_max(want)
    return max([largest, *(abs(value) for value, at in first.items() if at != -1)])


def compare_output(
    name: str, batch: int, onnx_out: np.ndarray, torch_out: np.ndarray, rtol: float, atol: float,
    atol_scale: float = 0.0, roundoff: float = 0.0,
) -> OutputParity:
    """Measure one output against its reference (same shape) with ``numpy.allclose``'s rule, in float64, over
    :data:`COMPARE_CHUNK` elements at a time (the same figures as over the whole output at once); ``atol_scale``
    adds that part of the reference's largest finite magnitude to ``atol`` (:data:`DEFAULT_ATOL_SCALE`), and
    ``roundoff`` (the reference's own float32 error, measured against float64) adds :data:`ROUNDOFF_FACTOR` times
    itself."""
    if torch_out.size == 0:
        return OutputParity(name, batch, 0.0, 0.0, 0.0, atol, _top1(onnx_out, torch_out), True)
    got, want = onnx_out.reshape(-1), torch_out.reshape(-1)
    floor = max(atol, np.finfo(np.float32).tiny)  # max_rel_err's floor: the given atol, as before atol_scale
    if atol_scale:
        atol = atol + atol_scale * output_scale(onnx_out, torch_out, atol_scale)
    atol = atol + ROUNDOFF_FACTOR * roundoff
    abs_max, rel_max, passed = [], [], True
    worst_ratio, worst = -1.0, (0.0, atol)
    for start in range(0, want.size, COMPARE_CHUNK):
        ref = want[start:start + COMPARE_CHUNK].astype(np.float64)
        diff = np.abs(got[start:start + COMPARE_CHUNK].astype(np.float64) - ref)
        allowed = atol + rtol * np.abs(ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.nan_to_num(np.where(diff == 0, 0.0, diff / allowed), nan=np.inf)
        i = int(np.argmax(ratio))  # the first worst element of the chunk; a later chunk must be strictly worse
        if ratio[i] > worst_ratio:
            worst_ratio, worst = float(ratio[i]), (float(diff[i]), float(allowed[i]))
        abs_max.append(diff.max())
        rel_max.append((diff / np.maximum(np.abs(ref), floor)).max())
        passed = passed and bool(np.all(diff <= allowed))
    return OutputParity(
        name, batch, float(np.max(abs_max)), float(np.max(rel_max)), *worst, _top1(onnx_out, torch_out), passed,
        roundoff,
    )  # fmt: skip


class _Float64Twin:
    """A float64 copy of a module, made when first needed and kept for every later batch size (the copy, about three
    times the weights, is made at most once per :func:`verify_parity`)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._copy: nn.Module | None = None

    def outputs(self, x: Inputs) -> list[np.ndarray]:
        """The copy's outputs on ``x`` (floating inputs in float64, integer ones as they are), float64 arrays."""
        if self._copy is None:
            self._copy = copy.deepcopy(self.module).double()
        return [t.detach().cpu().double().numpy()
                for t in flatten_outputs(call(self._copy, as_floating(x, torch.float64)))]


def _resized(first: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]]) -> str:
    """The axes (``input axis 2: 8 -> 4``) where ``shapes`` differ from the first parity input's, or ""."""
    return ", ".join(f"{name} axis {axis + 1}: {a} -> {b}" for name, shape in shapes.items()
                     for axis, (a, b) in enumerate(zip(first.get(name, shape), shape)) if a != b)


def _check_batch(
    module: nn.Module, session: ort.InferenceSession, x: Inputs, rtol: float, atol: float, atol_scale: float,
    twin: _Float64Twin, resized: str = "",
) -> list[OutputParity]:
    """Compare every output of ``module(x)`` with ONNX Runtime's; raise on a count or shape mismatch, or when the
    module itself fails on these inputs (e.g. one input cut to another length and its partner not). ``resized``:
    the dynamic axes these inputs have at another length than the first check's (:func:`_resized`)."""
    try:
        expected = [t.detach().cpu().numpy() for t in flatten_outputs(call(module, x))]
    except Exception as exc:
        hint = ("; when inputs share a dynamic axis, name it on each of them (--dynamic-axes input_ids:batch,seq "
                "--dynamic-axes attention_mask:batch,seq)" if isinstance(x, NamedInputs) else "")
        if resized:  # the check of the dynamic axes at another length: the model does not take it
            hint = (f"; these are the dynamic axes at another length ({resized}), which the model does not take: "
                    "keep those axes static" + hint)
        if is_exported_program(module):  # a torch.export program checks the sizes it was exported at
            at = f" ({resized})" if resized else ""
            hint = (f"; a torch.export program (.pt2) runs only at the sizes it was saved for{at}: make it again "
                    "with that axis dynamic (minreal compress --dynamic-axes), or keep the axis static")
        raise ParityError(f"the torch module fails on the parity inputs {_describe(x)}: {error_line(exc)}{hint}") \
            from None
    got = run_ort(session, feeds_of(x))
    names = [o.name for o in session.get_outputs()]
    if len(got) != len(expected):
        raise ParityError(f"the ONNX graph has {len(got)} outputs but the module returns {len(expected)}")
    batch = len(x)
    for name, g, e in zip(names, got, expected):
        if g.shape != e.shape:
            raise ParityError(f"ONNX output {name!r} at batch size {batch} has shape {g.shape}, torch {e.shape} "
                              f"(input {_describe(x)})")
    checks = [compare_output(name, batch, g, e, rtol, atol, atol_scale) for name, g, e in zip(names, got, expected)]
    if all(c.passed for c in checks):
        return checks
    # only where the rule alone did not hold: a float64 run
    roundoffs = _float32_roundoff(twin, x, expected)
    if roundoffs is None:
        return checks
    return [c if c.passed else compare_output(name, batch, g, e, rtol, atol, atol_scale, r)
            for c, name, g, e, r in zip(checks, names, got, expected, roundoffs)]


def _float32_roundoff(twin: _Float64Twin, x: Inputs, expected: list[np.ndarray]) -> list[float] | None:
    """Torch's own float32 error per output, ``max |torch32 - torch64|`` (:func:`_max_error`), from the module's
    float64 ``twin`` on ``x``; ``None`` when the module does not run in float64 (a quantised or fixed-dtype layer) or
    gives other outputs there."""
    try:
        exact = twin.outputs(x)
    except Exception as exc:  # any failure of the float64 run leaves the float32 rule as it was
        logger.info("no float64 reference for the parity tolerance: %s", error_line(exc))
        return None
    if len(exact) != len(expected) or any(a.shape != e.shape for a, e in zip(exact, expected)):
        return None
    return [_max_error(e, a) for e, a in zip(expected, exact)]


def _max_error(got: np.ndarray, exact: np.ndarray) -> float:
    """Largest finite ``|got - exact|`` where ``exact`` lies within the range of ``got``'s dtype (0 when none), over
    :data:`COMPARE_CHUNK` elements at a time: a float64 value beyond float32's is a constant of the dtype
    (``torch.finfo(dtype).min`` as a mask: -3.4e38 against -1.8e308), not roundoff, and would open the tolerance
    to infinity. 0 for an integer (or boolean) output: it has no roundoff, and a float64 run that flips a near-tie
    (an argmax's class id) differs by a jump that bounds nothing; 0 too where the error exceeds
    :data:`ROUNDOFF_MAX_SHARE` of the output's largest magnitude (a float value a flipped choice picked)."""
    if not np.issubdtype(got.dtype, np.floating):
        return 0.0
    limit = float(np.finfo(got.dtype).max)
    got, exact = got.reshape(-1), exact.reshape(-1)
    best = scale = 0.0
    for start in range(0, got.size, COMPARE_CHUNK):
        want = exact[start:start + COMPARE_CHUNK]
        diff = np.abs(got[start:start + COMPARE_CHUNK].astype(np.float64) - want)
        kept = np.isfinite(diff) & (np.abs(want) <= limit)
        if kept.any():
            best, scale = max(best, float(diff[kept].max())), max(scale, float(np.abs(want[kept]).max()))
    return best if best <= ROUNDOFF_MAX_SHARE * scale else 0.0


def _describe(x: Inputs) -> str:
    """Input shapes for messages: ``(2, 8)`` or ``input_ids (2, 8), attention_mask (2, 8)``."""
    if isinstance(x, NamedInputs):
        return ", ".join(f"{n} {tuple(t.shape)}" for n, t in x.items())
    return str(tuple(x.shape))


def _summarise(path: str, rtol: float, atol: float, batches: list[int], checks: list[OutputParity],
               atol_scale: float = 0.0) -> ParityResult:
    """Fold per-output checks into a :class:`ParityResult`."""
    first = {c.batch_size: c.top1_agreement for c in reversed(checks)}
    return ParityResult(
        onnx_path=path, rtol=rtol, atol=atol, batch_sizes=batches, checks=checks,
        max_abs_err=max(c.max_abs_err for c in checks), max_rel_err=max(c.max_rel_err for c in checks),
        top1_agreement={b: first[b] for b in batches}, passed=all(c.passed for c in checks), atol_scale=atol_scale,
    )  # fmt: skip


def _raise_worst(result: ParityResult, against: str = "torch") -> None:
    """Raise :class:`ParityError` naming the worst failing output, batch size, measured and allowed."""
    failing = [c for c in result.checks if not c.passed]
    worst = max(failing, key=lambda c: c.worst_measured / c.worst_allowed if c.worst_allowed else float("inf"))
    roundoff = f" + {ROUNDOFF_FACTOR:g} x torch's float32 error {worst.roundoff:.2g}" if worst.roundoff else ""
    raise ParityError(
        f"ONNX output {worst.output!r} at batch size {worst.batch_size} differs from {against} in "
        f"{Path(result.onnx_path).name}: |diff| {worst.worst_measured:.3g} > allowed {worst.worst_allowed:.3g} "
        f"(rtol={result.rtol:g}, atol={result.atol:g}"
        f"{f' + {result.atol_scale:g} x max|output|' if result.atol_scale else ''}{roundoff}; "
        f"{len(failing)} of {len(result.checks)} checks failed)",
        result,
    )


def verify_parity(
    module: nn.Module,
    onnx_path: str | Path,
    inputs: Sequence[Inputs],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    provider: str = PROVIDERS["cpu"],
    fixed_batch: bool = False,
    atol_scale: float = DEFAULT_ATOL_SCALE,
) -> ParityResult:
    """Check that ONNX Runtime reproduces ``module`` on inputs of at least two batch sizes (one for a file whose
    batch is fixed): each element within ``atol + atol_scale * max|output| + rtol * |torch|``, and, for an output
    that misses it, within that plus :data:`ROUNDOFF_FACTOR` x torch's own float32 error on it (measured against a
    float64 copy of the module, run only then), which deep networks' roundoff can exceed the first rule by.

    Parameters
    ----------
    module : nn.Module
        the torch module (run in eval mode under ``no_grad``; flags restored after).
    onnx_path : str | Path
        its exported ONNX file (outputs in the module's flattened order).
    inputs : Sequence[Inputs]
        one tensor (or named inputs) per checked shape; at least two distinct batch sizes (a further
        entry may repeat a batch size at another length of a dynamic axis).
    rtol : float
        relative tolerance (default ``1e-4``).
    atol : float
        absolute tolerance (default ``1e-5``).
    provider : str
        ONNX Runtime execution provider (full name); the session opens in
        :func:`minreal.runtime_bench.sessions.create_session`.
    fixed_batch : bool
        the file runs at one batch size only (``--fixed-shapes batch=1``): one is enough.
    atol_scale : float
        part of each output's largest magnitude added to ``atol`` (default :data:`DEFAULT_ATOL_SCALE`; 0 for
        ``numpy.allclose``'s rule alone).

    Returns
    -------
    ParityResult
        A :class:`ParityResult` with max abs/rel error and top-1 agreement per batch size.

    Raises
    ------
    ValueError
        fewer than two distinct batch sizes (none, with ``fixed_batch``).
    ParityError
        an output (or the output count/shape) differs beyond tolerance.
    """
    batches = [len(x) for x in inputs]
    if len(set(batches)) < (1 if fixed_batch else 2):
        raise ValueError(f"parity needs inputs at two or more batch sizes, got batch sizes {batches}")
    session = create_session(Path(onnx_path), provider, arena=False)
    with eval_mode(module), torch.no_grad():
        twin = _Float64Twin(module)
        first = sample_shapes(inputs[0])
        checks = [c for x in inputs for c in _check_batch(module, session, x, rtol, atol, atol_scale, twin,
                                                          _resized(first, sample_shapes(x)))]
    result = _summarise(str(onnx_path), rtol, atol, batches, checks, atol_scale)
    if not result.passed:
        _raise_worst(result)
    logger.info("parity ok for %s at batch sizes %s (max abs err %.3g)", onnx_path, batches, result.max_abs_err)
    return result


def verify_files(reference: str | Path, candidate: str | Path, feeds: Sequence[Feeds], rtol: float = DEFAULT_RTOL,
                 atol: float = DEFAULT_ATOL, reference_config: Mapping[str, str] | None = None) -> ParityResult:
    """Check that ``candidate`` (e.g. the ORT-format copy of an INT8 file) reproduces ``reference``, both run by ONNX
    Runtime's CPU provider on each of ``feeds``, with :func:`verify_parity`'s rule and result; ``reference_config``:
    session config entries of the reference's session (e.g. ONNX Runtime's ARM graph,
    :data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`, for a candidate optimised for ARM).

    Raises
    ------
    ParityError
        an output differs beyond tolerance, or in count or shape.
    """
    want_session = create_session(Path(reference), config=reference_config, arena=False)
    got_session = create_session(Path(candidate), arena=False)
    names = [o.name for o in got_session.get_outputs()]
    checks: list[OutputParity] = []
    for x in feeds:
        want, got = run_ort(want_session, x), run_ort(got_session, x)
        if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
            raise ParityError(f"{Path(candidate).name} gives outputs of shapes {[g.shape for g in got]}, "
                              f"{Path(reference).name} {[w.shape for w in want]}")
        checks += [compare_output(n, feed_rows(x), g, w, rtol, atol) for n, g, w in zip(names, got, want)]
    result = _summarise(str(candidate), rtol, atol, [feed_rows(x) for x in feeds], checks)
    if not result.passed:
        _raise_worst(result, Path(reference).name)
    return result


def _run_fitting(session: Any, feeds: Feeds) -> np.ndarray:
    """The first output (float64) on ``feeds``, in pieces of the file's batch where its batch is fixed
    (``--fixed-shapes batch=1``): the rows beyond the last whole piece are left out."""
    batch = session.get_inputs()[0].shape[0] if session.get_inputs()[0].shape else None
    rows = feed_rows(feeds)
    if not isinstance(batch, int) or batch <= 0 or batch == rows:
        return run_ort(session, feeds)[0].astype(np.float64)
    if rows < batch:
        raise ValueError(f"the file's batch is fixed at {batch} but only {rows} rows were given")

    def piece(i: int) -> Feeds:
        if isinstance(feeds, Mapping):
            return {k: np.asarray(v)[i:i + batch] for k, v in feeds.items()}
        return np.asarray(feeds)[i:i + batch]

    return np.concatenate([run_ort(session, piece(i))[0] for i in range(0, rows - batch + 1, batch)]).astype(np.float64)


def output_agreement(reference: str | Path, candidate: str | Path, x: Feeds, rows: int = 512
                     ) -> tuple[float | None, float]:
    """(top-1 agreement, relative mean squared error ``‖c − r‖² / ‖r‖²``) of ``candidate``'s first output against
    ``reference``'s, both run with ONNX Runtime's CPU provider on the first ``rows`` rows of ``x`` (e.g. an INT8 file
    against its fp32 source). The agreement is ``None`` for outputs under 2-d or with one column."""
    part = {k: np.asarray(v)[:rows] for k, v in x.items()} if isinstance(x, Mapping) else np.asarray(x)[:rows]
    ref, out = (_run_fitting(create_session(Path(p)), part) for p in (reference, candidate))
    n = min(len(ref), len(out))  # a fixed-batch file leaves the last partial piece out: compare the same rows
    ref, out = ref[:n], out[:n]
    agreement = _top1(out, ref) if ref.ndim >= 2 and ref.shape[-1] > 1 else None
    return agreement, float(np.sum((out - ref) ** 2) / max(float(np.sum(ref**2)), 1e-300))
