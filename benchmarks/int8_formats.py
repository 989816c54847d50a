"""INT8 formats of ONNX Runtime's CPU kernels: accuracy here and on an emulated AVX2-only CPU, and latency here.

ONNX Runtime's x86 kernels without VNNI add pairs of uint8 x int8 products in a saturating int16 (``VPMADDUBSW``),
so 8-bit int8 weights can clip there; a VNNI/AMX CPU accumulates in int32 and cannot (:mod:`minreal.runtime_bench.cpu`).
Each model is exported in fp32 (``minreal.export.variant.export_variant``) and quantised by
``minreal.export.int8.quantize_int8`` (static, per-channel, min-max calibration on 256 samples) into four formats:

- ``u8s8``: ``QuantConfig(target="cpu-vnni")``, uint8 activations x 8-bit int8 weights;
- ``u8s8-7bit``: ``QuantConfig(target="cpu-avx2")``, the same with ``reduce_range`` (7-bit weights, [-64, 64]);
- ``s8s8``: ``cpu-vnni`` with symmetric int8 activations;
- ``u8u8``: ``cpu-vnni`` with asymmetric uint8 weights.

Per file: top-1 accuracy (%) on held-out data and top-1 agreement with the fp32 file (%), with ONNX Runtime's CPU
provider on this machine (all held-out rows) and under ``qemu-x86_64 -cpu Haswell`` (user-mode emulation of an AVX2
CPU without AVX-512/VNNI, where ONNX Runtime dispatches its AVX2 kernels; ``benchmarks/_ort_eval.py``, numpy and
onnxruntime only) on the first ``--emulated-samples`` rows (default 256: emulation is slow, see :class:`Emulation`;
the reference there is the fp32 file's native predictions, and the fp32 file is emulated on a few rows as a check),
where each file's native accuracy on the same rows and its agreement with its own native predictions are recorded
too; and latency at batch 1 and 32 on this machine with runtime_bench's protocol (models interleaved in fresh
worker processes, warm-up discarded, one intra-op thread by default): the p50 pooled over processes, the range of
the per-process p50s, and per-process ratios to the fp32 file and to ``u8s8`` (median, min, max). Emulation gives
accuracy only: its timings mean nothing.

Models: the pretrained CIFAR-10 ResNet-32 (``../shared/data``; skipped with one line when absent) on 2,000 held-out
JPEG test images (calibration: 256 of the first 7,000, seeded), the digits CNN and the SSM of the embedded demo
(``minreal.app.demo.demo_factories``, trained here, seeded), and the BERT-style encoder of
``benchmarks/transformer.py`` (two named inputs, trained here, seeded). ``choice`` compares the saturation-free
candidates by their mean accuracy drop from fp32 over the models on the emulated AVX2 CPU, among those that keep
u8s8's speed here (within ``SPEED_TOLERANCE``); ``--rechoose`` recomputes that block from a finished run.

Writes benchmarks/int8_formats.json atomically.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_formats.py [--out PATH] [--repeats 5]
    [--min-seconds 2] [--emulated-samples 256] [--models resnet32-cifar10 digits-cnn ssm-demo bert-encoder]
    [--work DIR] [--no-emulation] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _ort_eval
import numpy as np
import torch
from _common import write_json
from torch import nn

from minreal.compress.core.inputs import Inputs, NamedInputs
from minreal.compress.models import CifarResNet
from minreal.export.errors import QuantizationError
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant
from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark
from minreal.runtime_bench.cpu import cpu_isa, u8s8_saturates
from minreal.runtime_bench.environment import cpu_model
from minreal.runtime_bench.timing import ratio_summary

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESNET32 = DATA / "resnet_cifar" / "resnet32-d509ac18.th"
CIFAR = DATA / "cifar10" / "cifar10_test_jpeg_1000_9999.npz"
EVAL_SCRIPT = Path(__file__).resolve().parent / "_ort_eval.py"
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_formats.py --out benchmarks/int8_formats.json"
QEMU, QEMU_CPU = "qemu-x86_64", "Haswell"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as the pretrained ResNets were trained
CALIB_SAMPLES, CIFAR_CALIB_POOL, CIFAR_HELDOUT, QUICK_HELDOUT = 256, 7000, 2000, 300
RESNET32_JPEG_README = 82.6  # ../shared/data/README.md: ResNet-32 on all 9,000 JPEG test images (ours: 2,000)
BATCHES = (1, 32)
FP32, REFERENCE_INT8 = "fp32", "u8s8"
CANDIDATES = ("u8s8-7bit", "s8s8", "u8u8")
FORMATS: tuple[tuple[str, QuantConfig], ...] = (
    ("u8s8", QuantConfig(target="cpu-vnni")),
    ("u8s8-7bit", QuantConfig(target="cpu-avx2")),
    ("s8s8", QuantConfig(target="cpu-vnni", activation_type="int8", activation_symmetric=True)),
    ("u8u8", QuantConfig(target="cpu-vnni", weight_type="uint8")),
)
_T0 = time.perf_counter()


def say(line: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[int8_formats {time.perf_counter() - _T0:7.1f} s] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------ models
@dataclass
class Case:
    """A trained classifier with its calibration and held-out data.

    Attributes:
        name: the key in the JSON.
        description: what the model and its data are, in words.
        model: the torch module (eval mode).
        calib: calibration inputs (batch first).
        x: held-out inputs (batch first).
        y: held-out labels.
        axes: dynamic axes besides the batch, by input name (``export_variant``'s ``dynamic_axes``).
        expected_accuracy: a published top-1 accuracy (%) of the fp32 model on this kind of data, to check against.
    """

    name: str
    description: str
    model: nn.Module
    calib: Inputs
    x: Inputs
    y: np.ndarray
    axes: dict[str, dict[int, str]]
    expected_accuracy: float | None = None


def cifar_inputs(images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC RGB images → float32 NCHW in [0, 1], normalised with the ImageNet mean and std."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def load_resnet32(path: Path) -> CifarResNet:
    """``CifarResNet(blocks_per_stage=5)`` with akamaster's weights (keys without ``module.``); every key must load
    (the file has no ``num_batches_tracked`` buffers, the only keys it may lack)."""
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    model = CifarResNet(blocks_per_stage=5)
    result = model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{path.name} does not fit CifarResNet(5): missing {missing}, "
                           f"unexpected {result.unexpected_keys}")
    return model.eval()


def cifar_case(limit: int | None) -> Case | None:
    """ResNet-32 on CIFAR-10 JPEG test images: 256 seeded calibration images of the first 7,000, the last 2,000
    held out (the first ``limit`` of them); ``None`` (and one line) when ../shared/data is absent."""
    if not (RESNET32.is_file() and CIFAR.is_file()):
        print(f"int8_formats: {RESNET32} or {CIFAR} is missing; skipping resnet32-cifar10", flush=True)
        return None
    with np.load(CIFAR) as data:
        images, labels = data["x"], data["y"]
    pick = np.sort(np.random.default_rng(0).choice(CIFAR_CALIB_POOL, CALIB_SAMPLES, replace=False))
    heldout = min(limit or CIFAR_HELDOUT, CIFAR_HELDOUT)
    held = slice(len(images) - CIFAR_HELDOUT, len(images) - CIFAR_HELDOUT + heldout)
    return Case("resnet32-cifar10",
                "pretrained CIFAR-10 ResNet-32 (akamaster, option-A shortcuts; "
                "minreal.compress.models.CifarResNet(5)) on "
                f"CIFAR-10 test images decoded from JPEG (../shared/data); calibration: {CALIB_SAMPLES} images drawn "
                f"(seed 0) from the first {CIFAR_CALIB_POOL}, held out: {heldout} of the last {CIFAR_HELDOUT}",
                load_resnet32(RESNET32), cifar_inputs(images[pick]), cifar_inputs(images[held]),
                labels[held].astype(np.int64), {}, RESNET32_JPEG_README)


def demo_case(key: str, name: str, limit: int | None) -> Case:
    """The embedded demo's case ``key`` (trained here, seeded, quick schedule): calibration on the first 256
    training samples, the test split held out (the first ``limit`` samples)."""
    from minreal.app.demo import demo_factories

    case = demo_factories()[key](True)
    heldout = min(limit or len(case.test), len(case.test))
    notes = "; ".join(case.notes)
    return Case(name, f"embedded demo case {key!r}: {type(case.model).__name__}{' — ' + notes if notes else ''}; "
                      f"{len(case.train)} training samples (calibration: the first {CALIB_SAMPLES}), held out: "
                      f"{heldout} of {len(case.test)} test samples",
                case.model.eval(), case.train.x[:CALIB_SAMPLES], case.test.x[:heldout],
                case.test.y[:heldout].numpy().astype(np.int64), case.axes())


def bert_case(limit: int | None) -> Case:
    """The BERT-style encoder of ``benchmarks/transformer.py`` trained the same way (seeded), on its keyword task;
    calibration on the first 256 training sequences, its held-out sequences (the first ``limit``)."""
    import transformer  # benchmarks/transformer.py: the same model, data and training

    heldout = min(limit or transformer.HELDOUT_SAMPLES, transformer.HELDOUT_SAMPLES)

    bert = transformer.example()
    fit = bert.keyword_task(transformer.TRAIN_SAMPLES, transformer.SEQ_LEN, seed=0)
    held = bert.keyword_task(transformer.HELDOUT_SAMPLES, transformer.SEQ_LEN, seed=1)
    model = bert.train(bert.build(), fit, epochs=transformer.TRAIN_EPOCHS)

    def inputs(task: dict[str, np.ndarray], rows: int) -> NamedInputs:
        return NamedInputs({k: torch.from_numpy(task[k][:rows]) for k in transformer.INPUTS})

    return Case("bert-encoder",
                f"examples/bert_encoder.py:build() (4 pre-LN layers, d=256, 4 heads) trained as benchmarks/"
                f"transformer.py does ({transformer.TRAIN_EPOCHS} epochs on {transformer.TRAIN_SAMPLES} keyword-task "
                f"sequences of {transformer.SEQ_LEN} tokens, seed 0); named inputs input_ids and attention_mask, "
                f"dynamic batch and sequence; calibration: the first {CALIB_SAMPLES} training sequences, held out: "
                f"{heldout} of {transformer.HELDOUT_SAMPLES} (seed 1)",
                model.eval(), inputs(fit, CALIB_SAMPLES), inputs(held, heldout), held["y"][:heldout].astype(np.int64),
                {k: {1: "seq"} for k in transformer.INPUTS})


def case_builders() -> dict[str, Callable[[int | None], Case | None]]:
    """Model name → builder of its :class:`Case` from a cap on the held-out samples (``None``: all); a builder
    returns ``None`` when its data is absent."""
    return {"resnet32-cifar10": cifar_case,
            "digits-cnn": lambda n: demo_case("digits-cnn", "digits-cnn", n),
            "ssm-demo": lambda n: demo_case("ssm", "ssm-demo", n),
            "bert-encoder": bert_case}


@dataclass(frozen=True)
class Emulation:
    """How the emulated AVX2 accuracy runs.

    Emulation is slow, the float kernels most (qemu 7.2, 2 threads, per sample: ResNet-32 about 0.15 s for a file of
    integer kernels, 3.5 s for s8s8, whose convolutions run half in float, 6 s for fp32; the BERT encoder about 4 s
    for an INT8 file and 100 s for fp32; the digits CNN and the SSM well under 0.1 s). The INT8 files run on the first
    ``samples`` held-out rows, and their reference there is the fp32 file's *native* predictions (float kernels cannot
    saturate); the fp32 file itself runs emulated on the first ``fp32_check`` rows only, to check that its emulated
    predictions are its native ones.

    Attributes:
        enabled: run it at all (``--no-emulation`` turns it off).
        samples: held-out rows (the first ones) on which the INT8 files are emulated.
        fp32_check: held-out rows (the first ones) on which the fp32 file is emulated.
        timeout_s: wall-clock limit of one emulated run.
        threads: ONNX Runtime intra-op threads under emulation.
    """

    enabled: bool
    samples: int
    fp32_check: int
    timeout_s: float
    threads: int


# ------------------------------------------------------------------------------------------------------- files
def numpy_inputs(inputs: Inputs) -> np.ndarray | dict[str, np.ndarray]:
    """A tensor as one array, named inputs as arrays by name (``quantize_int8``'s calibration data)."""
    return inputs.numpy() if isinstance(inputs, NamedInputs) else inputs.detach().cpu().numpy()


def feeds_of(inputs: Inputs, path: Path) -> dict[str, np.ndarray]:
    """Arrays by graph input name of the ONNX file ``path`` (one tensor feeds its only input)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    names = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    arrays = numpy_inputs(inputs)
    return dict(arrays) if isinstance(arrays, dict) else {names[0]: arrays}


def quant_record(result: Any, seconds: float) -> dict[str, Any]:
    """The facts of a ``QuantResult`` that the JSON keeps."""
    return {"target": result.target, "activation_type": result.activation_type,
            "activation_symmetric": result.activation_symmetric, "weight_type": result.weight_type,
            "weight_bits": result.weight_bits, "integer_kernels": result.integer_kernels,
            "float_kernels": result.float_kernels, "saturates_here": result.saturates_here,
            "can_saturate_without_vnni": result.weight_type == "int8" and result.weight_bits == 8,
            "excluded_nodes": list(result.excluded_nodes), "size_bytes": result.size_int8_bytes,
            "quantize_s": round(seconds, 1)}


def quantize_formats(case: Case, fp32: Path) -> tuple[dict[str, Path], dict[str, dict[str, Any]]]:
    """Every format of :data:`FORMATS` written beside ``fp32``: the files that were written, and per format its
    record (or the error that stopped it)."""
    paths, records, calib = {}, {}, numpy_inputs(case.calib)
    for name, config in FORMATS:
        out, t0 = fp32.with_name(f"{name}.onnx"), time.perf_counter()
        try:
            result = quantize_int8(fp32, out, calib, config)
        except QuantizationError as exc:
            say(f"{case.name}: {name} failed to quantise: {exc}")
            records[name] = {"error": str(exc)}
            continue
        paths[name], records[name] = out, quant_record(result, time.perf_counter() - t0)
        say(f"{case.name}: {name} written ({result.integer_kernels} integer, {result.float_kernels} float kernels)")
    return paths, records


def write_files(case: Case, folder: Path) -> tuple[dict[str, Path], dict[str, dict[str, Any]]]:
    """Export the fp32 file (verified against torch) and quantise it: paths by format (fp32 first) and records."""
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / f"{FP32}.onnx"
    export_variant(case.model, case.x, fp32, VariantConfig(), "original", dynamic_axes=case.axes or None)
    say(f"{case.name}: exported {fp32}")
    paths, records = quantize_formats(case, fp32)
    fp32_record = {"target": FP32, "weight_bits": 32, "integer_kernels": 0, "size_bytes": fp32.stat().st_size}
    return {FP32: fp32, **paths}, {FP32: fp32_record, **records}


# ---------------------------------------------------------------------------------------------------- accuracy
def agreement(pred: Sequence[int], reference: Sequence[int]) -> float:
    """Share of rows (%) whose top-1 class equals the reference's (other predictions; or the labels: accuracy)."""
    return round(100 * float(np.mean(np.asarray(pred) == np.asarray(reference))), 2)


def qemu_command() -> list[str] | None:
    """``qemu-x86_64 -cpu Haswell`` with this interpreter, or ``None`` when qemu-x86_64 is not installed."""
    binary = shutil.which(QEMU)
    return None if binary is None else [binary, "-cpu", QEMU_CPU, sys.executable]


def run_emulated(args: Sequence[str], timeout_s: float) -> str:
    """Run this interpreter with ``args`` under :func:`qemu_command` from the repository root; its stdout.

    Raises:
        RuntimeError: the run failed (the last lines of its stderr, without qemu's CPUID-feature warnings).
    """
    command = qemu_command()
    if command is None:
        raise RuntimeError(f"{QEMU} is not installed")
    done = subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "TCG doesn't support" not in line]
        status = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited with {done.returncode}"
        raise RuntimeError(f"{QEMU} -cpu {QEMU_CPU} {status}: " + (" | ".join(lines[-5:]) or "no error output"))
    return done.stdout


def emulated_predictions(paths: Mapping[str, Path], inputs: Path, emulation: Emulation) -> dict[str, dict[str, Any]]:
    """:mod:`_ort_eval` under emulation on every file of ``paths`` with the inputs file ``inputs``: per format,
    predictions, accuracy and seconds."""
    out = inputs.with_suffix(".emulated.json")
    run_emulated([str(EVAL_SCRIPT), "--inputs", str(inputs), "--models", *map(str, paths.values()),
                  "--threads", str(emulation.threads), "--out", str(out)], emulation.timeout_s)
    results = json.loads(out.read_text())["models"]
    return {name: results[str(path)] for name, path in paths.items()}


def accuracy_rows(native: Mapping[str, dict[str, Any]], emulated: Mapping[str, dict[str, Any]] | None,
                  y: np.ndarray, rows: int) -> dict[str, dict[str, Any]]:
    """Per format: accuracy (%) and agreement with the fp32 file (%) natively; with ``emulated`` (INT8 files on the
    first ``rows`` held-out rows), the same there against the fp32 file's native predictions, every file's native
    accuracy on those rows, and each INT8 file's agreement with its own native predictions."""
    reference = native[FP32]["predictions"]
    out = {}
    for name, own in native.items():
        row = {"accuracy_native": own["accuracy"], "agreement_native": agreement(own["predictions"], reference),
               "accuracy_emulated_avx2": None, "agreement_emulated_avx2": None}
        if emulated is not None:
            row["accuracy_native_on_emulated_rows"] = agreement(own["predictions"][:rows], y[:rows])
        if emulated is not None and name in emulated:
            emu = emulated[name]["predictions"]
            row.update(accuracy_emulated_avx2=emulated[name]["accuracy"],
                       agreement_emulated_avx2=agreement(emu, reference[:rows]),
                       emulated_vs_native_agreement=agreement(emu, own["predictions"][:rows]))
        out[name] = row
    return out


# ----------------------------------------------------------------------------------------------------- latency
def _ratio(model: Sequence[float], reference: Sequence[float]) -> dict[str, float]:
    s = ratio_summary(model, reference)
    return {"median": round(s.median, 3), "min": round(s.min, 3), "max": round(s.max, 3)}


def latency_rows(paths: Mapping[str, Path], feeds: Mapping[str, np.ndarray],
                 config: BenchConfig) -> dict[str, dict[str, Any]]:
    """Time every file with runtime_bench (fresh processes, interleaved): per format and batch size the pooled p50,
    the per-process p50s and their range, and per-process ratios to the fp32 file and to u8s8."""
    timing = {k: v[:max(256, max(config.batch_sizes))] for k, v in feeds.items()}
    report = run_benchmark([ModelEntry(name, path) for name, path in paths.items()], config, timing, progress=say)
    procs = {(r.model, r.batch_size): list(r.process_p50_ms) for r in report.latency if r.provider == "cpu"}
    pooled = {(r.model, r.batch_size): r.stats.p50_ms for r in report.latency if r.provider == "cpu"}
    rows: dict[str, dict[str, Any]] = {}
    for name in paths:
        ms, ratios = {}, {}
        for b in config.batch_sizes:
            own = procs[(name, b)]
            ms[str(b)] = {"p50": round(pooled[(name, b)], 4), "process_p50_min": round(min(own), 4),
                          "process_p50_max": round(max(own), 4), "process_p50": [round(p, 4) for p in own]}
            ratios[str(b)] = {f"vs_{ref}": _ratio(own, procs[(ref, b)]) for ref in (FP32, REFERENCE_INT8)
                              if (ref, b) in procs}
        rows[name] = {"latency_ms": ms, "latency_ratio": ratios}
    return rows


# ----------------------------------------------------------------------------------------------------- a model
def _accuracies(results: Mapping[str, dict[str, Any]]) -> str:
    return ", ".join(f"{name} {r['accuracy']}" for name, r in results.items())


def emulated_inputs(feeds: Mapping[str, np.ndarray], y: np.ndarray, rows: int, path: Path) -> Path:
    """Write the first ``rows`` of ``feeds`` and ``y`` as an inputs file of :mod:`_ort_eval`; its path."""
    np.savez(path, **{k: v[:rows] for k, v in feeds.items()}, **{_ort_eval.LABELS: y[:rows]})
    return path


def emulate_files(paths: Mapping[str, Path], feeds: Mapping[str, np.ndarray], y: np.ndarray, folder: Path,
                  emulation: Emulation) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The INT8 files of ``paths`` emulated on the first ``emulation.samples`` rows, and the fp32 file on the first
    ``emulation.fp32_check`` rows (:func:`emulated_predictions` of each)."""
    rows, check = min(emulation.samples, len(y)), min(emulation.fp32_check, len(y))
    int8 = {k: v for k, v in paths.items() if k != FP32}
    emulated = emulated_predictions(int8, emulated_inputs(feeds, y, rows, folder / "emulated.npz"), emulation)
    fp32_inputs = emulated_inputs(feeds, y, check, folder / "fp32_check.npz")
    return emulated, emulated_predictions({FP32: paths[FP32]}, fp32_inputs, emulation)[FP32]


def emulate_case(case: Case, paths: Mapping[str, Path], feeds: Mapping[str, np.ndarray], folder: Path,
                 emulation: Emulation, native_fp32: Sequence[int]) -> tuple[dict[str, dict[str, Any]] | None,
                                                                          dict[str, Any]]:
    """:func:`emulate_files` (``None`` when it cannot run) and what the emulation took, with the fp32 check
    (:class:`Emulation`), or why it did not run."""
    if not emulation.enabled or qemu_command() is None:
        return None, {"ran": False, "reason": "--no-emulation" if not emulation.enabled else f"{QEMU} is not installed"}
    if len(paths) == 1:
        return None, {"ran": False, "reason": "no INT8 file was written"}
    say(f"{case.name}: emulating {QEMU} -cpu {QEMU_CPU}: INT8 files on {min(emulation.samples, len(case.y))} rows, "
        f"fp32 on {min(emulation.fp32_check, len(case.y))}")
    t0 = time.perf_counter()
    try:
        emulated, fp32 = emulate_files(paths, feeds, case.y, folder, emulation)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        say(f"{case.name}: emulation failed: {exc}")
        return None, {"ran": False, "reason": str(exc)}
    say(f"{case.name}: emulated AVX2 accuracy {_accuracies(emulated)}")
    check = len(fp32["predictions"])
    return emulated, {"ran": True, "rows": len(next(iter(emulated.values()))["predictions"]),
                      "threads": emulation.threads, "reference": "the fp32 file's native predictions on these rows",
                      "fp32_check": {"rows": check, "accuracy_emulated": fp32["accuracy"],
                                     "agreement_with_native": agreement(fp32["predictions"], native_fp32[:check])},
                      "seconds": round(time.perf_counter() - t0, 1),
                      "seconds_per_file": {**{k: v["seconds"] for k, v in emulated.items()}, FP32: fp32["seconds"]}}


def evaluate_case(case: Case, paths: Mapping[str, Path], folder: Path,
                  emulation: Emulation) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Accuracy rows of every file (natively on all held-out rows, then emulated on the first of them) and what
    the emulation took (or why it did not run)."""
    feeds = feeds_of(case.x, paths[FP32])
    native = _ort_eval.evaluate(list(map(str, paths.values())), feeds, case.y)
    native = {name: native[str(path)] for name, path in paths.items()}
    say(f"{case.name}: native accuracy {_accuracies(native)}")
    emulated, info = emulate_case(case, paths, feeds, folder, emulation, native[FP32]["predictions"])
    return accuracy_rows(native, emulated, case.y, info.get("rows", 0)), info


def run_case(case: Case, folder: Path, config: BenchConfig, emulation: Emulation) -> dict[str, Any]:
    """Everything measured for one model: its files' formats, accuracy (native and emulated) and latency."""
    paths, records = write_files(case, folder)
    accuracy, emulated = evaluate_case(case, paths, folder, emulation)
    say(f"{case.name}: timing {len(paths)} files at batch {', '.join(map(str, config.batch_sizes))}")
    latency = latency_rows(paths, feeds_of(case.x, paths[FP32]), config)
    formats = {name: {**record, **accuracy.get(name, {}), **latency.get(name, {})} for name, record in records.items()}
    return {"description": case.description, "heldout_samples": len(case.y),
            "fp32_accuracy": accuracy[FP32]["accuracy_native"], **expected(case, accuracy[FP32]["accuracy_native"]),
            "emulation": emulated, "formats": formats}


def expected(case: Case, fp32_accuracy: float, tolerance: float = 3.0) -> dict[str, Any]:
    """The published accuracy to compare with, if any, and whether the measured one is within ``tolerance`` points
    of it (a progress line says when it is not)."""
    if case.expected_accuracy is None:
        return {}
    close = abs(fp32_accuracy - case.expected_accuracy) <= tolerance
    if not close:
        say(f"{case.name}: fp32 accuracy {fp32_accuracy} % is not within {tolerance} points of the published "
            f"{case.expected_accuracy} %")
    return {"fp32_accuracy_published": case.expected_accuracy, f"fp32_within_{tolerance:g}_points": close}


# ------------------------------------------------------------------------------------------------------ choice
def _measured(model: dict[str, Any], reference: str, key: str) -> bool:
    """Whether the fp32 row has ``reference`` and every compared INT8 format has ``key``."""
    rows = model["formats"]
    return rows[FP32].get(reference) is not None and all(
        rows.get(fmt, {}).get(key) is not None for fmt in (REFERENCE_INT8, *CANDIDATES))


def mean_drops(models: Mapping[str, dict[str, Any]], reference: str, key: str) -> dict[str, dict[str, Any]]:
    """Per INT8 format, its top-1 accuracy drop (points) from the fp32 file per model — the fp32 row's ``reference``
    accuracy minus the format's ``key`` accuracy, on the same rows — and its mean over the models on which every
    compared format was measured (so that the means compare)."""
    common = [name for name, m in models.items() if _measured(m, reference, key)]
    out = {}
    for fmt in (REFERENCE_INT8, *CANDIDATES):
        per = {name: round(models[name]["formats"][FP32][reference] - models[name]["formats"][fmt][key], 2)
               for name in common}
        out[fmt] = {"mean_drop": round(statistics.mean(per.values()), 3) if per else None, "per_model": per}
    return out


def median_ratios(models: Mapping[str, dict[str, Any]], batches: Sequence[int]) -> dict[str, dict[str, float]]:
    """Per candidate and batch size, the median over models of its latency ratio to u8s8 (each the median over
    processes)."""
    out: dict[str, dict[str, float]] = {}
    for fmt in CANDIDATES:
        for b in map(str, batches):
            values = [m["formats"][fmt]["latency_ratio"][b]["vs_u8s8"]["median"] for m in models.values()
                      if "vs_u8s8" in m["formats"].get(fmt, {}).get("latency_ratio", {}).get(b, {})]
            if values:
                out.setdefault(fmt, {})[b] = round(statistics.median(values), 3)
    return out


SPEED_TOLERANCE = 1.10
"""A candidate slower than u8s8 by more than this factor at any batch size here loses what INT8 is for: it can be
the default only if no candidate keeps the speed."""


def keeps_speed(fmt: str, ratios: Mapping[str, dict[str, float]]) -> bool:
    """Whether ``fmt`` runs within :data:`SPEED_TOLERANCE` of u8s8's latency at every batch size measured here."""
    return bool(ratios.get(fmt)) and all(r <= SPEED_TOLERANCE for r in ratios[fmt].values())


def ranking(drops: Mapping[str, dict[str, Any]], ratios: Mapping[str, dict[str, float]]) -> list[str]:
    """The candidates with a measured mean drop: those that keep u8s8's speed (:func:`keeps_speed`) first, each
    group least drop first; equal drops by their latency ratio to u8s8 at the largest batch size (the faster
    first)."""
    def key(fmt: str) -> tuple[bool, float, float]:
        latency = ratios.get(fmt, {})
        return (not keeps_speed(fmt, ratios), drops[fmt]["mean_drop"],
                latency[max(latency, key=int)] if latency else float("inf"))

    return sorted((fmt for fmt in CANDIDATES if drops[fmt]["mean_drop"] is not None), key=key)


def verdict(drops: Mapping[str, dict[str, Any]], native: Mapping[str, dict[str, Any]],
            ratios: Mapping[str, dict[str, float]], here: str) -> str:
    """The plain-words conclusion from the emulated and native drops and the native latency ratios."""
    ranked = ranking(drops, ratios)
    if not ranked:
        return "no emulated AVX2 accuracy was measured, so no choice for a saturating CPU can be made from this run"
    best, drop = ranked[0], drops[ranked[0]]["mean_drop"]
    tied = [fmt for fmt in ranked[1:] if drops[fmt]["mean_drop"] == drop]
    others = ", ".join(f"{fmt} {drops[fmt]['mean_drop']:+.2f}" for fmt in ranked[1:])
    speed = " / ".join(f"{r:.2f}x" for r in ratios.get(best, {}).values())
    slow = [fmt for fmt in ranked if not keeps_speed(fmt, ratios)]
    text = (f"On the emulated AVX2-only CPU (where 8-bit u8s8 weights can saturate), {best} is the choice: of the "
            f"alternatives that keep u8s8's speed here (within {SPEED_TOLERANCE:.2f}x; slower: "
            f"{', '.join(slow) or 'none'}) it keeps accuracy best, mean top-1 drop from fp32 {drop:+.2f} points over "
            f"{len(drops[best]['per_model'])} model(s) (all: {others}; u8s8 itself "
            f"{drops[REFERENCE_INT8]['mean_drop']:+.2f})")
    if tied:
        text += f"; tied on accuracy with {', '.join(tied)}, it is taken as the faster here at the largest batch"
    text += (f". Here ({here}) its mean drop is {native[best]['mean_drop']:+.2f} "
             f"(u8s8 {native[REFERENCE_INT8]['mean_drop']:+.2f})")
    if speed:
        text += (f" and it runs at {speed} of u8s8's latency at batch {' / '.join(ratios.get(best, {}))} (median over "
                 "models of the per-process medians)")
    return text + "."


def choice(models: Mapping[str, dict[str, Any]], batches: Sequence[int], here: str) -> dict[str, Any]:
    """Which saturation-free candidate keeps accuracy best where u8s8 saturates, computed from the data."""
    emulated = mean_drops(models, "accuracy_native_on_emulated_rows", "accuracy_emulated_avx2")
    native = mean_drops(models, "accuracy_native", "accuracy_native")
    ratios = median_ratios(models, batches)
    ranked = ranking(emulated, ratios)
    return {"rule": f"among the candidates that run within {SPEED_TOLERANCE:.2f}x of u8s8's latency at every batch "
                    "size here (else among all), the least mean top-1 accuracy drop from the fp32 file over the models "
                    "(points; on the emulated AVX2 CPU, on the emulated rows, against the fp32 file's native accuracy "
                    "there); equal drops go to the lower latency ratio to u8s8 at the largest batch here; "
                    "candidates: " + ", ".join(CANDIDATES),
            "keeps_u8s8_speed": {fmt: keeps_speed(fmt, ratios) for fmt in CANDIDATES},
            "best_on_emulated_avx2": ranked[0] if ranked else None, "ranking": ranked,
            "mean_drop_emulated_avx2": emulated,
            "mean_drop_native": native, "latency_vs_u8s8_native_median_over_models": ratios,
            "verdict": verdict(emulated, native, ratios, here)}


# ------------------------------------------------------------------------------------------------- environment
_PROBE = ("import json; from dataclasses import asdict; from minreal.runtime_bench.cpu import cpu_isa, u8s8_saturates; "
          "print(json.dumps({'u8s8_saturates': u8s8_saturates(), 'cpu_isa': asdict(cpu_isa())}))")


def emulated_environment(timeout_s: float) -> dict[str, Any] | None:
    """What ``minreal.runtime_bench.cpu`` says under ``qemu-x86_64 -cpu Haswell`` (``None`` without qemu-x86_64)."""
    command = qemu_command()
    if command is None:
        return None
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    try:
        probe: dict[str, Any] = json.loads(run_emulated(["-c", _PROBE], timeout_s).strip().splitlines()[-1])
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        probe = {"error": str(exc)}
    return {"command": f"{QEMU} -cpu {QEMU_CPU} {sys.executable} benchmarks/_ort_eval.py ...", "qemu": version,
            **probe,
            "note": "qemu-user passes the host's /proc/cpuinfo through, so cpu_isa's flags under emulation are the "
                    "host's; the CPUID that ONNX Runtime dispatches on is the emulated Haswell's (AVX2, no AVX-512 or "
                    "VNNI), and u8s8_saturates, measured with ONNX Runtime itself, is the fact that tells"}


def environment(emulation: Emulation) -> dict[str, Any]:
    """This machine (CPU, int8-relevant flags, measured U8S8 saturation, versions) and the emulated CPU."""
    import onnxruntime

    isa = cpu_isa()
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    env = {"cpu_model": cpu_model(), "arch": isa.arch, "cpu_flags": list(isa.flags), "cpu_flags_source": isa.source,
           "u8s8_saturates": u8s8_saturates(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
           "onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "numpy": np.__version__,
           "commit": git, "uncommitted_library_files": "the run imports the working tree",
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": list(os.getloadavg())}
    qemu = emulated_environment(emulation.timeout_s) if emulation.enabled else None
    reason = None if qemu else (f"{QEMU} is not installed" if emulation.enabled else "--no-emulation")
    return {**env, "emulated_avx2": qemu, "emulated_avx2_reason": reason}


# -------------------------------------------------------------------------------------------------------- main
def bench_config(args: argparse.Namespace) -> BenchConfig:
    """runtime_bench's protocol: the defaults, or a short one with ``--quick``."""
    config = BenchConfig(providers=("cpu",), batch_sizes=BATCHES, repeats=args.repeats, min_seconds=args.min_seconds,
                         intra_op_threads=args.threads)
    return replace(config, warmup=3, min_runs=5) if args.quick else config


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/int8_formats.json"))
    ap.add_argument("--work", type=Path, help="keep the ONNX files and data here (default: a temporary folder)")
    ap.add_argument("--models", nargs="+", choices=list(case_builders()), default=list(case_builders()))
    ap.add_argument("--repeats", type=int, help="timing: fresh processes per batch size (default 5; --quick 2)")
    ap.add_argument("--min-seconds", type=float, help="timing: seconds per model and process (default 2; --quick 0.2)")
    ap.add_argument("--threads", type=int, default=1, help="timing: ONNX Runtime intra-op threads")
    ap.add_argument("--no-emulation", action="store_true", help="skip the emulated AVX2 accuracy")
    ap.add_argument("--emulated-samples", type=int,
                    help="held-out rows per model on which the INT8 files are emulated (default 256; --quick 16)")
    ap.add_argument("--emulated-fp32-check", type=int,
                    help="held-out rows per model on which the fp32 file is emulated (default 8; --quick 2)")
    ap.add_argument("--emulation-timeout", type=float, default=4 * 3600.0, help="seconds per emulated run")
    ap.add_argument("--rechoose", action="store_true",
                    help="recompute only the choice block of --out from its measurements (after a change of rule)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a test of the script: {QUICK_HELDOUT} held-out samples per model, short timing")
    args = ap.parse_args()
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.min_seconds = args.min_seconds or (0.2 if args.quick else 2.0)
    args.emulated_samples = args.emulated_samples or (16 if args.quick else 256)
    args.emulated_fp32_check = args.emulated_fp32_check or (2 if args.quick else 8)
    return args


def format_spec(config: QuantConfig) -> str:
    """``QuantConfig(...)`` with the fields that differ from the defaults."""
    default = QuantConfig()
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in fields(config)
               if getattr(config, f.name) != getattr(default, f.name)]
    return f"QuantConfig({', '.join(changed)})"


def header(args: argparse.Namespace, config: BenchConfig, emulation: Emulation) -> dict[str, Any]:
    """The document's settings: usage, environment, formats, emulation and timing protocol."""
    return {"usage": USAGE, "quick": args.quick, "environment": environment(emulation),
            "formats": {name: format_spec(c) for name, c in FORMATS},
            "emulation": {"samples": emulation.samples, "fp32_check": emulation.fp32_check,
                          "threads": emulation.threads},
            "timing": {"provider": "cpu", "batch_sizes": list(BATCHES), "repeats": config.repeats,
                       "min_seconds": config.min_seconds, "min_runs": config.min_runs, "warmup": config.warmup,
                       "intra_op_threads": args.threads,
                       "statistic": "p50 pooled over processes; per-process p50s and their range; ratios per "
                                    "process, then median/min/max"}}


def main() -> None:
    args = parse()
    config = bench_config(args)
    emulation = Emulation(not args.no_emulation, args.emulated_samples, args.emulated_fp32_check,
                          args.emulation_timeout, os.cpu_count() or 1)
    say("environment" + (" (and the emulated CPU)" if emulation.enabled else ""))
    doc: dict[str, Any] = {**header(args, config, emulation), "models": {}, "skipped": {}}
    with nullcontext(args.work) if args.work else tempfile.TemporaryDirectory(prefix="int8-formats-") as work:
        for name in args.models:
            say(f"{name}: building")
            case = case_builders()[name](QUICK_HELDOUT if args.quick else None)
            if case is None:
                doc["skipped"][name] = f"{RESNET32} or {CIFAR} is absent"
                continue
            doc["models"][name] = run_case(case, Path(work) / name, config, emulation)
            write_json(args.out, {**doc, "complete": False})
    doc["choice"] = choice(doc["models"], BATCHES, _here(doc))
    doc["environment"]["loadavg_end"] = list(os.getloadavg())
    doc["wall_s"] = round(time.perf_counter() - _T0, 1)
    write_json(args.out, {**doc, "complete": True})
    print(doc["choice"]["verdict"])
    say(f"wrote {args.out}")


def _here(doc: Mapping[str, Any]) -> str:
    return f"{doc['environment']['cpu_model']}, U8S8 saturates: {doc['environment']['u8s8_saturates']}"


def rechoose(path: Path) -> None:
    """Recompute the choice block of a finished run from its own measurements (nothing is measured again)."""
    doc = json.loads(path.read_text())
    doc["choice"] = {**choice(doc["models"], BATCHES, _here(doc)),
                     "recomputed": "by --rechoose from this file's measurements"}
    write_json(path, doc)
    print(doc["choice"]["verdict"])


if __name__ == "__main__":
    _args = parse()
    if _args.rechoose:
        rechoose(_args.out)
    else:
        main()
