"""minreal.export.variant's refusals: a model whose exported graph ONNX Runtime cannot run at another batch size
than the one it was exported at is refused in one line of ours, not ONNX Runtime's exception."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.export.errors import ExportError
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant


class LoopsOverTheBatch(nn.Module):
    """Runs its convolution on one image at a time, as torchvision's detection models take a list of images: the
    loop over the batch is unrolled at export, so the graph runs at the exported batch size only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.conv(image.unsqueeze(0))[0] for image in x])


def test_a_forward_that_fixes_the_batch_size_is_refused_in_one_line(tmp_path: Path) -> None:
    """zoo (issue 44): fasterrcnn_mobilenet_v3_large_320_fpn's export ended in ONNX Runtime's own ``Fail`` (a Split
    node fixed at the exported batch of 2 fed a batch of 3), recorded as a failed stage with ONNX Runtime's words."""
    out = tmp_path / "loops.onnx"
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ExportError) as refused:
        export_variant(LoopsOverTheBatch().eval(), x, out, VariantConfig())
    line = str(refused.value)
    assert line.startswith("LoopsOverTheBatch exported at batch 2 does not run at batch 3 in ONNX Runtime: its "
                           "forward fixes the batch size")
    assert "give a forward that takes the batch as one tensor" in line and "\n" not in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_record_holds_the_wall_time_of_each_phase(tmp_path: Path) -> None:
    """The tool's own cost by phase: every phase of an export is timed once, in order, and together they account
    for no more than the call's wall time (each phase rounded to the millisecond)."""
    import time

    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    record = export_variant(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), x, tmp_path / "m.onnx",
                            VariantConfig())
    wall = time.perf_counter() - start
    phases = ["export", "simplify", "parity", "fixed_shapes", "costs", "checks"]
    assert list(record.timings_s) == phases and all(s >= 0 for s in record.timings_s.values())
    assert sum(record.timings_s.values()) <= wall + 0.0005 * len(phases)
    assert record.to_json()["timings_s"] == record.timings_s


def test_laps_add_up_and_taken_phases_are_not_counted_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Laps``: a lap closes the time since the previous one; phases taken from a callee are added, and the clock
    restarts so the next lap does not count their time again."""
    from minreal.export import record

    now = iter([10.0, 11.5, 14.0, 20.0, 20.25, 21.0])
    monkeypatch.setattr(record.time, "perf_counter", lambda: next(now))
    laps = record.Laps()  # 10.0
    laps.lap("load")  # 11.5: 1.5 s
    laps.lap("int8")  # 14.0: 2.5 s
    laps.take({"export": 5.0, "int8": 0.5})  # the callee's 6 s (14.0 → 20.0); clock restarts at 20.0
    laps.lap("load")  # 20.25: 0.25 s more
    assert laps.timings == {"load": 1.75, "int8": 3.0, "export": 5.0}


class SelfAttention(nn.Module):
    """One head of self-attention written with matmuls: four Linears (the layer rules count them) and two matmuls
    of the sequence with itself (only torch's count sees them)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 4, dim=-1)
        return self.o(scores @ self.v(x))


def test_the_record_counts_attention_s_matmuls_alike_from_python_and_from_its_program(tmp_path: Path) -> None:
    """The record's MACs were the layer rules' sum (the Linears) for a model from Python, torch's count (the matmuls
    too) for its .pt2 program, and the compression report's count beside the run table's ratio of the rules' sums:
    now each is the whole model's, as the compression report counts it."""
    from minreal.app.models import load_model

    length, width = 10, 16
    torch.manual_seed(0)
    model, x = SelfAttention(width).eval(), torch.randn(4, length, width)
    program = torch.export.export(model, (x[:2],), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "attention.pt2")
    from_python = export_variant(model, x, tmp_path / "py.onnx", VariantConfig())
    from_program = export_variant(load_model(str(tmp_path / "attention.pt2")), x, tmp_path / "pt2.onnx",
                                  VariantConfig())
    linears, matmuls = 4 * length * width * width, 2 * length * length * width
    assert from_python.macs == from_program.macs == linears + matmuls


class SequenceFirst(nn.Module):
    """``nn.MultiheadAttention`` with the sequence first, as its default takes it: the output's first axis is the
    sequence, not the batch."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.transpose(0, 1)
        return self.attn(seq, seq, seq, need_weights=False)[0].transpose(0, 1)


def test_the_record_counts_one_sample_of_a_sequence_first_layer_and_says_at_which_shape(tmp_path: Path) -> None:
    """Review: the record's rules ran on two samples, and a sequence-first layer at length 2 (its output's first
    axis equal to that batch) was counted for both samples: twice its MACs. Closed form of one sample: the four
    projections 4·L·E² and the fused attention's two L·L·E products."""
    length, width = 2, 16
    torch.manual_seed(0)
    record = export_variant(SequenceFirst(width).eval(), torch.randn(4, length, width), tmp_path / "s.onnx",
                            VariantConfig())
    assert record.macs == 4 * length * width * width + 2 * length * length * width
    assert record.macs_at == {"input": [length, width]}


def test_the_record_of_an_ssm_model_states_the_compression_report_s_count(tmp_path: Path) -> None:
    """Review: with the record's MACs the compression report's, a run's table put the rotation layer (its FFT
    counted by its rule) beside the truncated modal layer's chunked convolution (counted by torch): 3.2 times the
    MACs for half the states. Both records and the report now count SSM layers by their rule."""
    from minreal.compress import compress
    from minreal.compress.core.data import Dataset
    from minreal.compress.methods.ssm import RotationSSM

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), RotationSSM(16, 8), nn.Linear(16, 4)).eval()
    data = Dataset(torch.randn(32, 16, 8))
    small, report = compress(model, data, "ssm")
    records = [export_variant(m, data.x, tmp_path / f"{name}.onnx", VariantConfig())
               for name, m in (("original", model), ("ssm", small))]
    assert [r.macs for r in records] == [report.macs_before, report.macs_after]
    assert report.macs_after < report.macs_before
