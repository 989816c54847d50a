"""Accuracy and agreement metrics, accumulated batch by batch, separate from timing."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import BenchInputError
from .inputs import Data, InputSpec, batch_inputs, check_batch, data_digest, data_rows, input_specs, take_rows
from .model_info import files_sha256
from .providers import provider_name
from .sessions import create_session

__all__ = [
    "ModelMetrics",
    "is_classification",
    "correct_count",
    "squared_error_sum",
    "agreement_count",
    "max_abs_diff",
    "evaluate_models",
    "reference_outputs_kept",
    "eval_step",
    "EVAL_STEP_BYTES",
    "DIFF_CHUNK",
]


@dataclass(frozen=True)
class ModelMetrics:
    """Quality of one model on the evaluation data, and its agreement with the first model.

    ``accuracy`` (fraction) is set for integer labels, ``mse`` for float targets; both None without
    labels. ``top1_agreement`` is None when outputs have fewer than two classes or are not ``(batch, classes)``.
    ``max_abs_diff`` compares the first output with the first model's first output.
    """

    model: str
    samples: int
    accuracy: float | None
    mse: float | None
    top1_agreement: float | None
    max_abs_diff: float


def is_classification(y: np.ndarray) -> bool:
    """Integer or boolean labels mean classification (argmax accuracy); floats mean regression (MSE)."""
    return np.asarray(y).dtype.kind in "iub"


def correct_count(outputs: np.ndarray, labels: np.ndarray) -> int:
    """Rows whose argmax over the last axis equals the integer label."""
    if outputs.ndim < 2:
        raise BenchInputError(f"classification needs (batch, classes) outputs, got shape {outputs.shape}")
    return int(np.sum(np.argmax(outputs, axis=-1) == labels.reshape(-1)))


def squared_error_sum(outputs: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """Sum of squared errors in float64 and the element count (MSE = sum / count)."""
    if outputs.size != targets.size:
        raise BenchInputError(f"targets of shape {targets.shape} do not match outputs {outputs.shape}")
    diff = outputs.astype(np.float64).reshape(-1) - targets.astype(np.float64).reshape(-1)
    return float(diff @ diff), int(diff.size)


def agreement_count(outputs: np.ndarray, reference: np.ndarray) -> int | None:
    """Rows whose argmax equals the reference's argmax; None if there are fewer than two classes, or if the output
    is not ``(batch, classes)``: a segmentation map ``(N, C, H, W)`` or a sequence's ``(N, T, D)`` has no one class
    axis a row could agree on (the argmax over the last axis counted each row W or T times, an agreement above 1)."""
    if outputs.ndim != 2 or outputs.shape[-1] < 2:
        return None
    return int(np.sum(np.argmax(outputs, axis=-1) == np.argmax(reference, axis=-1)))


DIFF_CHUNK = 1 << 22
"""Elements compared at a time by :func:`max_abs_diff`: its float64 temporaries are 32 MiB each, not three times the
output in float64 (a segmentation model's evaluation step of 20 rows at 21×520×520 is 114 M elements: 2.7 GB)."""


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute elementwise difference (float64), over :data:`DIFF_CHUNK` elements at a time (the same figure
    as over the whole output at once, a NaN included)."""
    if outputs.shape != reference.shape:
        raise BenchInputError(f"output shape {outputs.shape} differs from the first model's {reference.shape}")
    got, want = outputs.reshape(-1), reference.reshape(-1)
    parts = [np.max(np.abs(got[i : i + DIFF_CHUNK].astype(np.float64) - want[i : i + DIFF_CHUNK].astype(np.float64)))
             for i in range(0, got.size, DIFF_CHUNK)]
    return float(np.max(np.array(parts, dtype=np.float64), initial=0.0))


@dataclass
class _Running:
    """Running sums of one model's metrics over batches."""

    samples: int = 0
    correct: int = 0
    sq_error: float = 0.0
    elements: int = 0
    agree: int | None = 0
    max_diff: float = 0.0

    def update(self, out: np.ndarray, ref: np.ndarray, y: np.ndarray | None) -> None:
        self.samples += len(out)
        if y is not None and is_classification(y):
            self.correct += correct_count(out, y)
        elif y is not None:
            sq, n = squared_error_sum(out, y)
            self.sq_error += sq
            self.elements += n
        agree = agreement_count(out, ref)
        self.agree = None if agree is None or self.agree is None else self.agree + agree
        self.max_diff = max(self.max_diff, max_abs_diff(out, ref))

    def result(self, model: str, y: np.ndarray | None) -> ModelMetrics:
        classify = y is not None and is_classification(y)
        return ModelMetrics(
            model=model,
            samples=self.samples,
            accuracy=self.correct / self.samples if classify else None,
            mse=self.sq_error / self.elements if y is not None and not classify else None,
            top1_agreement=None if self.agree is None else self.agree / self.samples,
            max_abs_diff=self.max_diff,
        )


@dataclass
class _KeptReferences:
    """Reference outputs kept on disk for the :func:`evaluate_models` calls of one :func:`reference_outputs_kept`
    block: the model files whose outputs are kept (resolved paths), and key → folder of ``{batch}.npy`` files."""

    root: Path
    paths: set[str] = field(default_factory=set)
    folders: dict[tuple, Path] = field(default_factory=dict)


_KEPT: ContextVar[_KeptReferences | None] = ContextVar("minreal_kept_references", default=None)


@contextmanager
def reference_outputs_kept(*models: str | Path) -> Iterator[None]:
    """Within this block, :func:`evaluate_models` runs each of ``models`` (model files: the references its callers
    compare against) once per evaluation set: when a call's first model is one of them (by path), its outputs are
    kept on disk (a temporary folder, removed when the block ends) under its bytes (its files' digest) and read back
    by later calls whose first model is one of them with those bytes, on the same data (a digest of its bytes), with
    the same evaluation step and threads. The metrics are the same as running it again: the same session options on
    the same batches give the same outputs. Only the named files' outputs are kept (a segmentation model's are
    gigabytes); data holding Python objects is never keyed (its bytes are pointers). A block inside another adds its
    files to the outer one's and shares its outputs. The block is a context variable's: it covers the calls of this
    thread (and of the tasks that copy its context), not those of other threads or processes."""
    outer = _KEPT.get()
    if outer is not None:
        outer.paths.update(str(Path(m).resolve()) for m in models)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="minreal-reference-") as root:
        token = _KEPT.set(_KeptReferences(Path(root), {str(Path(m).resolve()) for m in models}))
        try:
            yield
        finally:
            _KEPT.reset(token)


def _reference_key(path: Path, x: Data, step: int, threads: int) -> tuple | None:
    """The key of a reference's outputs; ``None`` (not kept) for data holding Python objects (no digest)."""
    digest = data_digest(x)
    return None if digest is None else (files_sha256(path), digest, step, threads)


def evaluate_models(
    names: Sequence[str],
    paths: Sequence[Path],
    x: Data,
    y: np.ndarray | None,
    batch_size: int,
    threads: int,
) -> list[ModelMetrics]:
    """Run every model on ``x`` batch by batch on CPU and accumulate metrics against ``y``.

    ``x`` is one array (single-input models) or arrays keyed by graph input name, used as given (symbolic
    axes at their full length). The first model is the reference for agreement. Models with a fixed batch
    dimension use it. Inside :func:`reference_outputs_kept`, the first model's outputs of an earlier call on the
    same data are read back instead of running it again (where the block names that model).

    One session is open at a time, without onnxruntime's memory arena, each model running every batch before the
    next model's session is created: an arena keeps the memory of its largest batch (rounded up to a power of two)
    until the session closes, so the models' sessions open together held that memory once per model
    (``efficientnet_b3`` at 3×300×300, its fp32 and INT8 files before and after compression, batches of 62: 7.4 GB
    resident; one session at a time without the arena: 1.8 GB). The first model's outputs wait for the others in a
    temporary folder, batch by batch; every model sees the same batches in the same kernels as before, so the
    metrics are the same.
    """
    rows = data_rows(x)
    if y is not None and len(y) != rows:
        raise BenchInputError(f"x has {rows} rows but y has {len(y)}")
    specs = [input_specs(Path(p)) for p in paths]
    fixed = {s.fixed_batch() for spec in specs for s in spec} - {None}
    step = fixed.pop() if len(fixed) == 1 else eval_step(batch_size, x)
    for name, spec in zip(names, specs):
        check_batch(spec, step, name)
    starts = range(0, rows, step)
    kept_refs = _KEPT.get()
    if kept_refs is not None and str(Path(paths[0]).resolve()) not in kept_refs.paths:
        kept_refs = None
    key = None if kept_refs is None else _reference_key(Path(paths[0]), x, step, threads)
    if key is None:
        kept_refs = None
    keep = len(paths) > 1 or kept_refs is not None  # the first model's outputs are read again (alone: by nobody)
    with tempfile.TemporaryDirectory(prefix="minreal-eval-") as folder:
        kept = Path(folder)
        results = []
        if kept_refs is not None and key in kept_refs.folders:  # the reference ran before on this data: read back
            kept = kept_refs.folders[key]
            running = _Running()
            for k, start in enumerate(starts):
                out = np.load(kept / f"{k}.npy")
                running.update(out, out, None if y is None else y[start : start + step])
            results.append(running.result(names[0], y))
        elif kept_refs is not None:
            kept = Path(tempfile.mkdtemp(dir=kept_refs.root))  # a call that failed half-way left its own
        for index, (name, path, spec) in enumerate(zip(names, paths, specs)):
            if index < len(results):
                continue
            session = create_session(Path(path), provider_name("cpu"), threads, arena=False)
            running = _Running()
            for k, start in enumerate(starts):
                out = _run_padded(session, spec, take_rows(x, start, start + step), step, name)
                if index > 0:
                    ref = np.load(kept / f"{k}.npy")
                else:
                    ref = _keep(kept, k, out) if keep else out
                if out.shape != ref.shape:
                    raise BenchInputError(f"model {name!r} output shape {out.shape} differs from {names[0]!r} "
                                          f"{ref.shape}")
                running.update(out, ref, None if y is None else y[start : start + step])
            del session  # its memory goes before the next model's session is created
            results.append(running.result(name, y))
            if index == 0 and kept_refs is not None:  # every batch written: later calls may read them
                kept_refs.folders[key] = kept
    return results


def _keep(folder: Path, k: int, out: np.ndarray) -> np.ndarray:
    """Write the reference's outputs of batch ``k`` to ``folder`` for the models after it; return them."""
    np.save(folder / f"{k}.npy", out)
    return out


EVAL_STEP_BYTES = 64 << 20
"""Input bytes one evaluation step feeds every model at most: a row of a video model (3×16×224×224 floats, 9.2 MiB)
at the default 64 rows made each session's arena grow by gigabytes (s3d: four sessions, 23 GiB)."""


def eval_step(batch_size: int, x: Data) -> int:
    """Rows per evaluation step: ``batch_size``, fewer where one row's inputs are large (at most
    :data:`EVAL_STEP_BYTES` of input per step, one row at least)."""
    arrays = [np.asarray(v) for v in x.values()] if isinstance(x, Mapping) else [np.asarray(x)]
    row = sum(a.nbytes // max(len(a), 1) for a in arrays)
    return max(1, min(batch_size, EVAL_STEP_BYTES // max(row, 1)))


def _run_padded(session, specs: list[InputSpec], rows: Data, step: int, name: str) -> np.ndarray:
    """First output for ``rows``; a short last batch is padded for fixed-batch models, then cut."""
    feeds = batch_inputs(specs, rows, name)
    n = data_rows(rows)
    if n < step and any(s.fixed_batch() is not None for s in specs):
        feeds = {k: np.concatenate([v, np.repeat(v[-1:], step - n, axis=0)]) for k, v in feeds.items()}
    return session.run(None, feeds)[0][:n]
