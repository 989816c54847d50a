"""Models with ONNX external data: exported beside their graph, verified, benchmarked; not simplified, no INT8.

The slow test exports a model just over 2 GiB (four large weight matrices, one protobuf cannot hold them) and runs
export + ONNX Runtime parity at two batch sizes + a one-process benchmark. The other tests force external data on
a tiny model to check every stage's handling quickly.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from minreal.export import onnx_export
from minreal.export.errors import QuantizationError
from minreal.export.int8 import int8_skip_reason, quantize_int8
from minreal.export.onnx_export import EXTERNAL_DATA_BYTES, to_onnx
from minreal.export.onnx_files import PROTOBUF_LIMIT, data_files, onnx_size
from minreal.export.settings import VariantConfig
from minreal.export.simplify import simplify
from minreal.export.variant import export_variant
from minreal.export.verify import verify_parity
from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark
from minreal.runtime_bench.model_info import model_info

logger = logging.getLogger(__name__)

RTOL, ATOL = 1e-3, 1e-4
NARROW, WIDE = 8192, 16448
"""Four float32 matrices WIDE x NARROW and back: 2.008 GiB, just over what one protobuf holds."""

TINY_BENCH = BenchConfig(batch_sizes=(1,), warmup=1, min_runs=2, min_seconds=0.0, repeats=1, intra_op_threads=2,
                         eval_batch_size=2)


def _tiled(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A ``rows x cols`` matrix of one seeded 64-row block (N(0, 1/cols)) repeated: one pass over memory, not a
    random draw per element; a seed per matrix keeps them distinct (an exporter may merge equal tensors)."""
    block = torch.randn(64, cols, generator=torch.Generator().manual_seed(seed)) / cols**0.5
    out = torch.empty(rows, cols)
    out.view(rows // 64, 64, cols).copy_(block.expand(rows // 64, 64, cols))
    return out


class FourMatrices(nn.Module):
    """``x @ W1.T @ W2.T @ W3.T @ W4.T`` with NARROW → WIDE → NARROW → WIDE → NARROW widths, no bias."""

    def __init__(self) -> None:
        super().__init__()
        shapes = [(WIDE, NARROW), (NARROW, WIDE)] * 2
        self.weights = nn.ParameterList(nn.Parameter(_tiled(r, c, seed), requires_grad=False)
                                        for seed, (r, c) in enumerate(shapes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = F.linear(x, w)
        return x


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied after the test (pytest keeps recent temporary folders; these files are 2 GiB)."""
    yield tmp_path
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()


def _room_for_two_gib() -> bool:
    """Memory for the model, the exporter's copy and an ONNX Runtime session; disk for the files."""
    return psutil.virtual_memory().available > 10 * 2**30 and shutil.disk_usage("/tmp").free > 6 * 2**30


@pytest.mark.slow
@pytest.mark.skipif(not _room_for_two_gib(), reason="needs 10 GiB of free memory and 6 GiB of free disk")
def test_model_over_two_gib_exports_verifies_and_benchmarks(scratch: Path) -> None:
    start = time.perf_counter()
    model = FourMatrices().eval()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert size > PROTOBUF_LIMIT > EXTERNAL_DATA_BYTES
    x = torch.randn(3, NARROW, generator=torch.Generator().manual_seed(0))
    path = scratch / "large.onnx"

    result = to_onnx(model, x[:2], path)
    exported = time.perf_counter()
    data = scratch / "large.onnx.data"
    assert result.exporter == "dynamo" and result.data_files == [str(data)]
    assert sorted(p.name for p in scratch.iterdir()) == ["large.onnx", "large.onnx.data"]  # no temporary left
    assert path.stat().st_size < 2**20 and data.stat().st_size >= size
    assert result.total_size_bytes == path.stat().st_size + data.stat().st_size
    graph = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"large.onnx.data"}  # relative, the final name (not the temporary one)

    parity = verify_parity(model, path, [x[:1], x], rtol=RTOL, atol=ATOL)
    verified = time.perf_counter()
    assert parity.passed and parity.batch_sizes == [1, 3]

    report = run_benchmark([ModelEntry("large", path)], TINY_BENCH, x[:2].numpy())
    benched = time.perf_counter()
    (latency,) = report.latency
    assert latency.stats.runs == TINY_BENCH.min_runs and latency.stats.p50_ms > 0
    assert report.models[0].node_count == len(graph.graph.node)
    logger.info("%.3f GiB model: build and export %.1f s, parity %.1f s, bench %.1f s", size / 2**30,
                exported - start, verified - exported, benched - verified)


@pytest.fixture
def external_mlp(tiny_mlp: nn.Module, tmp_path: Path) -> Path:
    """The tiny MLP exported with its weights forced into external data."""
    result = to_onnx(tiny_mlp, torch.randn(2, 12), tmp_path / "mlp.onnx", external_data=True)
    assert result.data_files == [str(tmp_path / "mlp.onnx.data")]
    return Path(result.path)


def test_forced_external_data_is_relative_and_verifies(external_mlp: Path, tiny_mlp: nn.Module) -> None:
    assert sorted(p.name for p in external_mlp.parent.iterdir()) == ["mlp.onnx", "mlp.onnx.data"]
    graph = onnx.load(str(external_mlp), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"mlp.onnx.data"}
    parity = verify_parity(tiny_mlp, external_mlp, [torch.randn(1, 12), torch.randn(5, 12)])
    assert parity.passed


def test_small_model_stays_embedded_and_refusing_external_data_works(tiny_mlp: nn.Module, tmp_path: Path) -> None:
    result = to_onnx(tiny_mlp, torch.randn(2, 12), tmp_path / "mlp.onnx", external_data=False)
    assert result.data_files == [] and result.total_size_bytes == result.file_size_bytes
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.onnx"]


def test_simplify_copies_an_external_data_model_with_the_reason(external_mlp: Path) -> None:
    out = external_mlp.with_name("simple.onnx")
    result = simplify(external_mlp, out, [np.ones((2, 12), np.float32)])
    assert not result.simplified and result.reason.startswith("skipped: the model keeps its weights in external data")
    assert data_files(out) == [out.with_name("simple.onnx.data")]
    assert out.with_name("simple.onnx.data").read_bytes() == external_mlp.with_name("mlp.onnx.data").read_bytes()
    assert result.nodes_after == result.nodes_before and result.max_abs_diff is None


def test_int8_is_refused_in_one_line(external_mlp: Path) -> None:
    assert "external data" in int8_skip_reason(external_mlp)
    with pytest.raises(QuantizationError, match=r"^cannot quantise mlp.onnx to INT8: the model keeps its weights"):
        quantize_int8(external_mlp, external_mlp.with_name("mlp.int8.onnx"))
    assert not external_mlp.with_name("mlp.int8.onnx").exists()


def test_model_info_reads_the_graph_only(external_mlp: Path) -> None:
    data = external_mlp.with_name("mlp.onnx.data")
    assert model_info("mlp", external_mlp).file_size_bytes == external_mlp.stat().st_size + data.stat().st_size
    from minreal.runtime_bench.model_info import gzip_bytes, model_files

    assert model_files(external_mlp) == [external_mlp, data]  # the compressed size counts the weights too
    assert model_info("mlp", external_mlp).gzip_bytes == gzip_bytes([external_mlp, data]) > gzip_bytes([external_mlp])
    data.unlink()  # reading the weights would now fail
    info = model_info("mlp", external_mlp)
    assert info.file_size_bytes == external_mlp.stat().st_size and info.node_count > 0


def test_export_variant_moves_the_data_with_the_verified_graph(tiny_mlp: nn.Module, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 0)  # the tiny MLP counts as large
    record = export_variant(tiny_mlp, torch.randn(16, 12), tmp_path / "v.onnx", VariantConfig())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.onnx", "v.onnx.data"]
    assert record.export["data_files"] == ["v.onnx.data"] and record.parity["passed"]
    assert record.simplify["reason"].startswith("skipped: the model keeps its weights in external data")
    assert record.onnx_bytes == onnx_size(tmp_path / "v.onnx")
    assert int8_skip_reason(tmp_path / "v.onnx") is not None
