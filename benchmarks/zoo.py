"""The model zoo (issue 44): every torchvision model, the timm and Hugging Face families the environment has, each
compressed by each method at 0.7 of the MACs and taken through export, parity, INT8 and a short benchmark, with
each stage's outcome, wall time and peak memory.

Models: every name of ``torchvision.models.list_models()`` (classification, quantisation-ready, segmentation, detection,
video, optical flow), built with **seeded random weights** (``torch.manual_seed(0)``; nothing is downloaded; where their
outputs explode, BatchNorm statistics estimated on the calibration images) and saved as a state dict that the product
loads with ``--weights``; the most used timm architectures when ``timm`` is installed and the Hugging Face families the
``[hf]`` extra builds from a config (BERT, DistilBERT, RoBERTa, GPT-2, ViT, Whisper's encoder) when ``transformers`` is:
without them, one row per family says so. Both are built by the product itself (``minreal`` takes ``timm:NAME`` and
``hf:FAMILY``, :mod:`minreal.app.hub`). Image models (ViT included) calibrate on real CIFAR-10 test images of
``../shared/data`` (the first :data:`CALIB` images, resized to the model's input with bilinear interpolation, ImageNet
mean and std; a video clip repeats one image along time), written once per input shape as an ``.npz`` in the work
folder; Hugging Face text models on seeded synthetic token ids (int64, :data:`SEQ` per sample, uniform over the config's
vocabulary) and Whisper's encoder on seeded synthetic log-mel features (standard normal, the config's mel bins and
frames), one ``.npz`` per model whose array ``x`` ``minreal --data`` passes as the model's one input; without
``../shared/data`` the script prints one line and exits with status 2.

Per model, a ``baseline`` stage (build, parameters, MACs, the original exported to ONNX and quantised to INT8);
per model and method (``--methods``, default ``factorize,wanda,depth``) at MAC ratio :data:`MAC_RATIO`:
``compress`` (``minreal compress``), ``export`` and ``parity`` (``minreal export``, which checks parity against
torch), ``int8`` (``minreal.export.int8.quantize_int8``, static, this CPU's format) and ``bench`` (``minreal
bench`` of the original's fp32 and INT8 and the compressed model's fp32 and INT8, batch 1, one fresh process,
:data:`BENCH_SECONDS` s per model; its agreement metrics on the first :data:`BENCH_ROWS` calibration samples, not on
its default 64 random rows, which cost more than the timing and which the zoo does not record). Every stage runs in
a fresh process of this script (``--stage``) started by a
small launcher (``_common.run_measured``), so its peak resident memory (``peak_rss_mib``) is its own: the largest
resident set of the stage's process and of the processes it ran (``minreal bench``'s fresh processes), not the
driver's (Linux keeps a process's peak across fork and exec, so a stage started straight from this driver would
report at least the driver's size). A stage's outcome is ``ok``, ``refused`` (the product's own error: its one line),
``failed`` (any other exception: its type and first line; never a traceback) or ``skipped`` (an earlier stage did
not pass).

``--only`` takes model names or families (``classification``, ``quantization``, ``segmentation``, ``detection``,
``video``, ``optical_flow``, ``timm``, ``hf``), run in the order named; ``--list`` prints them; ``--resume`` keeps the
rows the JSON holds; the JSON is written atomically after every row. A model's folder under ``--work`` (its weights,
programs, ONNX and INT8 files: 64 GB for the whole zoo) is removed once its rows are written, unless ``--keep-files``;
``--resume`` then builds a model's baseline again only where a method of it is still to run. ``--table`` prints the
README's coverage table from the JSON, ``--summary`` the findings under it (:func:`summary_markdown`); ``--merge
BASE.json A.json B.json ...`` writes ``--out`` from a base JSON and the runs that resumed from it at once (shards of
the list) or on several machines, their new and rerun rows replacing the base's (:func:`merge`). Each row and
baseline names the CPU it ran on (``machine``; a run resumed on another machine holds rows of both: their times and
INT8 ratios are their own machine's); ``--stamp`` names it in the rows of a JSON an older zoo.py wrote, from the header
of the run that wrote them, before another machine resumes it (:func:`stamp_machines`). SIGTERM or SIGINT
(Ctrl-C) stops the run: the running stage's processes are killed, the rows finished so far are saved and the driver
exits with 128 + the signal after one line saying so (:func:`run_all`).

The timing columns are only as good as the machine was quiet: the header records the load average at the start and each
row its own and the machine's CPU shares over the row (``cpu_share``: busy, idle and steal from ``/proc/stat``, this
run's own work included); a run on a shared machine says so in ``load`` (``--load``): its times are not the tool's cost,
only its outcomes are results.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/zoo.py --out benchmarks/zoo.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
IMAGES = SHARED / "cifar10" / "cifar10_test_jpeg_1000_9999.npz"
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/zoo.py --out benchmarks/zoo.json"
MAC_RATIO = 0.7
METHODS = ("factorize", "wanda", "depth")
STAGES = ("compress", "export", "parity", "int8", "bench")
CALIB = 32
BENCH_SECONDS = 0.5
BENCH_ROWS = 4
WORKER_SHARE = 0.9
"""Share of a stage's ``--timeout`` that the bench stage's one measuring process may run (``bench --worker-timeout``):
the default 600 s stopped mvit_v2_s's four files under load."""
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TV_FAMILIES = {"": "classification", "quantization": "quantization", "segmentation": "segmentation",
               "detection": "detection", "video": "video", "optical_flow": "optical_flow"}
TIMM = ("resnet50", "efficientnet_b0", "convnext_tiny", "vit_small_patch16_224", "mobilenetv3_large_100",
        "regnety_016", "deit_small_patch16_224", "swin_tiny_patch4_window7_224", "resnet18", "efficientnet_b3")
HF = ("bert", "distilbert", "roberta", "gpt2", "vit", "whisper_encoder")
SEQ = 128
MAX_LINE = 300
EXPLODING = 1e4
"""A seeded model whose outputs exceed this magnitude gets its BatchNorm statistics estimated
(:func:`_estimate_batch_norm`)."""
PEAK_OWN = "own: the stage's process and the processes it ran, started by a small launcher"
PEAK_UPPER_BOUND = ("an upper bound: the stage was started straight from the driver, whose peak Linux hands down "
                    "across fork and exec")
"""What a row's ``peak_rss_mib`` values are (its ``peak_rss``): rows of earlier commits, kept by ``--resume``, have
the upper bound."""


@dataclass(frozen=True)
class Model:
    """One zoo entry: ``name`` as ``minreal`` takes it (a torchvision name, ``timm:NAME``, ``hf:FAMILY``), its
    family, its input shape (without the batch), why it is skipped, if it is, and what its calibration data is
    (a key of :data:`CALIB_MAKERS`: ``images``, ``pairs`` (two images: optical flow), ``tokens`` or ``features``)."""

    name: str
    family: str
    shape: tuple[int, ...] = ()
    skip: str | None = None
    inputs: str = "images"


# ------------------------------------------------------------------------------------------------------ models
def _tv_shape(name: str, family: str) -> tuple[int, ...]:
    """The input a torchvision model's own preprocessing gives (its weights' transforms, read without a download):
    (3, H, W) for images, (3, T, H, W) for clips."""
    import torchvision

    try:
        transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms()
        crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None) or [224]
        size = int(crop[0])
    except (ValueError, AttributeError, TypeError):
        size = 224
    if name.startswith("vit_"):  # built without weights a ViT takes its builder's 224 x 224; vit_h_14's only weights
        size = 224  # (SWAG, end to end) rebuild it at 518, whose transforms fed 518 x 518 to the 224 model (62df6df)
    size = min(size, 520) if family == "segmentation" else size
    if family == "video":
        return (3, 16, size, size)
    return (3, size, size)


def torchvision_models() -> list[Model]:
    import torchvision.models as tvm
    from torchvision.models import list_models

    by_family = {}
    for sub, family in TV_FAMILIES.items():
        module = getattr(tvm, sub) if sub else tvm
        for name in list_models(module=module):
            by_family.setdefault(name, family)
    return [Model(n, f, _tv_shape(n, f), inputs="pairs" if f == "optical_flow" else "images")
            for n, f in sorted(by_family.items(), key=lambda kv: (kv[1], kv[0]))]


def _hf_model(family: str) -> Model:
    """A Hugging Face row as ``hf:FAMILY`` builds it: token ids of :data:`SEQ`, images at the config's size, or
    Whisper's log-mel features (its encoder takes exactly twice ``max_source_positions`` frames)."""
    from minreal.app.hub import HF_FAMILIES, hf_config

    name = f"hf:{family}"
    takes = HF_FAMILIES[family].wrapper.input_name
    if takes == "input_ids":
        return Model(name, "hf", (SEQ,), inputs="tokens")
    config = hf_config(family)
    if takes == "pixel_values":
        return Model(name, "hf", (config.num_channels, config.image_size, config.image_size))
    return Model(name, "hf", (config.num_mel_bins, 2 * config.max_source_positions), inputs="features")


def optional_models() -> list[Model]:
    """The timm and Hugging Face rows: skipped with the reason where their package is missing."""
    rows = []
    timm = importlib.util.find_spec("timm") is not None
    hf = importlib.util.find_spec("transformers") is not None
    for name in TIMM:
        rows.append(Model(f"timm:{name}", "timm", (3, 224, 224),
                          None if timm else "timm is not installed in this environment (pip install timm)"))
    for name in HF:
        rows.append(_hf_model(name) if hf else
                    Model(f"hf:{name}", "hf", (SEQ,), "transformers is not installed in this environment "
                                                       "(pip install 'minreal[hf]')"))
    return rows


def all_models() -> list[Model]:
    return torchvision_models() + optional_models()


def select(models: Sequence[Model], only: str | None) -> list[Model]:
    if not only:
        return list(models)
    wanted = [w for w in only.split(",") if w]
    names = {m.name for m in models} | {m.family for m in models}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise SystemExit(f"zoo: unknown model or family {unknown[0]!r}; `--list` prints them")
    chosen = [m for w in wanted for m in models if w in (m.name, m.family)]
    return list(dict.fromkeys(chosen))  # in the order named (a run cut short has done the first ones)


# ------------------------------------------------------------------------------------------------------- stages
def _child_outcome(exc: BaseException) -> dict[str, str]:
    """``refused`` for the product's own errors (their one line), ``failed`` with the type for any other and for a
    parity mismatch."""
    from minreal.export.errors import ParityError
    from minreal.facts import error_line

    own = type(exc).__module__.startswith("minreal.") and not isinstance(exc, ParityError)
    if not own:
        return {"outcome": "failed", "reason": error_line(exc, with_type=True, max_chars=MAX_LINE)}
    from minreal.app.field_flags import flag_spelled

    # the stages run `minreal` commands, so a refusal reads as the command line prints it: flags, not fields
    line = flag_spelled(exc, error_line(exc))
    return {"outcome": "refused", "reason": line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"}


def _cli(argv: list[str]) -> dict[str, Any]:
    """Run ``minreal`` in this process with ``MINREAL_DEBUG=1`` so that its exceptions reach :func:`_child_outcome`."""
    import contextlib
    import io

    from minreal.app.cli import run

    os.environ["MINREAL_DEBUG"] = "1"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(argv)
    if code:
        said = [ln for ln in err.getvalue().splitlines() if ln.strip()][-1:] or [f"exit status {code}"]
        return {"outcome": "refused", "reason": said[0][:MAX_LINE]}
    text = out.getvalue().strip()
    try:
        return {"outcome": "ok", "result": json.loads(text) if text else None}
    except json.JSONDecodeError:
        return {"outcome": "ok", "result": None}


def _seeded(name: str) -> Any:
    """The model as ``minreal`` builds it from its name (random weights, no backbone download), seeded."""
    import torch

    from minreal.app.models import load_model

    torch.manual_seed(0)
    model = load_model(name)
    # torchvision initialises some classifiers to zero (ViT's head): every output would be 0 and parity, agreement
    # and the INT8 check would hold whatever the model did, so a Linear whose weight is all zeros gets a seeded
    # N(0, 0.02²) weight (saved with the others: every stage sees the same model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.any():
                torch.nn.init.normal_(module.weight, std=0.02)
    return model


def _estimate_batch_norm(model: Any, x: Any) -> float | None:
    """Where a seeded model's outputs exceed :data:`EXPLODING` in magnitude on the calibration images (Inception v3:
    torchvision's N(0, 0.1²) convolutions under BatchNorm's identity statistics reach about 2·10⁷, and float32
    rounding through 90 layers then fails any parity tolerance, the original's too), its BatchNorm statistics are
    estimated on those images as training would have left them (cumulative averages over batches of 8, no weight
    changes; only the norms in training mode, so dropout stays off), so that the zoo tests the tool and not a
    network no one trains. Returns the magnitude that triggered it, or None where nothing was done."""
    import torch

    from minreal.compress.core.evaluate import flatten_outputs
    from minreal.compress.core.inputs import call

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats]
    if not norms:
        return None
    with torch.no_grad():
        outputs = flatten_outputs(call(model.eval(), x[:8]))
        peak = max((float(t.abs().max()) for t in outputs if t.is_floating_point()), default=0.0)
        if peak <= EXPLODING:
            return None
        momenta = [m.momentum for m in norms]
        try:
            for m in norms:  # only the norms train: dropout and the rest stay as inference runs them
                m.reset_running_stats()
                m.momentum = None  # a cumulative average over the batches
                m.train()
            for start in range(0, len(x), 8):
                call(model, x[start:start + 8])
        finally:
            for m, momentum in zip(norms, momenta):
                m.momentum = momentum
            model.eval()
    return peak


def _images(model: Model) -> Any:
    """The first :data:`CALIB` CIFAR-10 test images at the model's shape (bilinear, ImageNet-normalised)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    shape = model.shape
    x = torch.from_numpy(np.load(IMAGES)["x"][:CALIB]).permute(0, 3, 1, 2).float() / 255
    x = F.interpolate(x, size=shape[-2:], mode="bilinear", align_corners=False)
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    if len(shape) == 4:
        x = x.unsqueeze(2).expand(-1, -1, shape[1], -1, -1).contiguous()
    return x.numpy()


def _image_pairs(model: Model) -> dict[str, Any]:
    """Two images a sample, as optical flow models take them (``image1``, ``image2``): the calibration images and
    each one's successor (the last one's is the first)."""
    import numpy as np

    x = _images(model)
    return {"image1": x, "image2": np.roll(x, -1, axis=0)}


def load_calib(path: str | Path) -> Any:
    """A calibration file's inputs: the array ``x``, or one array per forward parameter (:func:`_image_pairs`)."""
    import numpy as np

    with np.load(path) as f:
        return f["x"] if "x" in f.files else {k: f[k] for k in f.files}


def first_rows(x: Any, n: int) -> Any:
    """The first ``n`` samples of an array or of each array of a dict."""
    return {k: v[:n] for k, v in x.items()} if isinstance(x, dict) else x[:n]


def torch_inputs(x: Any) -> Any:
    """``x`` (:func:`load_calib`) as the model takes it: a tensor, or :class:`NamedInputs` for several inputs."""
    import torch

    from minreal.compress.core.inputs import NamedInputs

    if isinstance(x, dict):
        return NamedInputs({k: torch.from_numpy(v) for k, v in x.items()})
    return torch.from_numpy(x)


def _token_ids(model: Model) -> Any:
    """:data:`CALIB` rows of seeded token ids, int64, uniform over the vocabulary of ``hf:FAMILY``'s config."""
    import numpy as np

    from minreal.app.hub import hf_config

    vocab = hf_config(model.name.removeprefix("hf:")).vocab_size
    return np.random.default_rng(0).integers(0, vocab, size=(CALIB, *model.shape), dtype=np.int64)


def _features(model: Model) -> Any:
    """:data:`CALIB` seeded standard normal feature maps of the model's shape (log-mel scale), float32."""
    import numpy as np

    return np.random.default_rng(0).standard_normal((CALIB, *model.shape), dtype=np.float32)


CALIB_MAKERS: dict[str, Callable[[Model], Any]] = {"images": _images, "pairs": _image_pairs, "tokens": _token_ids,
                                                   "features": _features}
"""A model's ``inputs`` → its calibration array ``x`` (``CALIB`` samples of its shape), or arrays by forward
parameter."""


def _calib_file(work: Path, model: Model) -> Path:
    """The model's calibration data (:data:`CALIB_MAKERS`) as an ``.npz`` holding ``x`` (or one array per forward
    parameter), written once: per input shape for images, per model otherwise (token ids depend on the
    vocabulary)."""
    import numpy as np

    own = "" if model.inputs == "images" else f"{model.name.replace(':', '_')}-"
    path = work / f"calib-{own}{'x'.join(map(str, model.shape))}.npz"
    if path.is_file():
        return path
    x = CALIB_MAKERS[model.inputs](model)
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=work, suffix=".npz", delete=False) as f:
        np.savez(f, **(x if isinstance(x, dict) else {"x": x}))
    os.replace(f.name, path)
    return path


def stage_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the seeded model, save its state dict, count parameters and MACs, export and quantise the original."""
    import torch

    from minreal.compress.core.costs import count_macs_torch

    work = Path(spec["work"])
    model = _seeded(spec["name"])
    row = Model(spec["name"], spec.get("family", ""), tuple(spec["shape"]), inputs=spec.get("inputs", "images"))
    calib = _calib_file(work.parent, row)
    facts: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    if row.inputs in ("images", "pairs"):
        try:
            peak = _estimate_batch_norm(model, torch_inputs(load_calib(calib)))
        except Exception as exc:  # the model as built goes on to the other stages; the row says why
            peak = None
            facts["batch_norm_estimated"] = f"not estimated: {_child_outcome(exc)['reason']}"
        if peak is not None:
            facts["batch_norm_estimated"] = (f"seeded outputs reached {peak:.2g}: BatchNorm statistics estimated on "
                                             f"the {CALIB} calibration images")
    weights = work / "weights.pt"
    torch.save(model.state_dict(), weights)
    try:
        example = torch_inputs(first_rows(load_calib(calib), 1))
        facts["macs"] = count_macs_torch(model, example).macs
    except Exception as exc:  # a model the counter cannot trace still gets its other stages
        facts["macs_error"] = _child_outcome(exc)["reason"]
    out = _cli(["export", spec["name"], "--weights", str(weights), "--data", str(calib), "--out",
                str(work / "original.onnx"), "--json", "--quiet"])
    ready = _readiness(out.pop("result", None))
    if out["outcome"] == "ok":
        out = stage_int8({"onnx": str(work / "original.onnx"), "calib": str(calib)})
    return {**out, **ready, **facts}


def stage_compress(spec: dict[str, Any]) -> dict[str, Any]:
    out = _cli(["compress", spec["name"], "--weights", spec["weights"], "--data", spec["calib"], "-m", spec["method"],
                "--mac-ratio", str(MAC_RATIO), "--out", spec["pt2"], "--json", "--quiet"])
    report = out.pop("result", None) or {}
    for key in ("macs", "params"):
        if report.get(f"{key}_before"):
            out[f"{key[:-1]}_ratio_reached"] = round(report[f"{key}_after"] / report[f"{key}_before"], 4)
    if report.get("timings_s"):  # the method's own phases (statistics, analysis, realisation ...), for the cost fit
        out["phases_s"] = {k: round(v, 3) for k, v in report["timings_s"].items()}
    for key in ("budget_missed", "budget_overshot"):  # the report's own words where the ratio left its budget
        if note := (report.get("predicted") or {}).get(key):
            out[key] = note
    return out


def stage_export(spec: dict[str, Any]) -> dict[str, Any]:
    out = _cli(["export", spec["pt2"], "--data", spec["calib"], "--out", spec["onnx"], "--json", "--quiet"])
    result = out.pop("result", None) or {}
    if isinstance(result, dict) and isinstance(result.get("export"), dict):
        out["outputs"] = result["export"].get("output_names")
    if isinstance(result, dict) and result.get("timings_s"):  # the export's own phases (load, export, parity ...)
        out["phases_s"] = result["timings_s"]
    out.update(_readiness(result))
    return out


def _readiness(result: Any) -> dict[str, Any]:
    """The export report's static TensorRT check: ``tensorrt_ready``, and the issues where it is not."""
    check = result.get("tensorrt_readiness") if isinstance(result, dict) else None
    if not isinstance(check, dict) or "ready" not in check:
        return {}
    return {"tensorrt_ready": check["ready"], **({} if check["ready"] else {"tensorrt_issues": check.get("issues")})}


def stage_int8(spec: dict[str, Any]) -> dict[str, Any]:

    from minreal.export.int8 import quantize_int8

    x = load_calib(spec["calib"])
    try:
        quantize_int8(spec["onnx"], Path(spec["onnx"]).with_suffix(".int8.onnx"), calib=x)
    except Exception as exc:  # the stage's outcome is the exception, recorded in one line
        return _child_outcome(exc)
    return {"outcome": "ok"}


def stage_bench(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    report = Path(spec["work"]) / f"bench-{spec['method']}.json"
    data = Path(spec["work"]) / "bench-data.npz"
    x = first_rows(load_calib(spec["calib"]), BENCH_ROWS)
    np.savez(data, **(x if isinstance(x, dict) else {"x": x}))  # the stage's own folder: no other writer
    out = _cli(["bench", *spec["files"], "--data", str(data), "--batch", "1", "--repeats", "1", "--warmup", "3",
                "--min-runs", "10",
                "--min-seconds", str(BENCH_SECONDS), "--worker-timeout", str(spec["worker_timeout"]), "--out",
                str(report), "--quiet"])
    out.pop("result", None)
    if out["outcome"] == "ok" and report.is_file():
        out["p50_ms"] = _p50s(json.loads(report.read_text()))
    return out


def _p50s(report: dict[str, Any]) -> dict[str, float]:
    """Model label → median latency (ms) at batch 1 from a ``minreal bench`` report (best effort over its shape)."""
    found: dict[str, float] = {}
    for row in report.get("latency", []):
        p50 = (row.get("stats") or {}).get("p50_ms")
        if row.get("batch_size") == 1 and isinstance(p50, (int, float)):
            found[str(row["model"])] = round(p50, 3)
    return found


STAGE_FUNCTIONS = {"baseline": stage_baseline, "compress": stage_compress, "export": stage_export,
                   "int8": stage_int8, "bench": stage_bench}


def child(stage: str, spec_path: Path, result_path: Path) -> None:
    """The ``--stage`` process: run one stage and write its outcome as JSON."""
    spec = json.loads(spec_path.read_text())
    try:
        result = STAGE_FUNCTIONS[stage](spec)
    except Exception as exc:  # the stage's outcome is the exception, recorded in one line
        result = _child_outcome(exc)
    result_path.write_text(json.dumps(result))


def run_stage(stage: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``stage`` in a fresh process: its outcome, wall time and peak resident memory (MiB, its own:
    ``_common.run_measured``)."""
    from _common import child_env, run_measured

    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work / f"{stage}.spec.json", work / f"{stage}.result.json"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    done = run_measured([sys.executable, __file__, "--stage", stage, str(spec_path), str(result_path)], timeout,
                        env=child_env(ROOT))
    wall = round(time.perf_counter() - t0, 2)
    if done.timed_out:
        return {"outcome": "failed", "reason": f"TimeoutExpired: {stage} ran past {timeout:.0f} s", "wall_s": wall}
    if result_path.is_file():
        result = json.loads(result_path.read_text())
    else:
        tail = "".join(f": {ln}" for ln in [ln for ln in done.stderr.splitlines() if ln.strip()][-1:])
        result = {"outcome": "failed", "reason": f"process died ({_death(done)}){tail}"[:MAX_LINE]}
    return {**result, "peak_rss_mib": done.peak_mib, "wall_s": wall}


def _death(done: Any, memory_mib: float | None = None) -> str:
    """How a stage's process ended without a result: its exit status or signal; a SIGKILL the driver did not send
    with the peak beside the machine's memory (the kernel's out-of-memory killer sends SIGKILL)."""
    if done.returncode >= 0:
        return f"exit status {done.returncode}"
    if done.returncode != -signal.SIGKILL or done.peak_mib is None:
        return f"killed by signal {-done.returncode}"
    total = memory_mib or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return (f"killed by signal 9 at a peak of {done.peak_mib:.0f} MiB of the machine's {total:.0f} MiB: out of "
            "memory" if done.peak_mib >= 0.8 * total else f"killed by signal 9 at a peak of {done.peak_mib:.0f} MiB")




# ------------------------------------------------------------------------------------------------------ the run
def _skipped(reason: str) -> dict[str, str]:
    return {"outcome": "skipped", "reason": reason}


def _split_parity(export: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``minreal export`` checks parity itself: a parity mismatch is an ``ok`` export and a ``failed`` parity; an
    ``ok`` export passed parity (its time is the export's)."""
    if export["outcome"] == "failed" and export.get("reason", "").startswith("ParityError"):
        return {"outcome": "ok", "wall_s": export["wall_s"]}, {k: v for k, v in export.items() if k != "wall_s"}
    if export["outcome"] == "ok":
        return export, {"outcome": "ok", "note": "checked inside export (its time and memory)"}
    return export, _skipped("export did not pass")


def method_row(model: Model, method: str, base: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    """compress → export → parity → INT8 → bench of one model by one method, each stage in a fresh process."""
    folder = work / model.name
    spec = {"work": str(folder / method), "name": model.name, "method": method, "weights": str(folder / "weights.pt"),
            "calib": str(_calib_file(work, model)), "pt2": str(folder / method / "compressed.pt2"),
            "onnx": str(folder / method / "compressed.onnx")}
    if not Path(spec["weights"]).is_file():
        return {k: _skipped(f"the model was not built: {base.get('reason', 'no weights')}") for k in STAGES}
    stages: dict[str, Any] = {"compress": run_stage("compress", spec, timeout)}
    if stages["compress"]["outcome"] != "ok":
        return {k: stages.get(k, _skipped("compress did not pass")) for k in STAGES}
    stages["export"], stages["parity"] = _split_parity(run_stage("export", spec, timeout))
    if stages["parity"]["outcome"] != "ok":
        return {k: stages.get(k, _skipped("export or parity did not pass")) for k in STAGES}
    stages["int8"] = run_stage("int8", spec, timeout)
    if stages["int8"]["outcome"] != "ok" or base["outcome"] != "ok":
        why = "INT8 did not pass" if stages["int8"]["outcome"] != "ok" else "the original's export or INT8 did not pass"
        return {**stages, "bench": _skipped(why)}
    original = folder / "original.onnx"
    files = [str(original), str(original.with_suffix(".int8.onnx")), spec["onnx"],
             str(Path(spec["onnx"]).with_suffix(".int8.onnx"))]
    # the one measuring process may use most of the stage's time, so that the bench's own words end it, not the kill
    stages["bench"] = run_stage("bench", {**spec, "files": files, "worker_timeout": WORKER_SHARE * timeout}, timeout)
    return stages


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _baseline_kept(folder: Path, base: dict[str, Any]) -> bool:
    """Whether a resumed baseline's files are still in the work folder (the weights, and the original's fp32 and
    INT8 files where it passed): a row kept from a run whose work folder is gone is built again, not taken for a
    model that could not be built."""
    needed = [folder / "weights.pt"] + ([folder / "original.onnx", folder / "original.int8.onnx"]
                                        if base.get("outcome") == "ok" else [])
    return all(p.is_file() for p in needed)


def run_model(doc: dict[str, Any], model: Model, args: argparse.Namespace, say: Any) -> None:
    from _common import cpu_share, cpu_times

    done = {(r["model"], r["method"]) for r in doc["rows"]}
    if model.skip is not None:
        if (model.name, None) not in done:
            doc["rows"].append({"model": model.name, "family": model.family, "method": None,
                                "stages": {k: _skipped(model.skip) for k in STAGES}})
            save(doc, args.out)
        return
    todo = [m for m in args.methods if (model.name, m) not in done]
    if not todo:
        return
    base = doc["models"].get(model.name)
    if base is None or not args.resume or not _baseline_kept(args.work / model.name, base):
        base = run_stage("baseline", {"work": str(args.work / model.name), "name": model.name, "family": model.family,
                                      "shape": list(model.shape), "inputs": model.inputs}, args.timeout)
        doc["models"][model.name] = {"family": model.family, "input": list(model.shape), **base,
                                     "peak_rss": PEAK_OWN, "machine": machine_of(doc)}
        say(f"{model.name}: baseline {base['outcome']} in {base['wall_s']} s {base.get('reason', '')}")
        save(doc, args.out)
    for method in todo:
        before = cpu_times()
        stages = method_row(model, method, doc["models"][model.name], args.work, args.timeout)
        doc["rows"].append({"model": model.name, "family": model.family, "method": method, "stages": stages,
                            "loadavg": _load(), "cpu_share": cpu_share(before, cpu_times()), "peak_rss": PEAK_OWN,
                            "commit": doc["header"]["commit"][:12], "machine": machine_of(doc)})
        say(f"{model.name} {method}: " + ", ".join(f"{k} {v['outcome']}" for k, v in stages.items())
            + "".join(f"\n    {k}: {v['reason']}" for k, v in stages.items()
                      if v["outcome"] in ("refused", "failed")))
        save(doc, args.out)


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the driver. A ``BaseException``, like ``KeyboardInterrupt``: it unwinds through
    ``_common.run_measured`` (which kills the running stage's process group on the way) to :func:`run_all`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    """The driver's SIGTERM and SIGINT handler: later signals are ignored (the rows are being saved), this one
    unwinds the run."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def run_all(doc: dict[str, Any], chosen: Sequence[Model], args: argparse.Namespace, say: Callable[[str], None],
            run: Callable[..., None] | None = None) -> None:
    """Run ``chosen`` (each through ``run``, default :func:`run_model`) and save the JSON. On SIGTERM or SIGINT the
    running stage's processes are killed, the rows finished so far are saved (atomically) and the driver exits
    with ``128 + signal`` after one line saying so."""
    run = run or run_model
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    current = None
    try:
        for model in chosen:
            current = model.name
            run(doc, model, args, say)
            if not getattr(args, "keep_files", True):
                shutil.rmtree(args.work / model.name, ignore_errors=True)
    except Stopped as stop:
        save(doc, args.out)
        print(f"zoo: stopped by {signal.Signals(stop.signum).name} during {current}: its running stage was killed, "
              f"{len(doc['rows'])} finished row(s) saved to {args.out}; --resume goes on from there",
              file=sys.stderr, flush=True)
        raise SystemExit(128 + stop.signum) from None
    save(doc, args.out)


def save(doc: dict[str, Any], path: Path, listed: Sequence[str] | None = None) -> None:
    """Write ``doc`` atomically, its header counting the models with rows (``models_ran``) and naming the models of
    the list (``listed``, else :func:`all_models`) that have no row at all, not even a refusal before any stage
    (``models_not_reached``, with ``partial``)."""
    from _common import write_json

    names = [m.name for m in all_models()] if listed is None else list(listed)
    ran = sorted({r["model"] for r in doc["rows"] if r["method"] is not None})
    with_rows = {r["model"] for r in doc["rows"]}
    head = doc["header"]
    head.pop("models_run", None)  # the cumulative list of older files: the rows name their models
    head["models_ran"] = len(ran)
    head["models_not_reached"] = [n for n in names if n not in with_rows]
    head["partial"] = bool(head["models_not_reached"])
    write_json(path, doc)


BULKY = ("models_run", "models_not_reached")
"""Header lists left out of ``earlier_runs``: each was the whole file's at its time (the rows name their models)."""


def earlier_runs(head: dict[str, Any]) -> list[dict[str, Any]]:
    """The headers of the runs a resumed JSON holds rows of, oldest first and flat: ``head``'s own list (or an older
    JSON's nested ``resumed_from`` chain, unrolled), then ``head`` itself without it; each without the lists of
    :data:`BULKY` (the counts stay)."""
    if not head:
        return []
    before = head["earlier_runs"] if "earlier_runs" in head else earlier_runs(head.get("resumed_from") or {})
    return [{k: v for k, v in run.items() if k not in BULKY}
            for run in [*before, {k: v for k, v in head.items() if k not in ("resumed_from", "earlier_runs")}]]


def merge(docs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One zoo JSON from a base and the runs that resumed from it at once (shards of the list, or other machines):
    ``docs`` are (name, document) pairs, the base first. A shard's row (or baseline) that differs from the base's
    for the same (model, method) replaces it (it was run again), a new one is added; two shards that ran the same
    pair differently are refused in one line naming both. Every run's header is kept under ``earlier_runs``. A row
    that names no machine ran on its own file's header's: a shard's copy of a base row, which an older zoo.py kept
    unnamed, is the base's row (:func:`_same_row`), not a rerun on the shard's machine. ``docs`` are left as given."""
    for name, doc in docs:
        missing = [k for k in ("header", "models", "rows", "mac_ratio") if not isinstance(doc, dict) or k not in doc]
        if missing:
            raise SystemExit(f"zoo: --merge: {name} has no {missing[0]!r} (not a zoo JSON)")
        if doc["mac_ratio"] != docs[0][1]["mac_ratio"]:
            raise SystemExit(f"zoo: --merge: {name} is at MAC ratio {doc['mac_ratio']}, {docs[0][0]} at "
                             f"{docs[0][1]['mac_ratio']}")
    docs = [(name, json.loads(json.dumps(doc))) for name, doc in docs]  # the caller's documents stay as they are
    stamp_machines(docs[0][1])
    base_name, base = docs[0]
    out = json.loads(json.dumps(base))
    head = out["header"]
    head["earlier_runs"] = [{k: v for k, v in run.items() if k not in BULKY} for run in head.get("earlier_runs") or []]
    seen = {json.dumps(h, sort_keys=True) for h in head["earlier_runs"]}
    rows = {(r["model"], r["method"]): r for r in out["rows"]}
    base_rows, base_models = dict(rows), dict(out["models"])
    changed: dict[tuple[str, Any], str] = {}
    for name, doc in docs[1:]:
        for r in doc["rows"]:
            key = (r["model"], r["method"])
            if key in base_rows and _same_row(r, base_rows[key]):
                continue
            r.setdefault("machine", machine_of(doc))  # "?" where the shard names none: unknown for good, not the base's
            if key in changed and rows[key] != r:
                raise SystemExit(f"zoo: --merge: {key[0]}/{key[1]} was run in both {changed[key]} and {name}, with "
                                 "different rows; merge one of them")
            rows[key], changed[key] = r, name
        for model, entry in doc["models"].items():
            if model not in base_models or not _same_row(entry, base_models[model]):
                out["models"][model] = {**entry, "machine": entry.get("machine") or machine_of(doc)}
        for run in earlier_runs(doc["header"]):
            if json.dumps(run, sort_keys=True) not in seen:
                seen.add(json.dumps(run, sort_keys=True))
                head["earlier_runs"].append(run)
        head["models_listed"] = max(head.get("models_listed", 0), doc["header"].get("models_listed", 0))
        out["methods"] = list(dict.fromkeys([*out.get("methods", []), *doc.get("methods", [])]))
    out["rows"] = list(rows.values())
    return out


def machine_of(doc: dict[str, Any]) -> str:
    """The CPU named in ``doc``'s header (``"?"`` where it names none): the machine of the run that wrote it."""
    return str(((doc.get("header") or {}).get("machine") or {}).get("cpu") or "?")


def stamp_machines(doc: dict[str, Any]) -> int:
    """Name the machine in every row and baseline of ``doc`` that names none: the CPU of ``doc``'s header, the run that
    wrote them (a zoo.py older than the ``machine`` field stamped nothing; its rows are the last run's only while no
    other machine has resumed the file, so stamp before resuming elsewhere). Returns how many were stamped."""
    cpu, stamped = machine_of(doc), 0
    if cpu == "?":  # a header naming no machine: the rows stay unnamed, not named "?" for good
        return 0
    for entry in [*doc.get("rows", []), *doc.get("models", {}).values()]:
        if "machine" not in entry:
            entry["machine"], stamped = cpu, stamped + 1
    return stamped


def _zoo_shaped(doc: Any) -> bool:
    """Whether ``doc`` has what :func:`stamp_machines` reads: a header (its ``machine`` a dict, if any), a list of
    row dicts and a dict of baseline dicts."""
    return (isinstance(doc, dict) and isinstance(doc.get("header"), dict)
            and isinstance(doc["header"].get("machine") or {}, dict) and isinstance(doc.get("rows"), list)
            and all(isinstance(r, dict) for r in doc["rows"]) and isinstance(doc.get("models", {}), dict)
            and all(isinstance(m, dict) for m in doc.get("models", {}).values()))


def _same_row(row: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether a shard's ``row`` (or baseline) is the base's: equal, a machine the row does not name aside (an older
    zoo.py copied the base's rows unnamed)."""
    return row == base or ("machine" not in row and row == {k: v for k, v in base.items() if k != "machine"})


def header(models_listed: int) -> dict[str, Any]:
    import onnxruntime
    import torch
    import torchvision

    from minreal.runtime_bench.cpu import cpu_int8_target, cpu_isa

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else \
        platform.processor()
    # the int8-relevant instruction sets and the INT8 format they pick: the INT8 rows' timings depend on both
    machine = {"cpu": cpu, "cpus": os.cpu_count(), "system": platform.platform(), "isa": list(cpu_isa().flags),
               "int8_target": cpu_int8_target()}
    return {"commit": commit, "machine": machine,
            "load_at_start": _load(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "onnxruntime": onnxruntime.__version__, **_optional_versions(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "models_listed": models_listed}


def _optional_versions() -> dict[str, str | None]:
    """The timm and transformers versions the timm and Hugging Face rows were built with (None: not installed)."""
    import importlib.metadata

    versions: dict[str, str | None] = {}
    for package in ("timm", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


# -------------------------------------------------------------------------------------------------------- table
def table_markdown(doc: dict[str, Any]) -> str:
    """The README's coverage table: per family and method, how many models pass each stage; then the refusals and
    failures grouped by reason (their first 100 characters), with the models they hit."""
    rows = [r for r in doc["rows"] if r["method"] is not None]
    head = doc["header"]
    ran = sorted({r["model"] for r in rows})
    missing = head.get("models_not_reached") or []
    lines = [f"`benchmarks/zoo.json` at commit {head['commit'][:7]}: {len(ran)} of {head['models_listed']} models "
             f"run{' (partial; not reached: ' + ', '.join(missing) + ')' if missing else ''}, MAC ratio "
             f"{doc['mac_ratio']}; rows from commit(s) {', '.join(sorted({r.get('commit', '?')[:7] for r in rows}))}"
             f"; load: {doc.get('load') or 'not stated'}.", "",
             "| family | method | models | " + " | ".join(STAGES) + " |", "|---" * (3 + len(STAGES)) + "|"]
    for key in sorted({(r["family"], r["method"]) for r in rows}):
        cell = [r for r in rows if (r["family"], r["method"]) == key]
        passed = [sum(r["stages"][s]["outcome"] == "ok" for r in cell) for s in STAGES]
        lines.append(f"| {key[0]} | {key[1]} | {len(cell)} | " + " | ".join(map(str, passed)) + " |")
    skipped = Counter((r["family"], r["stages"]["compress"]["reason"]) for r in doc["rows"] if r["method"] is None)
    lines += ["", *(f"- {family}: {n} model(s) not run: {why}" for (family, why), n in sorted(skipped.items()))]
    lines += _readiness_lines(doc, rows)
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        for stage in STAGES:
            s = r["stages"][stage]
            if s["outcome"] in ("refused", "failed"):
                grouped.setdefault((s["outcome"], stage, s["reason"][:100]), []).append(f"{r['model']}/{r['method']}")
    if not grouped:
        return "\n".join([*lines, "", "No stage was refused or failed."])
    lines += ["", "| outcome | stage | reason | count | models |", "|---|---|---|---|---|"]
    for (outcome, stage, why), hit in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(hit[:6]) + (f", … ({len(hit) - 6} more)" if len(hit) > 6 else "")
        lines.append(f"| {outcome} | {stage} | {why.replace('|', '/')} | {len(hit)} | {shown} |")
    return "\n".join(lines)


def _readiness_lines(doc: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """How many exports (the originals' and the compressed models') pass the static TensorRT check, of those whose
    rows record it (rows from before the check was recorded do not), and the ones that do not."""
    checked = [(f"{r['model']}/{r['method']}", r["stages"]["export"]) for r in rows
               if "tensorrt_ready" in r["stages"]["export"]]
    checked += [(f"{name} (original)", base) for name, base in doc.get("models", {}).items()
                if "tensorrt_ready" in base]
    if not checked:
        return []
    ready = sum(s["tensorrt_ready"] for _, s in checked)
    lines = [f"- TensorRT-ready exports (static check): {ready} of the {len(checked)} that record it"]
    lines += [f"  - not ready: {name}: {'; '.join(s.get('tensorrt_issues') or [])}"[:300]
              for name, s in checked if not s["tensorrt_ready"]]
    return lines


def summary_markdown(doc: dict[str, Any]) -> str:
    """The README's findings under the table, computed from the JSON (nothing typed in by hand): per method, how many
    models go through every stage and how many torchvision models go through with factorize and a width method (issue
    44's goal: 77); where a row left its budget; the compressed INT8 file's batch-1 latency against the original's INT8
    (the row to beat), with the rows that are slower; which method's INT8 is fastest per model; the run's own time; and
    whether any row failed or holds a traceback. A row's bench is one short run in one fresh process: an indication
    without a spread, and the lines say so."""
    rows = [r for r in doc["rows"] if r["method"] is not None]
    commits = sorted({r.get("commit", "?")[:7] for r in rows})
    origin = f"every row from commit {commits[0]}" if len(commits) == 1 else \
        f"rows from {len(commits)} commits (each row names its own)"
    unnamed = "machine not recorded"
    machines = Counter(unnamed if m == "?" else m for m in (r.get("machine") or machine_of(doc) for r in rows))
    if set(machines) <= {unnamed}:
        where = ""
    elif len(machines) == 1:
        where = f" on {next(iter(machines))}"
    else:
        where = (f" on {len(machines)} machines (" + ", ".join(f"{m}: {n} rows" for m, n in machines.most_common())
                 + "; a row's times and INT8 ratios are its own machine's)")
    lines = [f"- **Rows**: {len({r['model'] for r in rows})} of {doc['header']['models_listed']} models, "
             f"{len(rows)} rows, {origin}{where}.", *_through_lines(rows), *_budget_lines(doc, rows),
             *_int8_lines(rows), *_cost_lines(doc, rows)]
    failed = [f"{r['model']}/{r['method']} {s}" for r in rows for s in STAGES if r["stages"][s]["outcome"] == "failed"]
    tracebacks = "Traceback (most recent call last)" in json.dumps(doc)
    lines.append(f"- **Failed (an error that is not the product's own refusal): {len(failed)}**"
                 + (f" ({', '.join(failed)})" if failed else "")
                 + f"; the JSON holds {'a' if tracebacks else 'no'} traceback.")
    return "\n".join(lines)


def _through_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per method, the models through every stage; the torchvision models through with factorize and a width
    method (issue 44's goal: 77)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    through = {m: {r["model"] for r in rows if r["method"] == m
                   and all(r["stages"][s]["outcome"] == "ok" for s in STAGES)} for m in methods}
    lines = [f"- **{m}**: {len(through[m])} of the {sum(r['method'] == m for r in rows)} models it ran go through "
             "compress, export, parity, INT8 and bench." for m in methods]
    tv = {r["model"] for r in rows if r["family"] not in ("timm", "hf")}
    for width in (m for m in methods if "factorize" in through and m in ("wanda", "magnitude", "taylor", "cbal")):
        lines.append(f"- **torchvision through with factorize and with {width}: "
                     f"{len(tv & through['factorize'] & through[width])}** of the {len(tv)} run (issue 44's goal: 77).")
    return lines


def _budget_lines(doc: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The rows whose report says the ratio reached left its budget: missed (above it, beyond the registry's
    ``BUDGET_SLACK``) or overshot (below it by more than ``OVERSHOOT``)."""
    said = {"budget_missed": "missed", "budget_overshot": "overshot"}
    left = [f"{r['model']}/{r['method']} {r['stages']['compress'].get('mac_ratio_reached')} ({said[k]})"
            for r in rows for k in said if k in r["stages"]["compress"]]
    return [f"- Left their budget of {doc['mac_ratio']}, as their report says: " + ", ".join(left) + "."] if left \
        else []


def _int8_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per method, the compressed INT8 file's batch-1 latency over the original's INT8 (median, range, count faster),
    the slower rows, and how often each method has the fastest INT8 of a model."""
    ratio: dict[str, dict[str, float]] = {}
    for r in rows:
        p50 = r["stages"]["bench"].get("p50_ms") or {}
        if r["stages"]["bench"]["outcome"] == "ok" and p50.get("compressed.int8") and p50.get("original.int8"):
            ratio.setdefault(r["method"], {})[r["model"]] = p50["compressed.int8"] / p50["original.int8"]
    if not ratio:
        return []
    lines = [f"- **INT8 against the original's INT8** (batch 1, one {BENCH_SECONDS:g} s bench per row in one fresh "
             "process, the original's INT8 measured in the same process: an indication without a spread, not a "
             "measurement):"]
    for m, got in ratio.items():
        v = sorted(got.values())
        slower = [f"{k} {x:.2f}×" for k, x in sorted(got.items(), key=lambda kv: -kv[1]) if x >= 1]
        lines.append(f"  - {m}: faster in {sum(x < 1 for x in v)} of {len(v)}, median {statistics.median(v):.2f}× "
                     f"({v[0]:.2f}–{v[-1]:.2f})" + (f"; not faster: {', '.join(slower)}" if slower else ""))
    benched = Counter(model for got in ratio.values() for model in got)
    best = Counter(min((got[model], m) for m, got in ratio.items() if model in got)[1]
                   for model, methods in benched.items() if methods > 1)
    if best:
        lines.append("  - fastest INT8 among the methods, of the models benched with more than one: "
                     + ", ".join(f"{m} {n}" for m, n in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))))
    return lines


def _cost_lines(doc: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The run's own time: the sum of its stages' wall times (baselines included) and the median per method row."""
    base = sum(float(b.get("wall_s") or 0) for b in doc.get("models", {}).values())
    per = {m: [sum(float(s.get("wall_s") or 0) for s in r["stages"].values()) for r in rows if r["method"] == m]
           for m in dict.fromkeys(r["method"] for r in rows)}
    total = base + sum(sum(v) for v in per.values())
    return [f"- **The run's own time**: {total / 3600:.1f} h of stages ({base / 3600:.1f} h of baselines); median "
            "per row: " + ", ".join(f"{m} {statistics.median(v) / 60:.1f} min" for m, v in per.items() if v)
            + f" (load: {doc.get('load') or 'not stated'})."]


# --------------------------------------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "zoo.json")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-zoo")
    ap.add_argument("--only", default=None, help="comma-separated model names or families (see --list)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--resume", action="store_true", help="keep the rows the JSON holds and run the others")
    ap.add_argument("--list", action="store_true", help="print the models and their families, and exit")
    ap.add_argument("--table", action="store_true", help="print the README's coverage table from --out, and exit")
    ap.add_argument("--summary", action="store_true",
                    help="print the README's findings under the table (computed from --out), and exit")
    ap.add_argument("--stamp", action="store_true",
                    help="name the machine (its header's CPU) in --out's rows and baselines that name none, and exit: "
                         "a JSON an older zoo.py wrote, before another machine resumes it")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one stage may run")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep each model's folder under --work (weights, programs, ONNX and INT8 files; the whole "
                         "zoo wrote 64 GB and filled this machine's disk); by default it is removed once the model's "
                         "rows are written")
    ap.add_argument("--load", default=None, help="what else ran on the machine (recorded in the header)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                    help="write --out from a base zoo JSON and the runs that resumed from it at once (shards): their "
                         "new or rerun rows replace the base's, and exit")
    args = ap.parse_args(argv)
    args.methods = tuple(m for m in args.methods.split(",") if m)
    return args


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--stage":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
        return
    args = parse()
    if args.table:
        print(table_markdown(json.loads(args.out.read_text())))
        return
    if args.summary:
        print(summary_markdown(json.loads(args.out.read_text())))
        return
    if args.stamp:
        from _common import write_json

        try:
            doc = json.loads(args.out.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"zoo: --stamp: cannot read {args.out}: {type(exc).__name__}: {exc}") from None
        if not _zoo_shaped(doc):
            raise SystemExit(f"zoo: --stamp: {args.out} is not a zoo JSON (a header naming a machine, rows and "
                             "baselines)")
        if machine_of(doc) == "?":
            raise SystemExit(f"zoo: --stamp: {args.out}'s header names no machine; nothing stamped")
        stamped = stamp_machines(doc)
        if stamped:
            write_json(args.out, doc)
        print(f"zoo: {stamped} row(s) and baseline(s) of {args.out} named their machine, {machine_of(doc)}",
              file=sys.stderr)
        return
    if args.merge:
        docs = []
        for path in args.merge:
            try:
                docs.append((str(path), json.loads(path.read_text())))
            except (OSError, ValueError) as exc:
                raise SystemExit(f"zoo: --merge: cannot read {path}: {type(exc).__name__}: {exc}") from None
        doc = merge(docs)
        if args.load:
            doc["load"] = args.load
        save(doc, args.out)
        print(f"zoo: {len(doc['rows'])} rows of {doc['header']['models_ran']} models merged into {args.out}")
        return
    models = all_models()
    if args.list:
        for m in models:
            print(f"{m.family:14s} {m.name}" + (f"  (not run: {m.skip})" if m.skip else ""))
        return
    chosen = select(models, args.only)
    if not IMAGES.is_file():
        print(f"zoo: {IMAGES} is missing (../shared/data is absent, as in a user's clone); nothing measured",
              file=sys.stderr)
        raise SystemExit(2)
    doc: dict[str, Any] = {"usage": USAGE, "issue": 44, "header": header(len(models)), "mac_ratio": MAC_RATIO,
                           "methods": list(args.methods), "models": {}, "rows": []}
    if args.resume and args.out.is_file():
        old = json.loads(args.out.read_text())
        stamp_machines(old)
        doc["models"], doc["rows"] = old.get("models", {}), old.get("rows", [])
        doc["header"]["earlier_runs"] = earlier_runs(old.get("header", {}))
        for kept in [*doc["models"].values(), *(r for r in doc["rows"] if r["method"] is not None)]:
            kept.setdefault("peak_rss", PEAK_UPPER_BOUND)
    doc["load"] = args.load
    t0 = time.time()

    def say(line: str) -> None:
        print(f"[{time.time() - t0:7.0f} s] {line}", file=sys.stderr, flush=True)

    run_all(doc, chosen, args, say)


if __name__ == "__main__":
    main()
