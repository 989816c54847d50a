"""INT8 of width-cut models keeps the saving (issue 28, item 2): uniform width cuts of the pretrained CIFAR-10
ResNet-32 on channel multiples 8 and 16, timed in fp32 and INT8 against the original.

Goal: at batch 32, the INT8 file of a width cut at MAC ratio r runs in at most (r + 0.15) x the original's INT8
latency, for r = 0.7, 0.5 and 0.35 (:data:`TARGETS`, :data:`SLACK`); the same check is reported at batch 1. Open
question it decided: ONNX Runtime's MLAS blocks NCHWc channels by 16 on AVX-512F CPUs (``NchwcBlockSize = 16`` in
``core/mlas/lib/platform.cpp``; 8 on AVX2), and its x86 int8 convolution (``MlasConvSym``) packs output channels by 16
and is only taken for at least 16 of them (``MlasConvSymPackWSize``), while minreal's width multiple was 8 on every
CPU. So every cut is made on each :data:`LADDERS` entry and timed in fp32 and INT8: ``m8`` (multiples of 8, at least
8), ``m16`` (multiples of 16, at least 16: minreal's CPU default since, ``WIDTH_MULTIPLE_BY_PROVIDER`` and
``WIDTH_MIN_BY_PROVIDER`` in ``minreal.compress.core.options``) and ``m8-min16`` (multiples of 8, at least 16).
``multiples`` compares each ladder's latency ratios with ``m8``'s interpolated at the same MAC ratio, per precision
and batch size.

Where the time goes: after timing, every INT8 file is profiled at each batch size in one more session with
onnxruntime's profiler (``minreal.runtime_bench.node_profile``, 30 runs after 5 warm-up, per kernel the median): time
per op type, every convolution's channels, MACs, time and GMAC/s, whether MLAS's symmetric kernel is expected for it
(:func:`sym_kernel_expected`), the convolutions by output channels, and per cut its convolution time and the rest
against the original's (``profile``). Profiling adds a little time per kernel: its sums are compared with each other,
not with the timed latencies.

The stem: minreal's x86 INT8 files widen a convolution whose input channels are not a multiple of 4 (ResNet-32's
3-channel stem) with a zero channel (``minreal.export.qdq_channels``), which puts it on MLAS's symmetric kernel. The
original's INT8 file is also written without it (``QuantConfig(align_channels=False)``), timed in the same processes
and profiled: ``stem`` holds the widened file's p50 against the unwidened one's per process, both held-out top-1s
(equal up to a rare tie: the integer sums are the same) and each file's stem convolution row.

Cuts: per ladder and target r, one fraction f scales every segment of every cuttable channel group
(``minreal.compress.core.width``: ``analyse``, ``WidthGraph.segments``; ResNet-32's option-A stream is one group of
three segments, each block's inner channels one group) to the ladder's width nearest f x its size, the rounding error
carried on to the next segment of the same size (so that eleven 16-channel segments do not all halve at once); f is
searched on :data:`FRACTIONS` for the whole-model MAC ratio nearest r (predicted from
``minreal.compress.core.width.cost.cost_terms``; the ratio of the built model, counted as ``export_variant`` counts it,
is the one recorded and judged). A ladder may not reach r
(``m16`` keeps the 16-channel stage whole): the goal is judged at the MAC ratio reached (bound: reached + 0.15), and
``met_at_target`` at r + 0.15 as the issue words it. Cuts with equal widths are built and timed once. Weights: each
segment keeps its channels of largest L1 norm (``magnitude_importance``), with no recovery: latency is the point, not
accuracy; every file's held-out top-1 (no recovery) is recorded only as a check that it computes what it should.

Files: ``minreal.export.variant.export_variant`` (ONNX, simplified, verified against torch), then
``minreal.export.int8.quantize_int8`` with the default ``QuantConfig`` (static QDQ in this CPU's format, recorded),
calibrated on 256 images drawn (seed 0) from the first 7,000 of ``../shared/data``'s CIFAR-10 JPEG test images; the
last 2,000 are held out (``benchmarks/int8_formats.py``'s ``cifar_case``). Per file, ONNX Runtime's optimised CPU graph
(``ORT_ENABLE_ALL``, as runtime_bench's sessions): op counts, Conv/MatMul/Gemm as integer and as float kernels, NCHWc
convolutions and reorders, and the nodes run in float between a DequantizeLinear and a QuantizeLinear.

Timing: ``minreal.runtime_bench.run_benchmark``: every file in each of ``--processes`` fresh processes (interleaved, the
order rotated per process), batch 1 and 32, the project's default intra-op threads (physical cores); per file the pooled
p50 and, per process, its ratio to the original's INT8 and fp32 timed in that same process (median, min, max), so that
the virtual machine's CPU steal moves both alike. CPU shares (busy, idle, steal) over the run come from /proc/stat.

Needs ``../shared/data``; without it the script prints one line and exits with status 2 (``--plan`` needs none: it
plans on the architecture with random weights and prints the cuts). ``--quick`` is a smoke test (one ladder, one
target, 2 processes, short timing, 200 held-out images; about 40 s on 2 cores) and needs its own ``--out``. The full
run writes and times 14 files (7 distinct width sets): about 3 minutes on 2 cores. Run it alone.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_width.py --out benchmarks/int8_width.json
    [--processes 5] [--threads N] [--min-seconds 2] [--work DIR] [--plan] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import onnx
import torch
from _common import cpu_share, cpu_times, write_json
from int8_formats import CIFAR, RESNET32, cifar_case, quant_record
from torch import nn

from minreal.compress.core.options import WIDTH_MIN_BY_PROVIDER, WIDTH_MULTIPLE_BY_PROVIDER
from minreal.compress.core.width import Cut, WidthGraph, analyse, apply_cuts
from minreal.compress.core.width.allocate import segment_key
from minreal.compress.core.width.cost import cost_terms
from minreal.compress.core.width.importance import magnitude_importance
from minreal.compress.models import CifarResNet
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.int8.ops import kernel_counts
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant
from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark
from minreal.runtime_bench.cpu import cpu_int8_target, cpu_isa, u8s8_saturates
from minreal.runtime_bench.environment import cpu_model
from minreal.runtime_bench.model_info import float_roundtrips, optimized_graph
from minreal.runtime_bench.node_profile import KernelTime, op_totals, profile_kernels
from minreal.runtime_bench.timing import ratio_summary

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "int8_width.json"
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_width.py --out benchmarks/int8_width.json"
TARGETS = (0.7, 0.5, 0.35)
SLACK = 0.15
"""The goal's allowance: INT8 latency ratio at most MAC ratio + SLACK."""
REACHED = 0.03
"""A cut reaches its target when its MAC ratio is within this of it."""
BATCHES = (1, 32)
GOAL_BATCH = 32
FRACTIONS = tuple(round(f, 3) for f in np.arange(0.05, 1.0 + 1e-9, 0.005))
PRECISIONS = ("fp32", "int8")
ORIGINAL = "original"
#: The original's INT8 file without the stem widened to 4 input channels (``QuantConfig.align_channels=False``).
UNALIGNED = "original-unaligned.int8"
HELDOUT, QUICK_HELDOUT = 2000, 200
QUICK_LADDERS, QUICK_TARGETS = ("m8",), (0.5,)
PROFILE_RUNS, PROFILE_WARMUP = 30, 5
CONV_OPS = frozenset({"QLinearConv", "NhwcQLinearConv", "ConvInteger", "Conv", "FusedConv"})
#: Which input of each convolution kernel is its weight (the others': 1).
CONV_WEIGHT_INPUT = {"QLinearConv": 3, "NhwcQLinearConv": 3}
_T0 = time.perf_counter()


def say(line: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[int8_width {time.perf_counter() - _T0:7.1f} s] {line}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------- cuts
@dataclass(frozen=True)
class Ladder:
    """Widths a segment may take: its full size, or the multiples of ``multiple`` below it down to ``floor`` (a
    segment no wider than ``floor`` stays whole)."""

    multiple: int
    floor: int

    def widths(self, size: int) -> list[int]:
        """The allowed widths of a ``size``-channel segment, descending."""
        top = (size - 1) // self.multiple * self.multiple
        return [size, *range(top, self.floor - 1, -self.multiple)]

    def nearest(self, size: int, fraction: float) -> int:
        """The allowed width nearest ``fraction`` x ``size`` (the wider one on a tie)."""
        return min(self.widths(size), key=lambda w: (abs(w - fraction * size), -w))


LADDERS: dict[str, Ladder] = {"m8": Ladder(8, 8), "m16": Ladder(16, 16), "m8-min16": Ladder(8, 16)}
"""The width ladders compared: minreal's former CPU multiple (8), its CPU default now (16, at least 16: MLAS's AVX-512
NCHWc block and its int8 convolution's output-channel pack), and 8 with 16 as floor."""


@dataclass(frozen=True)
class UniformCut:
    """One fraction of every segment's width on one ladder, searched for a target MAC ratio.

    Attributes:
        ladder: the :data:`LADDERS` key.
        target: the MAC ratio aimed at.
        fraction: the fraction of each segment's size that its width is nearest to.
        mac_ratio: the whole-model MAC ratio predicted from the channel analysis.
        widths: per segment key (``group/k``), its width.
    """

    ladder: str
    target: float
    fraction: float
    mac_ratio: float
    widths: dict[str, int]

    @property
    def name(self) -> str:
        return f"{self.ladder}@{self.target:g}"


def segments(wg: WidthGraph) -> dict[str, list[int]]:
    """Per segment key of every cuttable group, the segment's atoms (root slot ids)."""
    return {segment_key(g.name, k): [g.atoms[i] for i in seg]
            for g in wg.cuttable() for k, seg in enumerate(wg.segments(g))}


def uniform_widths(sizes: Mapping[str, int], ladder: Ladder, fraction: float) -> dict[str, int]:
    """Per segment key (``sizes``: segment key → channels, in graph order), the ``ladder`` width nearest ``fraction``
    of its size plus the rounding error carried from the earlier segments of the same size (error diffusion: equal
    segments do not all round the same way, so the MAC ratio follows the fraction instead of jumping when every
    16-channel segment halves at once)."""
    widths: dict[str, int] = {}
    carry: dict[int, float] = {}
    for key, size in sizes.items():
        ideal = fraction * size + carry.get(size, 0.0)
        widths[key] = ladder.nearest(size, ideal / size)
        carry[size] = ideal - widths[key]
    return widths


def mac_counter(wg: WidthGraph) -> Callable[[Mapping[str, int]], float]:
    """Per-sample MACs of the model whose segments keep the given widths (of their first atoms: which ones does not
    change the count), from :func:`minreal.compress.core.width.cost.cost_terms`."""
    terms, atoms_of = cost_terms(wg), segments(wg)

    def macs(widths: Mapping[str, int]) -> float:
        removed = {a for key, atoms in atoms_of.items() for a in atoms[widths[key]:]}
        total = 0.0
        for t in terms:
            n_out = sum(a not in removed for a in t.out_atoms)
            n_in = sum(a not in removed for a in t.in_atoms) if t.in_atoms else t.in_fixed
            total += n_out * n_in * t.mac_unit + n_out * t.extra_macs
        return total
    return macs


Curve = list[tuple[float, float, dict[str, int]]]
"""(fraction, predicted whole-model MAC ratio, widths) per fraction of :data:`FRACTIONS`."""


def fraction_curve(wg: WidthGraph, ladder: Ladder) -> Curve:
    """The uniform widths on ``ladder`` at every fraction of :data:`FRACTIONS` and their predicted MAC ratios."""
    sizes = {key: len(atoms) for key, atoms in segments(wg).items()}
    macs = mac_counter(wg)
    full = macs(sizes)
    curve = []
    for f in FRACTIONS:
        widths = uniform_widths(sizes, ladder, f)
        curve.append((f, macs(widths) / full, widths))
    return curve


def search_cut(curve: Curve, ladder: str, target: float) -> UniformCut:
    """The point of ``curve`` (of ``ladder``) whose MAC ratio is nearest ``target`` (the larger ratio on a tie)."""
    f, ratio, widths = min(curve, key=lambda c: (abs(c[1] - target), -c[1]))
    return UniformCut(ladder, target, f, ratio, widths)


def plan_cuts(wg: WidthGraph, ladders: Sequence[str], targets: Sequence[float]) -> list[UniformCut]:
    """One :func:`search_cut` per ladder (of :data:`LADDERS`) and target."""
    cuts = []
    for ladder in ladders:
        curve = fraction_curve(wg, LADDERS[ladder])
        cuts += [search_cut(curve, ladder, r) for r in targets]
    return cuts


def narrowed(wg: WidthGraph, widths: Mapping[str, int]) -> nn.Module:
    """The model with each segment cut to its width, keeping its channels of largest L1 norm."""
    cuts = {}
    for g in wg.cuttable():
        score = magnitude_importance(wg, g)
        keep = [i for k, seg in enumerate(wg.segments(g))
                for i in sorted(seg, key=lambda i: -float(score[i]))[:widths[segment_key(g.name, k)]]]
        if len(keep) < g.size:
            cuts[g.name] = Cut(keep=sorted(keep))
    return apply_cuts(wg, cuts)


def conv_channels(model: nn.Module) -> dict[str, int]:
    """Output channel counts of the model's convolutions: count of convolutions per width (as text keys)."""
    counts = Counter(m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d))
    return {str(w): n for w, n in sorted(counts.items())}


def unique_cuts(cuts: Sequence[UniformCut]) -> dict[str, str]:
    """Per cut name, the name of the first cut with the same widths (the one built and timed)."""
    first: dict[tuple[tuple[str, int], ...], str] = {}
    return {c.name: first.setdefault(tuple(sorted(c.widths.items())), c.name) for c in cuts}


# ---------------------------------------------------------------------------------------------------------- files
def graph_facts(path: Path) -> dict[str, Any]:
    """What ONNX Runtime's optimised CPU graph of ``path`` runs: op counts (``domain:op`` outside ai.onnx), the
    Conv/MatMul/Gemm nodes run as integer and as float kernels, NCHWc convolutions and reorders, and the nodes run in
    float between a DequantizeLinear and a QuantizeLinear."""
    graph = optimized_graph(path, "cpu")
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in graph.node)

    integer, floating = kernel_counts(dict(ops))  # as the INT8 report counts them
    nchwc = {op: n for op, n in ops.items() if op.startswith("com.microsoft.nchwc:")}
    return {"ops": dict(sorted(ops.items())), "integer_kernels": integer,
            "float_kernels": floating, "nchwc_convs": nchwc.get("com.microsoft.nchwc:Conv", 0),
            "nchwc_reorders": sum(n for op, n in nchwc.items() if "Reorder" in op),
            "float_between_dq_q": float_roundtrips(graph)}


def write_variant(name: str, model: nn.Module, calib: torch.Tensor, folder: Path) -> dict[str, Any]:
    """Export ``model`` to ``folder/<name>.fp32.onnx``, quantise it to ``.int8.onnx``: the paths, costs, the
    quantisation's record and both files' graph facts."""
    stem = name.replace("@", "-")
    fp32, int8 = folder / f"{stem}.fp32.onnx", folder / f"{stem}.int8.onnx"
    t0 = time.perf_counter()
    record = export_variant(model, calib, fp32, VariantConfig(), name, method="width" if name != ORIGINAL else "none")
    t1 = time.perf_counter()
    result = quantize_int8(fp32, int8, calib.numpy(), QuantConfig())
    quant = quant_record(result, time.perf_counter() - t1)
    say(f"{name}: exported ({t1 - t0:.0f} s) and quantised to {result.target} ({quant['quantize_s']} s): "
        f"{result.integer_kernels} integer, {result.float_kernels} float kernels")
    return {"paths": {"fp32": str(fp32), "int8": str(int8)}, "macs": record.macs, "params": record.params,
            "conv_out_channels": conv_channels(model), "quantization": quant,
            "graph": {"fp32": graph_facts(fp32), "int8": graph_facts(int8)}}


def write_files(model: nn.Module, wg: WidthGraph, cuts: Sequence[UniformCut], calib: torch.Tensor,
                folder: Path) -> dict[str, dict[str, Any]]:
    """The original and every distinct cut (:func:`unique_cuts`) written by :func:`write_variant`."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {ORIGINAL: write_variant(ORIGINAL, model, calib, folder)}
    timed = unique_cuts(cuts)
    for cut in cuts:
        if timed[cut.name] == cut.name:
            files[cut.name] = write_variant(cut.name, narrowed(wg, cut.widths).eval(), calib, folder)
    return files


# -------------------------------------------------------------------------------------------------------- latency
def _ratio(own: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    s = ratio_summary(own, reference)
    return {"median": round(s.median, 4), "min": round(s.min, 4), "max": round(s.max, 4),
            "per_process": [round(r, 4) for r in s.per_process]}


def time_files(files: Mapping[str, dict[str, Any]], x: torch.Tensor, y: np.ndarray,
               config: BenchConfig, extra: Mapping[str, Path] | None = None
               ) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], float], dict[str, float | None]]:
    """Every file timed with runtime_bench (fresh processes, interleaved; the original's fp32 file first), and the
    ``extra`` files by their keys: per (``variant.precision`` or key, batch) the per-process p50s and the pooled p50,
    and each file's held-out top-1 (%)."""
    entries = [ModelEntry(f"{name}.{p}", Path(f["paths"][p])) for name, f in files.items() for p in PRECISIONS]
    entries += [ModelEntry(key, path) for key, path in (extra or {}).items()]
    report = run_benchmark(entries, config, x.numpy(), y, progress=say)
    procs = {(r.model, r.batch_size): list(r.process_p50_ms) for r in report.latency if r.provider == "cpu"}
    pooled = {(r.model, r.batch_size): r.stats.p50_ms for r in report.latency if r.provider == "cpu"}
    top1 = {m.model: None if m.accuracy is None else round(100 * m.accuracy, 2) for m in report.metrics}
    return procs, pooled, top1


def latency_rows(names: Sequence[str], procs: Mapping[tuple[str, int], list[float]],
                 pooled: Mapping[tuple[str, int], float], batches: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per variant, precision and batch: pooled p50 (ms), the per-process p50s, and per-process ratios to the
    original's INT8 and fp32 files."""
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        for p in PRECISIONS:
            per_batch = {}
            for b in batches:
                own = procs[(f"{name}.{p}", b)]
                per_batch[str(b)] = {
                    "p50_ms": round(pooled[(f"{name}.{p}", b)], 4), "process_p50_ms": [round(v, 4) for v in own],
                    **{f"vs_{ORIGINAL}_{ref}": _ratio(own, procs[(f"{ORIGINAL}.{ref}", b)]) for ref in PRECISIONS}}
            rows.setdefault(name, {})[p] = per_batch
    return rows


def write_unaligned(original: Mapping[str, Any], calib: torch.Tensor, folder: Path) -> Path:
    """The original's INT8 file quantised with ``align_channels=False`` (its 3-channel stem left as it is)."""
    out = folder / f"{ORIGINAL}-unaligned.int8.onnx"
    quantize_int8(Path(original["paths"]["fp32"]), out, calib.numpy(), QuantConfig(align_channels=False))
    return out


def stem_block(procs: Mapping[tuple[str, int], list[float]], pooled: Mapping[tuple[str, int], float],
               top1: Mapping[str, float | None], profile: Mapping[str, Any], batches: Sequence[int]
               ) -> dict[str, Any]:
    """The stem's widening measured: per batch, the aligned original INT8 file's p50 against the unaligned one's in
    the same processes, and each file's stem convolution (input channels, µs, GMAC/s) from the profile."""
    out: dict[str, Any] = {"heldout_top1": {"aligned": top1.get(f"{ORIGINAL}.int8"), "unaligned": top1.get(UNALIGNED)}}
    for b in batches:
        stems = {}
        for key, name in (("aligned", ORIGINAL), ("unaligned", UNALIGNED)):
            run = profile[str(b)][name]
            first = next((r for r in run["convs"] if r["cin"] < 16 and r["group"] == 1), None)  # 3 or 4 channels
            stems[key] = None if first is None else {
                **{k: first[k] for k in ("cin", "cout", "macs", "us", "gmac_per_s", "sym_kernel_expected")},
                "share_of_total": round(first["us"] / run["total_us"], 4) if run["total_us"] else None}
        if stems["aligned"] and stems["unaligned"] and stems["aligned"]["us"]:  # the zero channel's MACs do no work
            stems["aligned"]["useful_gmac_per_s"] = round(stems["unaligned"]["macs"] / stems["aligned"]["us"] / 1e3, 1)
        out[str(b)] = {"p50_ms": {"aligned": round(pooled[(f"{ORIGINAL}.int8", b)], 4),
                                  "unaligned": round(pooled[(UNALIGNED, b)], 4)},
                       "aligned_vs_unaligned": _ratio(procs[(f"{ORIGINAL}.int8", b)], procs[(UNALIGNED, b)]),
                       "stem_conv": stems}
    return out


def stem_sentence(stem: Mapping[str, Any]) -> str:
    """The stem's widening in words: the widened original INT8 file's p50 over the unwidened one's, per batch."""
    parts = [f"batch {b} {stem[str(b)]['aligned_vs_unaligned']['median']:.3f}x "
             f"({stem[str(b)]['aligned_vs_unaligned']['min']:.3f}-{stem[str(b)]['aligned_vs_unaligned']['max']:.3f})"
             for b in BATCHES if str(b) in stem]
    return " The original's INT8 with its stem widened to 4 channels, against without: " + ", ".join(parts) + "."


# ---------------------------------------------------------------------------------------------------- the profile
def sym_kernel_expected(cin: int, cout: int, group: int, avx512: bool) -> bool:
    """Whether MLAS may run a QLinearConv with symmetric int8 weights (zero point 0, as ``QuantConfig`` writes
    them on the CPU) through its indirect symmetric kernel ``MlasConvSym`` instead of im2col and a packed GEMM: the
    conditions of ``MlasConvSymPackWSize`` (onnxruntime ``core/mlas/lib/convsym.cpp``, x86): an ungrouped conv
    whose input channels are a multiple of 4 and whose output channels are at least 16 (the filter packs 16
    output channels at a time, zero-padded) and a multiple of 4 (AVX-512) or 8 (AVX2, AVX-VNNI); or a depthwise
    conv (one input and one output channel per group) of a multiple of 16 groups. ``avx512``: the CPU has
    AVX-512F and BW (MLAS's AVX-512 core or VNNI dispatch)."""
    if group > 1:
        return cin == cout == group and group % 16 == 0
    return cin % 4 == 0 and cout >= 16 and cout % (4 if avx512 else 8) == 0


def conv_rows(kernels: Sequence[KernelTime], batch: int, avx512: bool) -> list[dict[str, Any]]:
    """One row per convolution kernel of a profile: channels, kernel size, output pixels, MACs, median µs,
    GMAC/s and whether MLAS's symmetric kernel is expected (:func:`sym_kernel_expected`)."""
    rows = []
    for k in kernels:
        if k.op_type not in CONV_OPS or k.macs is None:
            continue
        index = CONV_WEIGHT_INPUT.get(k.op_type, 1)
        w, x = k.inputs[index] if len(k.inputs) > index else None, k.inputs[0]
        if not w or not x or len(w) < 3 or len(x) < 3:
            continue  # shapes the profile did not record: no row rather than a guessed one
        cout, cin_g, taps = w[0], w[1], int(np.prod(w[2:]))
        cin = x[-1] if channels_last(k, cout, cin_g) else x[1]
        group = max(1, cin // max(cin_g, 1))
        rows.append({"node": k.name, "op": k.op_type, "cin": cin, "cout": cout, "kernel": taps, "group": group,
                     "pixels": k.macs // max(batch * cout * cin_g * taps, 1), "macs": k.macs,
                     "us": round(k.median_us, 1),
                     "gmac_per_s": round(k.macs / k.median_us / 1e3, 1) if k.median_us > 0 else None,
                     "sym_kernel_expected": sym_kernel_expected(cin, cout, group, avx512)})
    return rows


def channels_last(k: KernelTime, cout: int, cin_g: int) -> bool:
    """Whether a convolution kernel runs on NHWC tensors: ``NhwcQLinearConv`` always; a ``QLinearConv`` (ONNX Runtime's
    NHWC transformer keeps that name) when its output's last axis, not its second, holds the output channels — or,
    where both do (an NHWC output whose height equals its channels), when the input's last axis, not its second, holds
    the weight's channels (or, grouped, is the only one of the two they divide)."""
    if k.op_type == "NhwcQLinearConv":
        return True
    y, x = (k.outputs[0] if k.outputs else None), k.inputs[0]
    if k.op_type != "QLinearConv" or not y or len(y) < 3 or y[-1] != cout:
        return False
    if y[1] != cout:
        return True
    if not x or x[1] == cin_g:  # an ungrouped NCHW convolution reads its weight's channels on axis 1
        return False
    return x[-1] == cin_g or (x[-1] % max(cin_g, 1) == 0 and x[1] % max(cin_g, 1) != 0)


def by_out_channels(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Convolutions grouped by output channels: count, MACs, µs and GMAC/s of the group."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(str(r["cout"]), {"convs": 0, "macs": 0, "us": 0.0})
        g["convs"] += 1
        g["macs"] += r["macs"]
        g["us"] += r["us"]
    for g in out.values():
        g["us"] = round(g["us"], 1)
        g["gmac_per_s"] = round(g["macs"] / g["us"] / 1e3, 1) if g["us"] else None
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def profile_variant(path: Path, x: np.ndarray, batch: int, threads: int, avx512: bool) -> dict[str, Any]:
    """One file's kernels at ``batch`` (:func:`minreal.runtime_bench.node_profile.profile_kernels`, the timed sessions'
    options plus profiling): time by op type, every convolution's row and the convolutions by output channels."""
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    kernels = profile_kernels(path, "CPUExecutionProvider", threads, {name: x[:batch]}, PROFILE_RUNS, PROFILE_WARMUP)
    rows = conv_rows(kernels, batch, avx512)
    conv_us = sum(r["us"] for r in rows)
    return {"total_us": round(sum(k.median_us for k in kernels), 1), "conv_us": round(conv_us, 1),
            "conv_macs": sum(r["macs"] for r in rows),
            "conv_gmac_per_s": round(sum(r["macs"] for r in rows) / conv_us / 1e3, 1) if conv_us else None,
            "by_op": op_totals(kernels), "by_out_channels": by_out_channels(rows), "convs": rows}


def profile_files(files: Mapping[str, dict[str, Any]], x: np.ndarray, threads: int) -> dict[str, Any]:
    """Every INT8 file profiled at each batch size, and per cut its INT8 convolution time against the original's
    next to its convolution MAC ratio: where the time that the MACs promise to save goes."""
    avx512 = {"avx512f", "avx512bw"} <= set(cpu_isa().flags)
    out: dict[str, Any] = {}
    for b in BATCHES:
        per = {name: profile_variant(Path(f["paths"]["int8"]), x, b, threads, avx512) for name, f in files.items()}
        say(f"profiled {len(per)} INT8 files at batch {b}")
        base = per[ORIGINAL]
        for p in per.values():
            p["versus_original"] = {
                "conv_macs": round(p["conv_macs"] / base["conv_macs"], 4) if base["conv_macs"] else None,
                "conv_us": round(p["conv_us"] / base["conv_us"], 4) if base["conv_us"] else None,
                "other_us": round((p["total_us"] - p["conv_us"]) / max(base["total_us"] - base["conv_us"], 1e-9), 4),
                "total_us": round(p["total_us"] / base["total_us"], 4) if base["total_us"] else None}
        out[str(b)] = per
    return out


# ------------------------------------------------------------------------------------------------------ the goal
def goal_row(cut: UniformCut, timed: str, files: Mapping[str, dict[str, Any]],
             rows: Mapping[str, dict[str, Any]], batches: Sequence[int]) -> dict[str, Any]:
    """The goal for one cut: INT8 latency ratio to the original's INT8 (per batch) against MAC ratio + SLACK."""
    mac = files[timed]["macs"] / files[ORIGINAL]["macs"]
    bound = mac + SLACK
    row = {"cut": cut.name, "ladder": cut.ladder, "target": cut.target, "timed_as": timed,
           "fraction": cut.fraction, "mac_ratio": round(mac, 4), "predicted_mac_ratio": round(cut.mac_ratio, 4),
           "reaches_target": abs(mac - cut.target) <= REACHED, "bound": round(bound, 4),
           "bound_at_target": round(cut.target + SLACK, 4)}
    for b in batches:
        r = rows[timed]["int8"][str(b)][f"vs_{ORIGINAL}_int8"]
        row[f"b{b}"] = {"int8_ratio": r["median"], "min": r["min"], "max": r["max"], "met": r["median"] <= bound,
                        "met_in_every_process": r["max"] <= bound,
                        "met_at_target": r["median"] <= cut.target + SLACK}
    row["met"] = row[f"b{GOAL_BATCH}"]["met"]
    return row


def goal_table(cuts: Sequence[UniformCut], files: Mapping[str, dict[str, Any]], rows: Mapping[str, dict[str, Any]],
               batches: Sequence[int]) -> list[dict[str, Any]]:
    """:func:`goal_row` of every cut."""
    timed = unique_cuts(cuts)
    return [goal_row(c, timed[c.name], files, rows, batches) for c in cuts]


def _versus_m8(points: Sequence[tuple[float, float]], ladder_points: Sequence[tuple[float, float]]
               ) -> list[dict[str, float]]:
    """Each (MAC ratio, latency ratio) of ``ladder_points`` with m8's latency ratio interpolated at its MAC ratio
    (m8's points and the original at (1, 1)); points outside m8's range are left out."""
    xs, ys = np.array(sorted([*points, (1.0, 1.0)])).T
    out = []
    for m, r in ladder_points:
        if xs[0] <= m <= 1.0:
            m8 = float(np.interp(m, xs, ys))
            out.append({"mac_ratio": round(m, 4), "ratio": round(r, 4), "m8_ratio": round(m8, 4),
                        "versus_m8": round(r / m8, 4)})
    return out


def multiples(goals: Sequence[dict[str, Any]], rows: Mapping[str, dict[str, Any]],
              batches: Sequence[int]) -> dict[str, Any]:
    """Per precision and batch, each ladder's latency ratios (to the original in the same precision) against
    ``m8``'s at the same MAC ratio: ``versus_m8`` below 1 means that ladder's cuts run faster than m8's would at
    equal MACs; ``median_versus_m8`` summarises each ladder."""
    out: dict[str, Any] = {}
    for p in PRECISIONS:
        for b in batches:
            by_ladder: dict[str, dict[str, tuple[float, float]]] = {}
            for g in goals:  # a file once per ladder, however many of its targets it serves
                r = rows[g["timed_as"]][p][str(b)][f"vs_{ORIGINAL}_{p}"]["median"]
                by_ladder.setdefault(g["ladder"], {})[g["timed_as"]] = (g["mac_ratio"], r)
            if "m8" not in by_ladder:
                continue
            m8 = list(by_ladder["m8"].values())
            cell = {ladder: {"points": _versus_m8(m8, list(pts.values()))} for ladder, pts in by_ladder.items()
                    if ladder != "m8"}
            for entry in cell.values():
                vs = [pt["versus_m8"] for pt in entry["points"]]
                entry["median_versus_m8"] = round(float(np.median(vs)), 4) if vs else None
            out[f"{p}/b{b}"] = {"m8": sorted(m8), **cell}
    return out


def verdict(goals: Sequence[dict[str, Any]], compared: Mapping[str, Any]) -> str:
    """The conclusion in words: the goal per cut at batch 32, and each ladder against m8 per precision."""
    met = [f"{g['cut']} (MAC {g['mac_ratio']:.2f}: {g[f'b{GOAL_BATCH}']['int8_ratio']:.2f}x "
           f"{'<=' if g['met'] else '>'} {g['bound']:.2f})" for g in goals]
    text = f"INT8 at batch {GOAL_BATCH}, cut's p50 / original's INT8 p50 against MAC ratio + {SLACK}: " + "; ".join(met)
    for key, cell in compared.items():
        others = [f"{ladder} {entry['median_versus_m8']:.3f}x" for ladder, entry in cell.items()
                  if ladder != "m8" and entry["median_versus_m8"] is not None]
        if others:
            text += f". {key}, latency against m8 at equal MACs: " + ", ".join(others)
    return text + "."


# ---------------------------------------------------------------------------------------------------- the setting
def environment(threads: int) -> dict[str, Any]:
    """This machine: CPU, int8-relevant flags, its INT8 format, the NCHWc block MLAS uses, versions, commit."""
    import onnxruntime

    isa = cpu_isa()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "compress", "export", "runtime_bench"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    flags = set(isa.flags)
    return {"cpu_model": cpu_model(), "arch": isa.arch, "cpu_flags": sorted(flags),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "avx512_vnni": "avx512_vnni" in flags,
            "nchwc_block_expected": 16 if "avx512f" in flags else 8 if "avx2" in flags else None,
            "cpu_int8_target": cpu_int8_target(), "u8s8_saturates": u8s8_saturates(),
            "width_multiple_cpu_default": WIDTH_MULTIPLE_BY_PROVIDER["cpu"],
            "width_min_cpu_default": WIDTH_MIN_BY_PROVIDER["cpu"], "intra_op_threads": threads,
            "logical_cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "commit": commit, "library_changes_uncommitted": bool(dirty),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": list(os.getloadavg())}


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """runtime_bench's protocol with ``--processes`` and ``--min-seconds``; a short one with ``--quick``."""
    config = BenchConfig(providers=("cpu",), batch_sizes=BATCHES, repeats=args.processes,
                         min_seconds=args.min_seconds, intra_op_threads=args.threads)
    return replace(config, warmup=2, min_runs=5) if args.quick else config


def settings(args: argparse.Namespace, config: BenchConfig) -> dict[str, Any]:
    """The document's settings block."""
    return {"ladders": {k: asdict(LADDERS[k]) for k in args.ladders}, "targets": list(args.targets),
            "slack": SLACK, "goal_batch": GOAL_BATCH, "reached_within": REACHED,
            "fractions": [FRACTIONS[0], FRACTIONS[-1], round(FRACTIONS[1] - FRACTIONS[0], 3)],
            "quantization": "minreal.export.int8.quantize_int8(QuantConfig()): static QDQ, this CPU's format, "
                            "calibrated on 256 images (seed 0) of the first 7,000",
            "weights": "highest-L1 channels per segment (magnitude_importance), no recovery",
            "timing": {"provider": "cpu", "batch_sizes": list(BATCHES), "processes": config.repeats,
                       "warmup": config.warmup, "min_runs": config.min_runs, "min_seconds": config.min_seconds,
                       "intra_op_threads": config.threads(),
                       "statistic": "pooled p50; ratios per process to the original's file timed in that process, "
                                    "then median, min, max"}}


def stop_without_shared_data() -> None:
    """One line and exit status 2 when ``../shared/data`` lacks the model or the images (a user's clone)."""
    missing = [p for p in (RESNET32, CIFAR) if not p.is_file()]
    if missing:
        print(f"int8_width: {missing[0]} is missing (../shared/data is absent or incomplete, as in a user's clone); "
              "nothing measured", file=sys.stderr)
        sys.exit(2)


def print_plan(ladders: Sequence[str], targets: Sequence[float]) -> None:
    """The cuts on ResNet-32's architecture (random weights: MACs do not depend on them), one line each."""
    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=5).eval()
    wg = analyse(model, torch.randn(2, 3, 32, 32))
    cuts = plan_cuts(wg, ladders, targets)
    timed = unique_cuts(cuts)
    for c in cuts:
        same = "" if timed[c.name] == c.name else f" (same widths as {timed[c.name]})"
        print(f"  {c.name:14} fraction {c.fraction:.3f} -> MAC ratio {c.mac_ratio:.3f}; conv out channels "
              f"{conv_channels(narrowed(wg, c.widths))}{same}")


# ----------------------------------------------------------------------------------------------------------- main
def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--processes", type=int, help="fresh timing processes per batch size (default 5; --quick 2)")
    ap.add_argument("--min-seconds", type=float, help="timing window per process (default 2; --quick 0.2)")
    ap.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: physical cores)")
    ap.add_argument("--work", type=Path, help="keep the ONNX files here (default: a temporary folder)")
    ap.add_argument("--plan", action="store_true", help="print the cuts (no data needed, nothing written) and stop")
    ap.add_argument("--quick", action="store_true", help="smoke test: m8 at 0.5 only, 2 processes, short timing")
    args = ap.parse_args()
    if args.quick and not args.plan and args.out.resolve() == DEFAULT_OUT.resolve():
        ap.error("--quick needs its own --out (it must not overwrite benchmarks/int8_width.json)")
    args.processes = args.processes or (2 if args.quick else 5)
    args.min_seconds = args.min_seconds if args.min_seconds is not None else (0.2 if args.quick else 2.0)
    args.ladders = QUICK_LADDERS if args.quick else tuple(LADDERS)
    args.targets = QUICK_TARGETS if args.quick else TARGETS
    return args


def measure(args: argparse.Namespace, config: BenchConfig, work: Path) -> dict[str, Any]:
    """Cut, write and time every file; the document's measured blocks."""
    say("loading the pretrained ResNet-32 and the CIFAR-10 images")
    case = cifar_case(QUICK_HELDOUT if args.quick else HELDOUT)
    assert case is not None  # stop_without_shared_data ran first
    wg = analyse(case.model, case.calib[:2])
    cuts = plan_cuts(wg, args.ladders, args.targets)
    say(f"{len(cuts)} cuts: " + ", ".join(f"{c.name} -> {c.mac_ratio:.3f}" for c in cuts))
    files = write_files(case.model, wg, cuts, case.calib, work)
    unaligned = write_unaligned(files[ORIGINAL], case.calib, work)
    say(f"timing {2 * len(files) + 1} files at batch {', '.join(map(str, BATCHES))} in {config.repeats} processes")
    before = cpu_times()
    procs, pooled, top1 = time_files(files, case.x, case.y, config, {UNALIGNED: unaligned})
    timing_share = cpu_share(before, cpu_times())
    say(f"profiling the INT8 files' kernels ({PROFILE_RUNS} runs after {PROFILE_WARMUP} warm-up, one process)")
    profile = profile_files({**files, UNALIGNED: {"paths": {"int8": str(unaligned)}}}, case.x.numpy(),
                            config.threads())
    stem = stem_block(procs, pooled, top1, profile, BATCHES)
    rows = latency_rows(list(files), procs, pooled, BATCHES)
    goals = goal_table(cuts, files, rows, BATCHES)
    compared = multiples(goals, rows, BATCHES)
    variants = {name: {**f, "paths": {p: Path(v).name for p, v in f["paths"].items()}, "latency": rows[name],
                       "heldout_top1": {p: top1.get(f"{name}.{p}") for p in PRECISIONS}} for name, f in files.items()}
    return {"heldout_samples": len(case.y), "cpu_share_timing": timing_share,
            "cuts": [asdict(c) | {"name": c.name} for c in cuts], "variants": variants, "goal": goals,
            "goal_met_everywhere": all(g["met"] for g in goals), "multiples": compared, "profile": profile,
            "stem": stem,
            "verdict": verdict(goals, compared) + stem_sentence(stem)}


def main() -> None:
    args = parse()
    if args.plan:
        print_plan(args.ladders, args.targets)
        return
    stop_without_shared_data()
    config = bench_config(args)
    start = cpu_times()
    doc: dict[str, Any] = {"usage": USAGE, "issue": "28 item 2: INT8 of structured models keeps the saving",
                           "quick": args.quick, "environment": environment(config.threads()),
                           "settings": settings(args, config),
                           "note": "accuracy: held-out top-1 without recovery, a check of the files, not a result"}
    with nullcontext(args.work) if args.work else tempfile.TemporaryDirectory(prefix="int8-width-") as work:
        doc.update(measure(args, config, Path(work)))
    doc["cpu_share_run"] = cpu_share(start, cpu_times())
    doc["environment"]["loadavg_end"] = list(os.getloadavg())
    doc["wall_s"] = round(time.perf_counter() - _T0, 1)
    write_json(args.out, doc)
    print(doc["verdict"])
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
