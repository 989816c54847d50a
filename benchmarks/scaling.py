"""Statistics on one vs two processes (issue 17), and what more workers would give: a measured scaling model.

Workload: the second moments E[xxᵀ] of every Conv/Linear input of torchvision's resnet18 at 224x224 (the
statistics ``factorize`` spent most of its time on: 63 of 65 s for 256 images, before it took layers with fewer
outputs than inputs from the o × o Gram of their outputs), over 512 images. The weights are
random (seeded) and so are the images: the cost of the pass does not depend on their values, and nothing can be
downloaded here.

- ``one``: :func:`minreal.compress.core.stats.collect_moments` in one process with every core (torch's default threads).
- ``two``: the same call in every rank of ``torchrun --nproc-per-node 2`` (gloo; each rank one thread, so the two
  runs use the same cores): each rank takes its half of the images, the float64 sums are all-reduced. The
  all-reduce of the same accumulators is also timed on its own, to split compute from communication.
- ``check``: the two-process moments equal the one-process ones (relative difference of the sums; float32 products
  are summed in another order, so this is a sanity check, not an identity).
- ``model``: ``T(P) = T_compute / P + T_allreduce(P) + T_serial`` with a ring all-reduce
  ``T_allreduce(P) = 2 (P-1)/P · S / B + 2 (P-1) · α``, ``S`` the accumulator bytes, ``B`` and ``α`` the bandwidth and
  latency of the link. ``T_compute`` is the measured one-process time per image times the images; ``B`` comes from
  the measured two-rank gloo all-reduce on this machine (loopback, shared memory: an upper bound for a network),
  and the projection is also given for 10 Gb/s and 100 Gb/s links. ``T_serial`` (the eigendecompositions on rank 0)
  is not part of the pass timed here; it is measured separately once (``decomposition_s``).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/scaling.py --out benchmarks/scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import write_json
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/scaling.py --out benchmarks/scaling.json"
BATCH = 32


def say(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def workload(images: int) -> tuple[nn.Module, dict[str, nn.Module], Any]:
    """Seeded resnet18 (random weights), its Conv/Linear layers, and ``images`` seeded 3x224x224 inputs."""
    import torchvision

    from minreal.compress.core.data import Dataset

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    layers = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    x = torch.randn(images, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return model, layers, Dataset(x)


def moments(images: int) -> tuple[dict[str, torch.Tensor], float, int]:
    """The statistics pass: the sums by layer, its wall time (collectives included) and the accumulator bytes."""
    from minreal.compress.core.stats import collect_moments

    model, layers, data = workload(images)
    t0 = time.perf_counter()
    stats = collect_moments(model, layers, data, batch_size=BATCH)
    seconds = time.perf_counter() - t0
    size = sum(s.total.numel() * s.total.element_size() for s in stats.values())
    return {n: s.total for n, s in stats.items()}, seconds, size


def time_allreduce(sums: dict[str, torch.Tensor], repeats: int = 3) -> float:
    """Median seconds of all-reducing copies of the accumulators, layer by layer (as the pass does)."""
    import torch.distributed as dist

    from minreal.compress.core.distributed import all_reduce_sum

    times = []
    for _ in range(repeats):
        copies = [t.clone() for t in sums.values()]
        dist.barrier()
        t0 = time.perf_counter()
        for t in copies:
            all_reduce_sum(t)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def worker(out: Path, images: int) -> None:
    """One rank of the two-process run: the pass, then the all-reduce alone; rank 0 writes the sums and times."""
    from minreal.compress.core.distributed import is_writer, process_group

    torch.set_num_threads(1)
    with process_group(backend="gloo", timeout_s=1800):
        sums, seconds, size = moments(images)
        allreduce_s = time_allreduce(sums)
        if is_writer():
            torch.save({"sums": sums, "seconds": seconds, "bytes": size, "allreduce_s": allreduce_s}, out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(images: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "two.pt"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(_free_port()), str(Path(__file__).resolve()), "--worker", str(out), "--images",
                        str(images)], check=True, cwd=ROOT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        wall = time.perf_counter() - t0
        return {**torch.load(out, weights_only=True), "launch_wall_s": wall}


def decomposition_seconds(sums: dict[str, torch.Tensor]) -> float:
    """The serial part after the pass: one symmetric eigendecomposition per layer's moment (what the whitening
    needs), in float64 on this process."""
    t0 = time.perf_counter()
    for total in sums.values():
        torch.linalg.eigh(total[0] if total.dim() == 3 else total)
    return time.perf_counter() - t0


def projection(per_image_s: float, images: int, size: int, calls: int, serial_s: float,
               links: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """``T(P)`` for 1, 2, 8 and 64 workers per link (bandwidth bytes/s, latency s), the terms kept apart;
    ``calls`` all-reduces of ``size`` bytes in all."""
    out = {}
    for name, (bandwidth, latency) in links.items():
        rows = {}
        for p in (1, 2, 8, 64):
            compute = per_image_s * images / p
            comm = 0.0 if p == 1 else 2 * (p - 1) / p * size / bandwidth + 2 * (p - 1) * latency * calls
            rows[str(p)] = {"compute_s": round(compute, 3), "allreduce_s": round(comm, 3),
                            "serial_s": round(serial_s, 3), "total_s": round(compute + comm + serial_s, 3),
                            "speedup": round((per_image_s * images + serial_s) / (compute + comm + serial_s), 2)}
        out[name] = {"bandwidth_bytes_per_s": bandwidth, "latency_s": latency, "workers": rows}
    return out


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/scaling.json"))
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse()
    if args.worker:
        worker(args.worker, args.images)
        return
    doc: dict[str, Any] = {"usage": USAGE, "issue": 17, "header": {
        "torch": torch.__version__, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": list(os.getloadavg())},
        "setting": {"model": "torchvision resnet18, random weights (seed 0), eval mode", "input": "3x224x224",
                    "images": args.images, "batch_size": BATCH,
                    "pass": "minreal.compress.core.stats.collect_moments over "
                    "every Conv2d/Linear input (float64 products)", "one_process_threads": torch.get_num_threads(),
                    "two_process_threads_per_rank": 1, "backend": "gloo"}}
    say(f"one process, {torch.get_num_threads()} threads")
    sums, one_s, size = moments(args.images)
    say(f"one process: {one_s:.1f} s; two processes (torchrun, gloo)")
    two = two_processes(args.images)
    worst = max(float((two["sums"][n] - s).abs().max() / s.abs().max().clamp_min(1e-300)) for n, s in sums.items())
    serial = decomposition_seconds(sums)
    per_image = one_s / args.images
    bandwidth = 2 * (2 - 1) / 2 * size / two["allreduce_s"]  # what the measured two-rank ring moved per second
    doc["measured"] = {
        "one_process_s": round(one_s, 2), "two_processes_pass_s": round(float(two["seconds"]), 2),
        "two_processes_launch_wall_s": round(two["launch_wall_s"], 2),
        "speedup_two_vs_one": round(one_s / float(two["seconds"]), 3),
        "per_image_s_one_process": round(per_image, 5), "accumulator_bytes": size, "allreduce_calls": len(sums),
        "allreduce_two_ranks_s": round(float(two["allreduce_s"]), 3),
        "effective_allreduce_bandwidth_bytes_per_s": round(bandwidth), "decomposition_s": round(serial, 2),
        "max_relative_difference_two_vs_one": worst, "loadavg_end": list(os.getloadavg())}
    doc["model"] = {"formula": "T(P) = T_compute/P + 2(P-1)/P*S/B + 2(P-1)*alpha*calls + T_serial",
                    "projection": projection(per_image, args.images, size, len(sums), serial, {
                        "measured loopback (gloo, this machine)": (bandwidth, 0.0),
                        "10 Gb/s Ethernet (1.25 GB/s, 50 us)": (1.25e9, 50e-6),
                        "100 Gb/s InfiniBand (12.5 GB/s, 5 us)": (12.5e9, 5e-6)})}
    doc["verdict"] = (f"{args.images} images: one process {one_s:.1f} s, two processes {float(two['seconds']):.1f} s "
                      f"(x{one_s / float(two['seconds']):.2f}) on {os.cpu_count()} shared cores: the two ranks split "
                      "the same cores, so no speed-up is expected here; the all-reduce of "
                      f"{size / 2**20:.0f} MiB took {float(two['allreduce_s']):.2f} s.")
    write_json(args.out, doc)
    print(json.dumps(doc["measured"], indent=1))
    print(doc["verdict"])
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
