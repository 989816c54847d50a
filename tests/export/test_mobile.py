"""Fixed shapes for edge runtimes and ONNX Runtime's mobile-usability verdict (minreal.export.mobile)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import pytest

from minreal.app.cli import run
from minreal.app.report import mobile_rows, render_markdown
from minreal.export.errors import ParityError
from minreal.export.mobile import (
    FixedShapes,
    ShapeSpec,
    check_fixed,
    fix_shapes,
    fix_verified,
    mobile_usability,
    mobile_verdict,
    parse_fixed_shapes,
)
from minreal.export.onnx_export import ExportResult
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant, quantize_variant
from minreal.runtime_bench.sessions import create_session

RTOL, ATOL = 1e-5, 1e-6
CNN_FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5))
"""


def _dims(path: Path) -> list[list[int | str]]:
    """Every graph input's dims (an int, or the symbolic name)."""
    graph = onnx.load(str(path)).graph
    return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]


@pytest.fixture(scope="module")
def fixed_cnn(convnet_onnx: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FixedShapes]:
    dst = tmp_path_factory.mktemp("mobile") / "convnet.b1.onnx"
    return dst, fix_shapes(convnet_onnx.path, dst, {"batch": 1})


def test_fix_shapes_by_dimension_name(convnet_onnx: ExportResult, fixed_cnn: tuple[Path, FixedShapes],
                                      make_images) -> None:
    dst, fixed = fixed_cnn
    assert _dims(Path(convnet_onnx.path)) == [["batch", 3, 12, 12]]
    assert _dims(dst) == [[1, 3, 12, 12]] and fixed.input_shapes == {"input": [1, 3, 12, 12]}
    assert fixed.dims == {"batch": 1} and fixed.dynamic_inputs == []
    graph = onnx.load(str(dst)).graph  # shape inference fixed every intermediate and output shape too
    values = [*graph.value_info, *graph.output]
    assert values and all(d.dim_value > 0 for v in values for d in v.type.tensor_type.shape.dim)
    x = make_images(1, 3).numpy()
    want = create_session(Path(convnet_onnx.path)).run(None, {"input": x})
    got = create_session(dst).run(None, {"input": x})
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)


def test_fix_shapes_by_input_name(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    fixed = fix_shapes(convnet_onnx.path, tmp_path / "b4.onnx", inputs={"input": (4, 3, 12, 12)})
    assert _dims(tmp_path / "b4.onnx") == [[4, 3, 12, 12]] and fixed.inputs == {"input": [4, 3, 12, 12]}


@pytest.mark.parametrize("dims, inputs, named", [
    ({"seq": 1}, None, "'seq'"),
    (None, {"image": (1, 3, 12, 12)}, "'image'"),
    (None, {"input": (1, 3, 12)}, "has 4 dimensions"),
    (None, {"input": (1, 3, 12, 13)}, "cannot take the shape"),
])
def test_unknown_or_wrong_names_are_errors(convnet_onnx: ExportResult, tmp_path: Path, dims, inputs,
                                           named: str) -> None:
    with pytest.raises(ValueError, match=named) as err:
        fix_shapes(convnet_onnx.path, tmp_path / "x.onnx", dims, inputs)
    assert "batch" in str(err.value) or "12" in str(err.value)  # the model's dims/inputs are listed
    assert not list(tmp_path.iterdir())  # nothing written


def test_parse_fixed_shapes() -> None:
    spec = parse_fixed_shapes("batch=1, seq=128,input_ids=1x128")
    assert spec == ShapeSpec((("batch", 1), ("seq", 128)), (("input_ids", (1, 128)),))
    assert spec.batch() == 1 and parse_fixed_shapes("seq=8").batch() is None
    assert parse_fixed_shapes("input=4x3x12x12").batch() == 4
    hash(spec)  # VariantConfig is frozen: the spec must be hashable
    for bad in ("batch", "batch=0", "batch=1.5", "input=1x", "=1", "batch=1,batch=2", ""):
        with pytest.raises(ValueError):
            parse_fixed_shapes(bad)
    for zero in ("batch=0", "input=1x0x8", "seq=08"):  # the right form with a wrong size: the size is named
        with pytest.raises(ValueError, match=rf"^fixed shape '{zero}': every size must be a whole number of 1 or more"):
            parse_fixed_shapes(zero)


def test_fixed_file_checked_against_the_dynamic_one(convnet_onnx: ExportResult, fixed_cnn: tuple[Path, FixedShapes],
                                                    tmp_path: Path, make_images) -> None:
    dst, _ = fixed_cnn
    check = check_fixed(convnet_onnx.path, dst, make_images(5, 2).numpy(), RTOL, ATOL)
    assert check.passed and check.shapes == {"input": [1, 3, 12, 12]} and check.max_abs_err <= ATOL
    with pytest.raises(ValueError, match="example data has shape"):
        check_fixed(convnet_onnx.path, dst, np.zeros((2, 3, 8, 8), np.float32), RTOL, ATOL)
    other = onnx.load(str(dst))  # a "fixed" file whose weights differ: the check catches it
    other.graph.initializer[0].raw_data = np.zeros(np.prod(other.graph.initializer[0].dims), np.float32).tobytes()
    onnx.save(other, str(tmp_path / "wrong.onnx"))
    with pytest.raises(ParityError, match="differs from the dynamic graph"):
        check_fixed(convnet_onnx.path, tmp_path / "wrong.onnx", make_images(2, 2).numpy(), RTOL, ATOL)


def test_fix_verified_replaces_only_after_the_check(convnet_onnx: ExportResult, tmp_path: Path, make_images) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(Path(convnet_onnx.path).read_bytes())
    assert fix_verified(path, None, make_images(2, 0).numpy(), RTOL, ATOL) is None
    assert _dims(path) == [["batch", 3, 12, 12]]
    with pytest.raises(ValueError):
        fix_verified(path, parse_fixed_shapes("input=1x3x8x8"), make_images(2, 0).numpy(), RTOL, ATOL)
    assert _dims(path) == [["batch", 3, 12, 12]] and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    fixed = fix_verified(path, parse_fixed_shapes("batch=2"), make_images(2, 0).numpy(), RTOL, ATOL)
    assert _dims(path) == [[2, 3, 12, 12]] and fixed.check is not None and fixed.check.passed


def test_nnapi_runs_all_nodes_only_with_fixed_shapes(convnet_onnx: ExportResult,
                                                     fixed_cnn: tuple[Path, FixedShapes],
                                                     capfd: pytest.CaptureFixture) -> None:
    dynamic, fixed = mobile_usability(convnet_onnx.path), mobile_usability(fixed_cnn[0])
    assert capfd.readouterr().out == "" and dynamic.error is None and fixed.error is None  # silent
    nn_dyn, nn_fix = dynamic.eps["nnapi"], fixed.eps["nnapi"]
    assert nn_fix.supported_nodes == nn_fix.nodes > 0 and nn_fix.partitions == 1 and nn_fix.suitability == "YES"
    assert nn_dyn.supported_nodes < nn_dyn.nodes and nn_dyn.dynamic_shape_nodes > 0
    assert nn_dyn.supported_nodes_if_fixed == nn_fix.supported_nodes  # the checker's "if fixed" estimate holds
    assert dynamic.dynamic_inputs == ["input"] and fixed.dynamic_inputs == []
    assert set(dynamic.eps) == {"nnapi", "coreml", "coreml_mlprogram"}
    assert "NNAPI 0/" in mobile_verdict(dynamic) and mobile_verdict(asdict(fixed)) == mobile_verdict(fixed)


def test_checker_failure_is_a_line_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    result = mobile_usability(tmp_path / "bad.onnx")
    assert result.error and "\n" not in result.error and result.eps == {}
    assert mobile_verdict(result) == result.error


def test_export_variant_writes_the_fixed_file(convnet, make_images, tmp_path: Path) -> None:
    x = make_images(20, 4)
    cfg = VariantConfig(fixed_shapes=parse_fixed_shapes("batch=1"))
    record = export_variant(convnet, x, tmp_path / "cnn.onnx", cfg)
    assert _dims(tmp_path / "cnn.onnx") == [[1, 3, 12, 12]]
    assert record.parity["batch_sizes"] == [1, 16]  # parity ran on the dynamic graph
    assert record.fixed_shapes["dims"] == {"batch": 1} and record.fixed_shapes["check"]["passed"]
    assert record.mobile["eps"]["nnapi"]["supported_nodes"] == record.mobile["eps"]["nnapi"]["nodes"]
    int8 = quantize_variant(record, tmp_path, x, cfg)
    assert _dims(tmp_path / int8.onnx) == [[1, 3, 12, 12]] and int8.fixed_shapes == record.fixed_shapes
    assert int8.mobile["error"] is None and int8.mobile["dynamic_inputs"] == []
    json.dumps(record.mobile), json.dumps(record.fixed_shapes)  # JSON-ready


def test_report_has_the_mobile_table(convnet_onnx: ExportResult, fixed_cnn: tuple[Path, FixedShapes]) -> None:
    base = {"compression": {}, "quantization": {}, "tensorrt_readiness": {}, "macs": 1}
    variants = [{**base, "label": "original", "mobile": asdict(mobile_usability(convnet_onnx.path))},
                {**base, "label": "fixed", "fixed_shapes": asdict(fixed_cnn[1]),
                 "mobile": asdict(mobile_usability(fixed_cnn[0]))},
                {**base, "label": "old record"}]
    report = {"created_utc": "now", "cases": [{"name": "c", "variants": variants, "notes": [], "warnings": [],
                                               "bench": {"metrics": [], "ratios": [], "latency": []}}]}
    rows = mobile_rows(report)
    assert [r[1] for r in rows] == ["original", "fixed"]
    assert rows[0][2] == "dynamic (input)" and rows[1][2] == "input 1x3x12x12"
    nodes = variants[1]["mobile"]["eps"]["nnapi"]["nodes"]
    assert rows[1][3].startswith(f"{nodes}/{nodes} nodes in 1 partition(s) (YES)")
    assert "## Mobile (NNAPI / CoreML)" in render_markdown(report)


@pytest.fixture
def cnn_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cnn.py").write_text(CNN_FACTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_export_fixed_shapes(cnn_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["export", "cnn.py:make", "--out", "m.onnx", "--input-shape", "3,12,12", "--fixed-shapes", "batch=1",
                "-q"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert _dims(cnn_dir / "m.onnx") == [[1, 3, 12, 12]]
    verdict = [line for line in out.out.splitlines() if line.startswith("mobile: ")]
    assert len(verdict) == 1 and re.search(r"NNAPI (\d+)/\1 nodes in 1 partition\(s\) \(YES\)", verdict[0])
    code = run(["export", "cnn.py:make", "--out", "d.onnx", "--input-shape", "3,12,12", "--json", "-q"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["fixed_shapes"] is None and record["mobile"]["dynamic_inputs"] == ["input"]


@pytest.mark.parametrize("args, message", [
    (["export", "cnn.py:make", "--out", "m.onnx", "--input-shape", "3,12,12", "--fixed-shapes", "batch"],
     "neither DIM=N"),
    (["run", "cnn.py:make", "-m", "svd", "--data", "digits32", "--fixed-shapes", "batch=1", "--batch", "1,32"],
     "conflicts with --fixed-shapes"),
])
def test_cli_fixed_shapes_usage_errors(cnn_dir: Path, capsys: pytest.CaptureFixture, args: list[str],
                                       message: str) -> None:
    code = run(args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (cnn_dir / "m.onnx").exists() and not (cnn_dir / "runs").exists()


def test_cli_run_fixed_batch(cnn_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["run", "cnn.py:make", "-m", "svd", "--data", "digits32", "--fixed-shapes", "batch=1", "--no-int8",
                "--min-seconds", "0.02", "--repeats", "1", "--allow-data-mismatch", "--out", "r", "-q"])
    assert code == 0, capsys.readouterr().err
    case = json.loads((cnn_dir / "r" / "report.json").read_text())["cases"][0]
    assert {lat["batch_size"] for lat in case["bench"]["latency"]} == {1}
    for v in case["variants"]:
        assert v["fixed_shapes"]["dims"] == {"batch": 1}
        assert _dims(cnn_dir / "r" / "make" / v["onnx"]) == [[1, 3, 32, 32]]
        assert v["mobile"]["eps"]["nnapi"]["supported_nodes"] == v["mobile"]["eps"]["nnapi"]["nodes"]
    assert "## Mobile (NNAPI / CoreML)" in (cnn_dir / "r" / "report.md").read_text()
