"""Calibration data for static INT8 and the activation ranges ONNX Runtime measures on it.

Calibration runs once per :func:`~minreal.export.int8.quantize.quantize_int8` call (its later rounds, which leave more
nodes in float, reuse the ranges), or once for many calls: :func:`calibrate` measures the ranges, which do not depend
on the nodes left in float, and ``quantize_int8(..., calibration=...)`` quantises with them (ORT's calibration cache),
giving the same file.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import tempfile
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from minreal.export.errors import CalibrationError, QuantizationError
from minreal.export.int8.config import CALIBRATION_METHODS, QuantConfig, aligns
from minreal.export.int8.preprocess import (
    file_sha256,
    int8_skip_reason,
    ort_quantization,
    preprocess,
    preprocessed_kept,
)
from minreal.facts import error_line
from minreal.runtime_bench.inputs import data_digest

__all__ = ["CALIBRATION_BATCH_ELEMENTS", "Calib", "Calibration", "ArrayCalibrationReader", "RangeSource",
           "calibration_array", "calibration_batch", "calibration_calls", "calibration_reader",
           "calibration_session", "calibration_digest", "file_reader",
           "reusable_calibration", "require_reusable", "check_calibration", "range_source", "calibrate",
           "calibrations_kept"]

logger = logging.getLogger(__name__)


Calib = np.ndarray | Mapping[str, np.ndarray]
"""Calibration inputs: one array for a one-input graph, or arrays by graph input name (same row count)."""


@dataclass(frozen=True)
class Calibration:
    """Activation ranges ONNX Runtime's calibrator measured on one model (:func:`calibrate`), for static
    :func:`quantize_int8` to use instead of calibrating again.

    Attributes
    ----------
    ranges : Any
        ``onnxruntime.quantization.TensorsData``: tensor name → calibrated range (and histogram).
    samples : int
        calibration samples the ranges come from.
    random : bool
        the samples were random (``QuantConfig.allow_random_calibration``).
    method : str
        ``QuantConfig.calibration_method`` used.
    graph_sha256 : str
        SHA-256 of the pre-processed graph calibrated, to refuse the ranges for another model.
    data_digest : str
        digest of the calibration data as the calibrator read it (:meth:`ArrayCalibrationReader.digest`).
    """

    ranges: Any
    samples: int
    random: bool
    method: str
    graph_sha256: str
    data_digest: str = ""


class ArrayCalibrationReader:
    """Feed arrays (by graph input name) to ONNX Runtime's calibrator in batches along axis 0 (an
    ``onnxruntime.quantization.CalibrationDataReader`` by its ``get_next``; ONNX Runtime checks no more)."""

    def __init__(self, data: Mapping[str, np.ndarray], batch_size: int, full_batches: bool = False) -> None:
        """Batches of ``batch_size``; with ``full_batches`` (a static batch axis) a short final batch is completed
        with the first rows again, so that every row is seen (repeating rows moves no min/max range; a histogram
        method, entropy or percentile, counts those few rows twice)."""
        self.data = dict(data)
        self.rows = len(next(iter(self.data.values())))
        self.batch_size = batch_size
        self.full_batches = full_batches
        self._start = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        """Return the next batch as ``{input_name: array}``, or ``None`` when exhausted."""
        if self._start >= self.rows:
            return None
        start, end = self._start, self._start + self.batch_size
        self._start = end
        if end <= self.rows or not self.full_batches:  # a slice: no copy
            return {n: a[start:end] for n, a in self.data.items()}
        rows = np.arange(start, end) % self.rows  # completed with the first rows again
        return {n: a[rows] for n, a in self.data.items()}

    def rewind(self) -> None:
        """Start again from the first batch."""
        self._start = 0

    def digest(self) -> str:
        """A digest of the rows this reader feeds, in its order (:func:`minreal.runtime_bench.inputs.data_digest`):
        which data the ranges come from, not only how many rows (:attr:`QuantResult.calibration_digest`); ``""`` for
        rows holding Python objects (strings), which have none."""
        return data_digest(self.data) or ""

    def __iter__(self) -> ArrayCalibrationReader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch


Spec = tuple[str, list[int | None], np.dtype]


def _input_specs(model: onnx.ModelProto) -> list[Spec]:
    """Every graph input's name, shape (``None`` for symbolic dims) and numpy dtype."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in (i for i in model.graph.input if i.name not in initializers):
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        specs.append((value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    return specs


def _random_calibration(spec: Spec, config: QuantConfig) -> np.ndarray:
    """Standard-normal calibration data for a float input whose only symbolic dim is the batch."""
    name, shape, dtype = spec
    if np.dtype(dtype).kind != "f":
        raise CalibrationError(f"input {name!r} is {np.dtype(dtype)}: random values would be out of range (token "
                               "ids, masks); give calibration data")
    if any(d is None for d in shape[1:]):
        raise CalibrationError(f"input {name!r} has symbolic dims {shape}; random calibration needs static ones")
    samples = max(config.random_samples, shape[0] or 0)
    return np.random.default_rng(config.seed).standard_normal((samples, *shape[1:])).astype(dtype)


def _by_name(calib: Calib, specs: list[Spec]) -> dict[str, np.ndarray]:
    """Calibration arrays keyed by input name (one array feeds a one-input graph)."""
    names = [n for n, _, _ in specs]
    if not isinstance(calib, Mapping):
        if len(specs) != 1:
            raise CalibrationError(f"the graph has inputs {names}; give calibration data by input name")
        return {names[0]: np.asarray(calib)}
    if sorted(calib) != sorted(names):
        raise CalibrationError(f"calibration data names inputs {sorted(calib)} but the graph's are {names}")
    rows = {n: len(calib[n]) for n in names}
    if len(set(rows.values())) > 1:
        raise CalibrationError(f"calibration inputs have different sample counts {rows}")
    return {n: np.asarray(calib[n]) for n in names}


def calibration_array(
    calib: Calib | None, model: onnx.ModelProto, config: QuantConfig
) -> tuple[dict[str, np.ndarray], bool]:
    """Check (or, if allowed, generate) calibration data; return it cast to the inputs' dtypes and a random flag."""
    specs = _input_specs(model)
    if calib is None:
        if not config.allow_random_calibration:
            raise CalibrationError(
                "static INT8 quantisation needs calibration data (a few hundred representative inputs); "
                "pass calib=array or set QuantConfig(allow_random_calibration=True) to accept random data"
            )
        logger.warning("calibrating %s on random data: INT8 ranges will not match real inputs",
                       ", ".join(repr(n) for n, _, _ in specs))
        return {spec[0]: _random_calibration(spec, config) for spec in specs}, True
    arrays = _by_name(calib, specs)
    for name, shape, _ in specs:
        a = arrays[name]
        fits = a.ndim == len(shape) and all(d is None or d == c for d, c in zip(shape[1:], a.shape[1:]))
        if not fits or len(a) == 0:
            raise CalibrationError(f"calibration data of shape {a.shape} does not fit input {name!r} of shape {shape}")
    return {name: arrays[name].astype(dtype, copy=False) for name, _, dtype in specs}, False


CALIBRATION_BATCH_ELEMENTS = 16 * 3 * 224 * 224
"""Most input elements in one batch of a min/max calibration (16 images of 3×224×224). ONNX Runtime's calibration
session holds one batch's activations, which grow with the input: ``lraspp_mobilenet_v3_large`` at 3×520×520 (32
samples) peaked at 11.0 GB resident in batches of 16 and at 2.1 GB in batches of 2, writing the same file (both in
ONNX Runtime's default node order, which kept every activation of a batch to its end; :func:`calibration_session`
frees each after its reduction). Larger inputs are calibrated in smaller batches, down to one sample; the ranges
(minima and maxima over every batch) do not depend on the split."""


def calibration_batch(data: Mapping[str, np.ndarray], config: QuantConfig) -> int:
    """The batch size of a calibration on ``data`` with a dynamic batch axis: ``config.batch_size``, lowered for a
    min/max calibration so that a batch holds at most :data:`CALIBRATION_BATCH_ELEMENTS` input elements. The
    histogram methods (entropy, percentile) are left at ``config.batch_size``: they are called one batch at a time
    (:func:`calibration_calls`), so their memory is one batch's tensors, and a smaller batch would move the grid of
    their histograms."""
    if config.calibration_method != "minmax":
        return config.batch_size
    return max(1, min(config.batch_size, CALIBRATION_BATCH_ELEMENTS // max(_sample_elements(data), 1)))


def _sample_elements(data: Mapping[str, np.ndarray]) -> int:
    """Input elements of one calibration sample, over every input."""
    return sum(int(np.prod(a.shape[1:])) for a in data.values())


def calibration_reader(model: onnx.ModelProto, data: Mapping[str, np.ndarray],
                       config: QuantConfig) -> ArrayCalibrationReader:
    """Calibration reader; a static batch axis fixes the batch size (and completes a short last batch with the first
    rows), a dynamic one takes :func:`calibration_batch`."""
    name, shape, _ = _input_specs(model)[0]
    rows = len(next(iter(data.values())))
    if shape[0] is not None and rows < shape[0]:
        raise CalibrationError(f"{rows} calibration samples < static batch {shape[0]} of input {name!r}")
    batch = shape[0] or calibration_batch(data, config)
    if shape[0] is None and batch < config.batch_size:
        logger.info("calibrating in batches of %d (of %d asked): one sample has %d input elements", batch,
                    config.batch_size, _sample_elements(data))
    return ArrayCalibrationReader(data, batch, full_batches=shape[0] is not None)


def file_reader(path: Path, model: onnx.ModelProto, calib: Calib | None, config: QuantConfig
                ) -> tuple[ArrayCalibrationReader, bool]:
    """(:func:`calibration_reader` of :func:`calibration_array`, whether the data is random) for the model read from
    ``path``; a CalibrationError names the file whose inputs the data does not fit."""
    try:
        data, is_random = calibration_array(calib, model, config)
        return calibration_reader(model, data, config), is_random
    except CalibrationError as exc:
        raise CalibrationError(f"{path.name}: {exc}") from None


def calibration_digest(fp32_path: str | Path, calib: Calib | None, config: QuantConfig) -> str:
    """The digest of the rows static :func:`~minreal.export.int8.quantize_int8` of ``fp32_path`` calibrates on with
    ``calib`` and ``config`` (:meth:`ArrayCalibrationReader.digest`; with ``calib=None``, the seeded random rows
    ``config`` allows): compare with a :class:`QuantResult`'s ``calibration_digest``. ``""`` in dynamic mode, which
    calibrates nothing."""
    if config.mode != "static":
        return ""
    path = Path(fp32_path)
    return file_reader(path, onnx.load(str(path), load_external_data=False), calib, config)[0].digest()


RangeSource = Path | ArrayCalibrationReader
"""Where static quantisation takes its activation ranges from: a file of ONNX Runtime's calibration cache
(:func:`range_source`), or a reader it calibrates on (again in every quantisation)."""


def reusable_calibration() -> bool:
    """Whether this ONNX Runtime quantises with ranges calibrated before (``quantize_static``'s
    ``calibration_cache_path``; onnxruntime 1.32 has it): :func:`calibrate` needs it; without it, every static
    quantisation calibrates again (also each round of one :func:`quantize_int8`)."""
    return "calibration_cache_path" in inspect.signature(ort_quantization().quantize_static).parameters


def require_reusable() -> None:
    if not reusable_calibration():
        raise QuantizationError("reusing calibrated ranges needs onnxruntime.quantization.quantize_static's "
                                "calibration_cache_path (onnxruntime 1.32 has it); upgrade onnxruntime, or quantise "
                                "without calibration= (each quantisation then calibrates)")


def calibration_session(augmented: str | Path, providers: list[str]) -> Any:
    """The session ONNX Runtime's calibrator runs its augmented model in (``CalibraterBase.create_inference_session``:
    no graph optimisation), with the nodes in ONNX Runtime's priority-based order instead of its default one.

    The augmented model reads every calibrated tensor a second time (a ``ReduceMin`` and a ``ReduceMax`` for min/max,
    a graph output for the histogram methods). In the default order those reductions ran after the whole network,
    so every activation of a batch stayed allocated until the end: ``efficientnet_b3`` at 3×300×300 in batches of 8
    peaked at 5.8 GB resident in the calibration alone. In the priority-based order each reduction runs as soon as
    its tensor exists and the tensor is freed: 1.6 GB, and every range the same to the bit (each node computes the
    same values from the same inputs; only the order of the nodes changes)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.execution_order = onnxruntime.ExecutionOrder.PRIORITY_BASED
    return onnxruntime.InferenceSession(str(augmented), sess_options=options, providers=providers)


def calibration_calls(reader: ArrayCalibrationReader, config: QuantConfig) -> Iterator[ArrayCalibrationReader]:
    """What each ``collect_data`` call of ONNX Runtime's calibrator reads: ``reader`` whole for min/max, one batch a
    call for the histogram methods (entropy, percentile).

    Within one call ONNX Runtime keeps what every batch gives until the last batch: for min/max a ``ReduceMin`` and
    a ``ReduceMax`` value per tensor, for the histogram methods every calibrated tensor itself, so memory grew with
    the calibration set (``HistogramCalibrater.collect_data``). Across calls both merge: min/max takes the minimum
    of the minima and the maximum of the maxima (``MinMaxCalibrater.merge_range``: the same ranges whatever the
    calls), a histogram keeps the bins of the first call and extends them by whole bins for values beyond them
    (``HistogramCollector``). So a histogram called one batch at a time has the minimum and maximum of one call over
    all batches, on a grid of bins set by the first batch rather than by all of them (the thresholds computed from
    it can differ from one call's), and holds one batch's tensors at a time. Entropy's histogram (of x, over
    [-t, t]) counts every value; percentile's (of |x|, from the first batch's smallest |x|, extended upwards only)
    leaves out the later values below that smallest |x|, the values nearest zero. One batch of data gives the same
    histograms either way.
    """
    if config.calibration_method == "minmax":
        yield reader
        return
    while (batch := reader.get_next()) is not None:
        yield ArrayCalibrationReader(batch, len(next(iter(batch.values()))))


_KEPT: ContextVar[dict[tuple[object, ...], Calibration] | None] = ContextVar("minreal_kept_calibrations",
                                                                            default=None)


@contextlib.contextmanager
def calibrations_kept() -> Iterator[None]:
    """Within this block, a graph (its bytes) calibrated on the same rows (their digest, in the same batches) with the
    same method is measured once: the ranges of the first calibration are returned to the later ones (a tune's INT8
    of the original, then accuracy control's calibration of the same graph on the same rows), and ONNX Runtime's
    pre-processing of a float file runs once (:func:`~minreal.export.int8.preprocess.preprocessed_kept`). The callers
    share one ranges object: they hand it to ONNX Runtime through a file (``calibration_cache_path``), never directly
    (its quantiser adjusts the ranges it is given in place). A block inside another shares the outer one's. The block
    is a context variable's: it covers this thread's calls."""
    if _KEPT.get() is not None:
        yield
        return
    token = _KEPT.set({})
    try:
        with preprocessed_kept():  # the graph each calibration and quantisation starts from, pre-processed once
            yield
    finally:
        _KEPT.reset(token)


def _calibrated(source: Path, reader: ArrayCalibrationReader, config: QuantConfig, random: bool) -> Calibration:
    """ONNX Runtime's calibration of ``source`` on ``reader``, set up as ``quantize_static`` sets up its own: the
    calibrator of ``config.calibration_method`` over the op types its quantisers handle, no extra options. Inside
    :func:`calibrations_kept`, measured once per graph, rows (and their batches) and method."""
    kept = _KEPT.get()
    digest = "" if kept is None else reader.digest()  # rows holding Python objects have none: not kept
    if not digest:
        return _measured(source, reader, config, random)
    key = (file_sha256(source), digest, reader.batch_size, reader.full_batches, random, config.calibration_method)
    if key not in kept:
        kept[key] = _measured(source, reader, config, random)
    return kept[key]


def _measured(source: Path, reader: ArrayCalibrationReader, config: QuantConfig, random: bool) -> Calibration:
    """:func:`_calibrated`'s measurement."""
    q = ort_quantization()
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    method = getattr(q.CalibrationMethod, CALIBRATION_METHODS[config.calibration_method])
    with tempfile.TemporaryDirectory() as workdir:
        calibrator = q.create_calibrator(source, sorted({*QLinearOpsRegistry, *QDQRegistry}),
                                         augmented_model_path=str(Path(workdir) / "augmented_model.onnx"),
                                         calibrate_method=method)
        calibrator.infer_session = calibration_session(calibrator.augmented_model_path,
                                                       calibrator.execution_providers)
        reader.rewind()
        for part in calibration_calls(reader, config):
            calibrator.collect_data(part)
        ranges = calibrator.compute_data()
    return Calibration(ranges, reader.rows, random, config.calibration_method, file_sha256(source), reader.digest())


def check_calibration(calibration: Calibration, source: Path, config: QuantConfig) -> None:
    """``calibration`` was measured on the graph ``source`` with ``config``'s calibration method."""
    if calibration.method != config.calibration_method:
        raise ValueError(f"the ranges were calibrated with {calibration.method!r} but the config asks for "
                         f"{config.calibration_method!r}; calibrate with the same QuantConfig")
    if calibration.graph_sha256 != file_sha256(source):
        raise ValueError("the ranges were calibrated on another graph; calibrate this model "
                         "(minreal.export.int8.calibrate)")


def range_source(source: Path, workdir: Path, reader: ArrayCalibrationReader | None, calibration: Calibration | None,
                 config: QuantConfig, random: bool) -> RangeSource:
    """The ranges of every static quantisation of one :func:`quantize_int8`: ``calibration`` (else a calibration of
    ``source`` on ``reader``) in a cache file in ``workdir``; ``reader`` itself where ONNX Runtime reads no cache."""
    if calibration is None and not reusable_calibration():
        return reader
    calibration = calibration or _calibrated(source, reader, config, random)
    path = workdir / "ranges.json"
    ort_quantization().save_tensors_data(calibration.ranges, path)
    return path


def calibrate(fp32_path: str | Path, calib: Calib | None = None, config: QuantConfig | None = None) -> Calibration:
    """The activation ranges static :func:`quantize_int8` calibrates for ``fp32_path`` on ``calib``: pass them as its
    ``calibration`` to quantise the model many times (e.g. with different nodes left in float) calibrating once.

    Parameters
    ----------
    fp32_path : str | Path
        float model (not modified).
    calib : Calib | None
        calibration inputs, as for :func:`quantize_int8`.
    config : QuantConfig | None
        options (static mode); the quantisations must use the same ``calibration_method``.

    Raises
    ------
    CalibrationError
        no or ill-shaped calibration data.
    ValueError
        ``config`` is for dynamic mode (nothing is calibrated).
    QuantizationError
        ONNX Runtime could not calibrate the model, the model keeps its weights in external data,
        or this ONNX Runtime cannot quantise with precomputed ranges (:func:`reusable_calibration`).
    """
    config = (config or QuantConfig()).resolved()
    if config.mode != "static":
        raise ValueError("mode='dynamic' calibrates nothing; calibrate for mode='static'")
    require_reusable()
    fp32_path = Path(fp32_path)
    skip = int8_skip_reason(fp32_path)
    if skip:
        raise QuantizationError(f"cannot calibrate {fp32_path.name} for INT8: {skip}")
    model = onnx.load(str(fp32_path))
    reader, is_random = file_reader(fp32_path, model, calib, config)
    with tempfile.TemporaryDirectory() as workdir:
        source, _ = preprocess(fp32_path, Path(workdir) / "preprocessed.onnx", aligns(config))
        try:
            return _calibrated(source, reader, config, is_random)
        except Exception as exc:
            raise QuantizationError(f"calibration of {fp32_path.name} failed: {error_line(exc)}") from exc
