"""Width latency tables (``minreal latency-table --kind width``) and the width allocator that reads them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minreal.export.latency_table as latency_table
from minreal.app.cli import run
from minreal.compress import CompressionError
from minreal.compress.core.cache import model_key
from minreal.compress.core.options import WIDTH_MIN_BY_PROVIDER, WIDTH_MULTIPLE_BY_PROVIDER
from minreal.compress.core.width import analyse
from minreal.compress.core.width.allocate import (
    allocate_widths,
    calibrated_saving,
    check_width_table,
    load_width_latency_table,
    saving_curve,
    segment_key,
)
from minreal.export.latency_table import build_latency_table, build_width_latency_table

MULTIPLE = 8

PLAIN_CNN = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
"""


class _Block(nn.Module):
    """Basic block; a widening block has the option-A shortcut (subsample, zero-pad the new channels)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.pad = (cout - cin) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        short = x if self.pad == 0 else F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
        return F.relu(out + short)


class _TinyResNet(nn.Module):
    """Stem 32 channels, a 32-channel block and a 32→64 option-A block, on 3×16×16 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32)
        self.blocks = nn.Sequential(_Block(32, 32, 1), _Block(32, 64, 2))
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.blocks(F.relu(self.bn(self.conv(x)))), 1)
        return self.fc(out.view(out.size(0), -1))  # as CIFAR ResNets write it: a batch of one must not freeze it


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(6)
    return _TinyResNet().eval()


@pytest.fixture(scope="module")
def width_table(resnet: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One measured table shared by the tests that only read it (each build exports and times ~15 models)."""
    out = tmp_path_factory.mktemp("width") / "table.json"
    torch.manual_seed(7)
    table = build_width_latency_table(resnet, torch.randn(1, 3, 16, 16), "cpu", MULTIPLE, out_path=out, threads=1)
    return out, table


def _keys(model: nn.Module) -> dict[str, int]:
    """Table key → segment size of every cuttable group's segments (analysed on two samples)."""
    wg = analyse(model, torch.randn(2, 3, 16, 16))
    return {segment_key(g.name, k): len(seg) for g in wg.cuttable() for k, seg in enumerate(wg.segments(g))}


def test_width_table_format(resnet: nn.Module, width_table: tuple[Path, dict]) -> None:
    out, table = width_table
    assert json.loads(out.read_text()) == table
    assert {k: table[k] for k in ("kind", "provider", "input_shape", "batch", "multiple")} == \
        {"kind": "width", "provider": "cpu", "input_shape": [3, 16, 16], "batch": 1, "multiple": MULTIPLE}
    assert table["model_ms"] > 0
    sizes = _keys(resnet)
    assert {k: e["size"] for k, e in table["segments"].items()} == sizes
    assert len(sizes) == 4  # the stem/residual group has two segments (32 channels, then 32 more in block 2)
    for entry in table["segments"].values():
        widths, size = entry["widths"], entry["size"]
        assert widths[0] == size and widths[1:] == list(range(size - MULTIPLE, 0, -MULTIPLE))
        assert len(entry["ms"]) == len(widths) and entry["ms"][0] == table["model_ms"]
        assert min(entry["ms"]) > 0


def test_width_table_reused_without_timing(resnet: nn.Module, width_table: tuple[Path, dict], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "table.json"
    out.write_text(width_table[0].read_text())
    calls = []
    timer = latency_table.time_interleaved
    monkeypatch.setattr(latency_table, "time_interleaved", lambda *a, **k: calls.append(1) or timer(*a, **k))
    stamp = out.stat().st_mtime_ns
    torch.manual_seed(7)
    again = build_width_latency_table(resnet, torch.randn(1, 3, 16, 16), "cpu", MULTIPLE, out_path=out, threads=1)
    assert again == width_table[1] and calls == [] and out.stat().st_mtime_ns == stamp
    other = build_width_latency_table(resnet, torch.randn(1, 3, 16, 16), "cpu", 16, out_path=out, threads=1)
    groups = len(analyse(resnet, torch.randn(2, 3, 16, 16)).cuttable())
    assert other["multiple"] == 16 and len(calls) == groups + 1  # rebuilt: one timing run per group + uniform cuts
    assert json.loads(out.read_text()) == other


def _predicted_ms(table: dict, wg, keep: dict[str, list[int]]) -> float:
    """Whole-model ms minus each segment's saving at its kept width (linear between measured widths), the sum
    scaled by the least-squares fit of summed to joint savings on the table's uniform cuts."""
    saving = 0.0
    for g in wg.cuttable():
        for k, seg in enumerate(wg.segments(g)):
            entry = table["segments"][segment_key(g.name, k)]
            width = len(set(seg) & set(keep.get(g.name, range(g.size))))
            order = np.argsort(entry["widths"])
            saving += table["model_ms"] - float(np.interp(width, np.array(entry["widths"])[order],
                                                          np.array(entry["ms"])[order]))
    return table["model_ms"] - calibrated_saving(saving_curve(table), saving)


def test_saving_curve_maps_summed_to_joint_savings() -> None:
    seg = {"size": 16, "widths": [16, 8], "ms": [10.0, 8.0]}
    table = {"model_ms": 10.0, "segments": {"a/0": dict(seg), "b/0": dict(seg)},
             "uniform": {"fractions": [0.5], "widths": {"a/0": [8], "b/0": [8]}, "ms": [5.0]}}
    curve = saving_curve(table)
    assert curve == [(0.0, 0.0), (4.0, 5.0)]  # summed saving 2 + 2, joint saving 10 - 5
    assert calibrated_saving(curve, 2.0) == pytest.approx(2.5) and calibrated_saving(curve, 8.0) == pytest.approx(10.0)
    table["uniform"]["ms"] = [10.5]  # a joint cut measured slower: no negative saving
    assert saving_curve(table) == [(0.0, 0.0), (4.0, 0.0)]
    del table["uniform"]
    assert calibrated_saving(saving_curve(table), 3.0) == 3.0


def test_allocator_meets_latency_ratio_from_width_table(resnet: nn.Module, width_table: tuple[Path, dict]) -> None:
    table = load_width_latency_table(width_table[0])
    wg = analyse(resnet, torch.randn(2, 3, 16, 16))
    scores = {g.name: torch.rand(g.size, generator=torch.Generator().manual_seed(8)) for g in wg.cuttable()}
    floor = _predicted_ms(table, wg, {g.name: [] for g in wg.cuttable()}) / table["model_ms"]
    assert floor < 0.9  # narrowing every segment to one multiple saves measurably on this model
    for ratio in (0.95, (1 + floor) / 2):
        keep = allocate_widths(wg, scores, "latency_ratio", ratio, multiple=MULTIPLE, latency=table)
        assert _predicted_ms(table, wg, keep) <= ratio * table["model_ms"] * (1 + 1e-9)
        for g in wg.cuttable():
            for seg in wg.segments(g):
                width = len(set(seg) & set(keep[g.name]))
                assert width == len(seg) or width % MULTIPLE == 0


def test_rank_table_where_width_table_needed(tiny_mlp: nn.Module, tmp_path: Path) -> None:
    out = tmp_path / "rank.json"
    build_latency_table(tiny_mlp, torch.randn(2, 12), ranks_per_layer=2, out_path=out, threads=1)
    with pytest.raises(CompressionError, match="--kind width") as info:
        load_width_latency_table(out)
    assert "\n" not in str(info.value)


def test_model_without_cuttable_group_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CompressionError, match="no channel group") as info:
        build_width_latency_table(nn.Linear(12, 5), torch.randn(1, 12), out_path=tmp_path / "t.json")
    assert "\n" not in str(info.value) and not (tmp_path / "t.json").exists()


def test_cli_width_latency_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "net.py").write_text(PLAIN_CNN)
    (tmp_path / "linear.py").write_text("from torch import nn\n\ndef make():\n    return nn.Linear(12, 5)\n")
    monkeypatch.chdir(tmp_path)
    argv = ["latency-table", "net.py:make", "--kind", "width", "--input-shape", "3,16,16", "--out", "t.json", "-q"]
    assert run(argv) == 0
    table = json.loads((tmp_path / "t.json").read_text())
    assert table["kind"] == "width" and table["multiple"] == WIDTH_MULTIPLE_BY_PROVIDER["cpu"] == 16  # the defaults
    assert table["minimum"] == WIDTH_MIN_BY_PROVIDER["cpu"] == 16
    assert {k: (e["size"], e["widths"]) for k, e in table["segments"].items()} == {"0/0": (16, [16]),
                                                                                   "2/0": (16, [16])}
    assert "2 segments, 0 narrower widths on cpu" in capsys.readouterr().out  # 16 channels: none below the minimum
    assert run([*argv[:-3], "--width-multiple", str(MULTIPLE), "--width-min", "0", "--out", "t8.json", "-q"]) == 0
    t8 = json.loads((tmp_path / "t8.json").read_text())
    assert (t8["multiple"], t8["minimum"]) == (MULTIPLE, 0)
    assert {k: e["widths"] for k, e in t8["segments"].items()} == {"0/0": [16, 8], "2/0": [16, 8]}
    argv = ["latency-table", "linear.py:make", "--kind", "width", "--input-shape", "12", "--out", "l.json", "-q"]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "no channel group" in err and "\n" not in err and not (tmp_path / "l.json").exists()


def test_int8_width_table_times_the_variants_int8_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``precision="int8"``: every timed file (the full model, each narrowed variant, the uniform cuts) is a static QDQ
    file; the table has the fp32 table's format with ``"precision": "int8"``, is reused as such, and the same path
    asked for in fp32 is measured again. A width method reports which precision its latency prediction is in."""
    from minreal.compress.core.data import Dataset
    from minreal.compress.methods.magnitude import MagnitudeConfig
    from minreal.compress.registry import compress

    timed: list[list[set[str]]] = []
    real = latency_table._time_files

    def recording(paths: list[Path], *args, **kwargs) -> list[float]:
        timed.append([{n.op_type for n in onnx.load(str(p)).graph.node} for p in paths])
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(latency_table, "_time_files", recording)
    monkeypatch.setattr(latency_table, "WHOLE_MODEL_TIMING", {"warmup": 1, "min_runs": 3, "min_seconds": 0.0})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)).eval()
    x, out = torch.randn(4, 3, 16, 16), tmp_path / "int8.json"
    table = build_width_latency_table(model, x, "cpu", MULTIPLE, out_path=out, threads=1, precision="int8")
    assert table["precision"] == "int8" and json.loads(out.read_text()) == table
    assert {k: e["widths"] for k, e in table["segments"].items()} == {"0/0": [16, 8], "2/0": [16, 8]}
    files = [ops for run in timed for ops in run]
    assert len(files) == len(timed) + 2 + 3  # each run's full model, two narrowed variants, three uniform cuts
    assert all({"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops for ops in files)
    calls = len(timed)
    assert build_width_latency_table(model, x, "cpu", MULTIPLE, out_path=out, threads=1, precision="int8") == table
    assert len(timed) == calls  # reused
    fp32 = build_width_latency_table(model, x, "cpu", MULTIPLE, out_path=out, threads=1)
    assert fp32["precision"] == "fp32" and len(timed) > calls
    assert not any("QuantizeLinear" in ops for run in timed[calls:] for ops in run)
    table = build_width_latency_table(model, x, "cpu", MULTIPLE, out_path=out, threads=1, precision="int8")
    # the prediction's precision is what is checked, not this machine's timings (a narrowed INT8 conv need not be
    # faster: ONNX Runtime's int8 kernels block output channels by 16): narrower is made faster by hand
    table["model_ms"] = 10.0
    for entry in table["segments"].values():
        entry["ms"] = [10.0 * w / entry["widths"][0] for w in entry["widths"]]
    table["uniform"]["ms"] = [10.0 * f for f in table["uniform"]["fractions"]]
    out.write_text(json.dumps(table))
    config = MagnitudeConfig(latency_ratio=0.99, latency_table=str(out), width_multiple=MULTIPLE)
    _, report = compress(model, Dataset(x), "magnitude", config)
    assert report.predicted["latency_table_precision"] == "int8"
    with pytest.raises(ValueError, match="cpu provider"):
        build_width_latency_table(model, x, "cuda", MULTIPLE, precision="int8")


def test_cli_int8_table_is_a_cpu_width_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "net.py").write_text(PLAIN_CNN)
    monkeypatch.chdir(tmp_path)
    for extra in (["--kind", "rank"], ["--kind", "width", "--providers", "cuda"]):
        argv = ["latency-table", "net.py:make", *extra, "--int8", "--input-shape", "3,16,16", "--out", "t.json", "-q"]
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert ("--int8 measures a width or depth table on the cpu provider: pass --kind width (or depth) --providers "
                "cpu") in err
    assert not (tmp_path / "t.json").exists()


def test_check_width_table_refuses_other_settings(resnet: nn.Module) -> None:
    """A width table serves an allocation on the same weights and multiple whose minimum is at least the table's
    (a higher one only chooses among measured widths; a lower one would need widths the table never timed)."""
    table = {"model_hash": model_key(resnet), "multiple": 8, "minimum": 16}
    check_width_table(table, "t.json", resnet, 8, 16)
    check_width_table(table, "t.json", resnet, 8, 32)
    check_width_table({"model_hash": model_key(resnet), "multiple": 8}, "t.json", resnet, 8, 0)  # older: minimum 0
    check_width_table({**table, "multiple": 16}, "t.json", resnet, 16, 10)  # 10 on multiples of 16 allows 16 too
    with pytest.raises(CompressionError, match=r"^width latency table t.json measured no width below 16 channels "
                                               r"but --width-min is 0; rebuild it with --width-min 0"):
        check_width_table(table, "t.json", resnet, 8, 0)
    with pytest.raises(CompressionError, match="steps by 8 channels but --width-multiple is 16"):
        check_width_table(table, "t.json", resnet, 16, 16)
    with pytest.raises(CompressionError, match="measured on another model"):
        check_width_table({**table, "model_hash": "0" * 16}, "t.json", resnet, 8, 16)
