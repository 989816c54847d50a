"""Where nodes run: ONNX Runtime profiles parsed into node and MAC shares, the worker's profiled run, the report."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.facts import FLOAT_KERNEL_OPS, PROVIDERS
from minreal.runtime_bench.placement import (
    MAC_RULES,
    describe_fallback,
    graph_macs,
    measure_placement,
    node_macs,
    parse_profile,
    placement_from_dict,
)
from minreal.runtime_bench.worker import WorkerJob, run_job

CPU, CUDA = PROVIDERS["cpu"], PROVIDERS["cuda"]
#: Constructed by hand in ONNX Runtime's profile event format (not recorded on a GPU): a CUDA session in which
#: Shape, TopK and a Gemm (whose event records no shapes) fell back to CPU, with one device copy.
FIXTURE = Path(__file__).parent / "data" / "cuda_fallback_profile.json"
BATCH, C, M, HW, K, CLASSES = 2, 16, 32, 5, 3, 10  # channel counts are multiples of 16: no NCHWc padding


def _cnn(path: Path) -> Path:
    """Conv (C -> M, KxK, same padding) -> Relu -> Flatten -> MatMul to CLASSES, symbolic batch."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["r"], name="relu"),
         helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
         helper.make_node("MatMul", ["f", "head"], ["logits"], name="head")],
        "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C, HW, HW])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(rng.standard_normal((M, C, K, K)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((M * HW * HW, CLASSES)).astype(np.float32), "head")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


#: Every output element of the conv sums C*K*K products; every logit sums M*HW*HW.
CNN_MACS = BATCH * M * HW * HW * C * K * K + BATCH * CLASSES * M * HW * HW


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cnn(tmp_path_factory.mktemp("placement") / "cnn.onnx")


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((BATCH, C, HW, HW)).astype(np.float32)}


def test_real_cpu_profile_is_parsed_once_per_kernel(cnn: Path, tmp_path: Path) -> None:
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp_path / "profile")
    session = ort.InferenceSession(str(cnn), sess_options=options, providers=[CPU])
    for _ in range(2):  # two runs: every kernel appears twice in the profile, counted once
        session.run(None, _feeds())
    events = json.loads(Path(session.end_profiling()).read_text())
    kernels = {e["name"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}
    placement = parse_profile(events, CPU)
    assert placement.nodes == len(kernels) > 0 and placement.on_provider == placement.nodes
    assert placement.node_share == 1.0 and placement.fallback == () and placement.copies == 0
    assert placement.macs == CNN_MACS and placement.mac_share == 1.0
    cuda_view = parse_profile(events, CUDA)  # asked for CUDA, everything ran on CPU: all of it fell back
    assert cuda_view.node_share == 0.0 and cuda_view.mac_share == 0.0 and len(cuda_view.fallback) == len(kernels)


def test_measure_placement_uses_a_separate_profiled_session(cnn: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    placement = measure_placement(cnn, CPU, 1, _feeds())
    assert placement.requested == CPU and placement.node_share == 1.0 and placement.macs == CNN_MACS
    assert list(tmp_path.iterdir()) == []  # the profile went to a temporary folder, removed after


def test_fixture_cuda_profile_names_the_cpu_fallbacks() -> None:
    events = json.loads(FIXTURE.read_text())
    placement = parse_profile(events, CUDA)
    assert (placement.nodes, placement.on_provider, placement.copies) == (5, 2, 1)  # the Memcpy is no model node
    assert placement.node_share == pytest.approx(0.4)
    assert [(n.name, n.op_type, n.provider) for n in placement.fallback] == [
        ("shape1", "Shape", CPU), ("topk1", "TopK", CPU), ("fc", "Gemm", CPU)]
    assert placement.mac_share is None and placement.macs is None  # fc has no shapes in its event
    conv = 1 * 4 * 8 * 8 * 3 * 3 * 3
    known = parse_profile(events, CUDA, graph={"fc": 2560})  # fc's MACs from the model's graph instead
    assert known.macs == conv + 2560 and known.mac_share == pytest.approx(conv / (conv + 2560))
    assert describe_fallback(placement, limit=2) == f"shape1 (Shape on {CPU}), topk1 (TopK on {CPU}) and 1 more"
    assert placement_from_dict(json.loads(json.dumps(asdict(known)))) == known


@pytest.mark.parametrize(("op", "inputs", "outputs", "macs"), [
    ("Conv", [[1, 8, 6, 6], [4, 4, 3, 3]], [[1, 4, 4, 4]], 1 * 4 * 4 * 4 * 4 * 3 * 3),  # group 2: C/g = 4
    ("Gemm", [[5, 7], [7, 3]], [[5, 3]], 5 * 3 * 7),
    ("Gemm", [[7, 5], [3, 7]], [[5, 3]], 5 * 3 * 7),  # transA, transB
    ("MatMul", [[2, 4, 5, 7], [7, 3]], [[2, 4, 5, 3]], 2 * 4 * 5 * 3 * 7),  # batched, broadcast B
    ("FusedMatMul", [[2, 7, 5], [2, 7, 3]], [[2, 5, 3]], 2 * 5 * 3 * 7),  # transA
    ("MatMul", [[7], [7, 3]], [[3]], 3 * 7),
    ("Relu", [[2, 3]], [[2, 3]], 0),
    ("ReorderOutput", [[2, 16, 4, 4]], [[2, 16, 4, 4]], 0),
    ("ConvTranspose", [[1, 4, 4, 4], [4, 2, 3, 3]], [[1, 2, 6, 6]], None),  # holds MACs, no rule: unknown
    ("TRTKernel_graph_main_8412", [[1, 3, 8, 8]], [[1, 10]], None),  # a TensorRT engine: unknown
    ("Conv", [[1, 8, 6, 6], None], [[1, 4, 4, 4]], None),  # a shape missing
])
def test_node_macs(op: str, inputs, outputs, macs: int | None) -> None:
    assert node_macs(op, inputs, outputs) == macs


def test_mac_rules_cover_the_float_kernels() -> None:
    assert set(MAC_RULES) == FLOAT_KERNEL_OPS


def test_graph_macs_from_shape_inference(cnn: Path) -> None:
    fixed = graph_macs(cnn, {"x": (BATCH, C, HW, HW)})
    assert fixed == {"conv": BATCH * M * HW * HW * C * K * K, "head": BATCH * CLASSES * M * HW * HW}
    assert graph_macs(cnn, {}) == {"conv": None, "head": None}  # the symbolic batch stays unknown


def test_an_ort_format_file_has_no_graph_to_count_and_is_still_placed(cnn: Path, tmp_path: Path) -> None:
    """An ``.ort`` file (which the onnx package cannot read): no MACs from shape inference, and its placement comes
    from the profile alone."""
    from minreal.runtime_bench.sessions import create_session

    ort_file = tmp_path / "cnn.ort"
    create_session(cnn, optimized_model_path=ort_file)  # ONNX Runtime saves ORT format by the suffix
    assert graph_macs(ort_file, {"x": (BATCH, C, HW, HW)}) == {}
    feeds = {"x": np.ones((BATCH, C, HW, HW), np.float32)}
    placed = measure_placement(ort_file, CPU, 1, feeds)
    assert placed.node_share == 1.0 and not placed.fallback


@pytest.mark.parametrize("placement", [True, False])
def test_worker_measures_placement_only_when_asked(cnn: Path, placement: bool) -> None:
    job = WorkerJob(names=["a", "b"], paths=[str(cnn)] * 2, provider=CPU, batch_size=BATCH, threads=1, warmup=1,
                    min_runs=3, min_seconds=0.0, seed=0, placement=placement)
    result = run_job(job)
    assert result.status == "ok" and all(len(v) == 3 for v in result.latencies_ms.values())
    if not placement:
        assert result.placements == {}
        return
    assert sorted(result.placements) == ["a", "b"]
    found = placement_from_dict(result.placements["a"])
    assert found.node_share == 1.0 and found.macs == CNN_MACS


def test_report_records_placement_per_model_and_provider(bench_report, tmp_path: Path) -> None:
    from minreal.runtime_bench import format_table, load_report, write_json, write_markdown

    report, _ = bench_report  # cpu ran; cuda and tensorrt are unavailable here
    ran = {lat.provider for lat in report.latency}
    assert {(p.model, p.provider) for p in report.placement} == {(m.name, p) for m in report.models for p in ran}
    assert all(p.placement.node_share == 1.0 and p.placement.mac_share == 1.0 for p in report.placement)
    loaded = load_report(write_json(report, tmp_path / "r.json"))
    assert loaded["placement"][0]["placement"]["requested"] == CPU
    assert {"node_share", "mac_share", "fallback", "nodes", "on_provider"} <= set(loaded["placement"][0]["placement"])
    text = write_markdown(report, tmp_path / "r.md").read_text()
    assert "## Placement" in text and "| reference | cpu | 1/1 | 1.0000 | 1.0000 | 0 | - |" in text
    assert "placement:" not in format_table(report)  # the console lists placements only when a node fell back


def test_a_fused_engine_is_counted_against_the_model_graph() -> None:
    """TensorRT runs its subgraph as one kernel: 1 engine + 2 CPU fallbacks is 8 of 10 graph nodes, not 1 of 3."""
    from minreal.runtime_bench.placement import PlacedNode, Placement, against_graph

    fallback = (PlacedNode("pool", "MaxPool", "CPUExecutionProvider", 0),
                PlacedNode("fc", "Gemm", "CPUExecutionProvider", 400))
    kernels = Placement("TensorrtExecutionProvider", nodes=3, on_provider=1, node_share=1 / 3, macs=None,
                        mac_share=None, copies=2, fallback=fallback)
    counted = against_graph(kernels, graph_nodes=10, graph_total_macs=4000)
    assert (counted.nodes, counted.on_provider, counted.node_share) == (10, 8, 0.8)
    assert counted.mac_share == pytest.approx(0.9) and counted.fallback == fallback and counted.copies == 2
    whole = against_graph(dataclasses.replace(kernels, fallback=()), graph_nodes=10, graph_total_macs=None)
    assert whole.node_share == 1.0 and whole.mac_share is None
