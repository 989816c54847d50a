"""ORT-format files: ONNX Runtime's converter with its operator configuration, the merge of configurations, parity
of the ``.ort`` file against torch, and ``minreal export --format onnx,ort``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnxruntime.tools.reduced_build_config_parser import parse_config

from minreal.export.errors import ParityError
from minreal.export.onnx_export import ExportResult
from minreal.export.ort_format import (
    TARGET_PLATFORMS,
    config_path_for,
    convert_to_ort,
    format_operator_config,
    merge_operator_configs,
    operator_names,
    ort_variant,
    parse_operator_config,
    read_operator_config,
)
from minreal.export.record import VariantRecord
from minreal.export.settings import OrtConfig, VariantConfig
from minreal.export.variant import quantize_variant
from minreal.export.verify import verify_parity
from minreal.runtime_bench.cpu import cpu_int8_target, cpu_isa
from minreal.runtime_bench.errors import ModelFileError


def _graph_ops(path: Path) -> set[str]:
    """``domain:Op`` of every node of an ONNX file (the default domain is ``ai.onnx``)."""
    return {f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("level", ["all", "disable"])
def test_the_config_lists_exactly_the_optimised_graphs_operators(convnet, convnet_onnx: ExportResult,
                                                                  make_images, tmp_path: Path, level: str) -> None:
    """The configuration is the converted graph's operators (``disable``: the source graph's own); the ``.ort`` file
    loads in ONNX Runtime and reproduces torch at two batch sizes; the source is untouched and no temporary file is
    left behind."""
    source = Path(convnet_onnx.path)
    before = source.read_bytes()
    made = convert_to_ort(source, tmp_path / "convnet.ort", OrtConfig(optimization=level), optimized_onnx=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convnet.optimized.onnx", "convnet.ort",
                                                          "convnet.required_operators.config"]
    assert source.read_bytes() == before and os.environ.get("ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL") is None
    assert made.bytes == (tmp_path / "convnet.ort").stat().st_size and made.optimization == level
    assert set(made.operators) == _graph_ops(Path(made.optimized_onnx))
    assert set(operator_names(read_operator_config(made.config_path))) == set(made.operators)
    if level == "disable":
        assert set(made.operators) == _graph_ops(source)
    else:
        assert "com.microsoft:FusedConv" in made.operators  # Conv+ReLU fused: the level reached the converter
    parity = verify_parity(convnet, made.path, [make_images(1, 3), make_images(16, 4)], rtol=1e-4, atol=1e-5)
    assert parity.passed and parity.batch_sizes == [1, 16]


def test_type_reduction_and_target_platform_reach_the_converter(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    made = convert_to_ort(convnet_onnx.path, tmp_path / "c.ort", OrtConfig(type_reduction=True, target_platform="arm"))
    assert Path(made.config_path) == config_path_for(tmp_path / "c.ort", True)
    assert Path(made.config_path).name == "c.required_operators_and_types.config"
    required, type_filter = parse_config(made.config_path, enable_type_reduction=True)  # ONNX Runtime's own parser
    assert type_filter is not None and "float" in Path(made.config_path).read_text()
    assert {f"{d}:{op}" for d, opsets in required.items() for ops in opsets.values() for op in ops} == \
        set(made.operators)


def test_a_bad_destination_writes_nothing(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ends in .ort"):
        convert_to_ort(convnet_onnx.path, tmp_path / "c.onnx")
    with pytest.raises(ModelFileError, match="not found"):
        convert_to_ort(tmp_path / "missing.onnx")
    assert not list(tmp_path.iterdir())


A = """# from a
ai.onnx;13;Gemm,Cast{"inputs": {"0": ["float"]}, "outputs": {"0": ["int64_t"]}}
ai.onnx;11,13;Conv
com.microsoft;1;FusedConv
"""
B = """ai.onnx;13;Cast{"inputs": {"0": ["int32_t"]}, "outputs": {"0": ["float"]}},Relu{"inputs": {"0": ["float"]}}
ai.onnx;13;Gemm{"inputs": {"0": ["float"]}}
ai.onnx;18;ReduceMean
"""


def test_the_merge_of_two_configs_is_their_union(tmp_path: Path) -> None:
    """Every operator at each opset; types united, and an operator that needs every type in one keeps needing
    every type; ONNX Runtime's own parser reads the result."""
    (tmp_path / "a.config").write_text(A)
    (tmp_path / "b.config").write_text(B)
    out = merge_operator_configs([tmp_path / "a.config", tmp_path / "b.config"], tmp_path / "all.config")
    merged = read_operator_config(out)
    assert merged == {
        "ai.onnx": {11: {"Conv": None},
                    13: {"Gemm": None, "Conv": None, "Relu": '{"inputs": {"0": ["float"]}}',
                         "Cast": '{"inputs": {"0": ["float", "int32_t"]}, "outputs": {"0": ["float", "int64_t"]}}'},
                    18: {"ReduceMean": None}},
        "com.microsoft": {1: {"FusedConv": None}}}
    required, _ = parse_config(str(out))
    assert required == {"ai.onnx": {11: {"Conv"}, 13: {"Cast", "Conv", "Gemm", "Relu"}, 18: {"ReduceMean"}},
                        "com.microsoft": {1: {"FusedConv"}}}
    assert out.read_text().startswith("# Merged from:\n# - a.config\n# - b.config\n")
    assert parse_operator_config(format_operator_config(merged)) == merged  # the written form reads back the same


@pytest.mark.parametrize("text, message", [("ai.onnx;13", "line 1 is not DOMAIN;OPSETS"),
                                           ("# c\n!globally_allowed_types;float", "line 2 is not"),
                                           ("ai.onnx;x;Gemm", "opsets 'x' are not integers"),
                                           ('ai.onnx;13;Cast{"inputs": {}', "unbalanced braces"),
                                           ("ai.onnx;13;Gemm,,Relu", "empty operator name")])
def test_a_bad_config_line_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_operator_config(text)


def _record(folder: Path, source: Path) -> VariantRecord:
    shutil.copy(source, folder / "convnet.onnx")
    return VariantRecord("convnet", "none", 0, 0, "convnet.onnx", source.stat().st_size)


def test_ort_variant_checks_parity_before_writing(convnet, convnet_onnx: ExportResult, make_images,
                                                  tmp_path: Path) -> None:
    """Against torch, the ``.ort`` file and its configuration are written with paths relative to the folder; against
    another module it is a parity error and nothing is written; without a module it is checked against its
    source."""
    record, x = _record(tmp_path, Path(convnet_onnx.path)), make_images(20, 5)
    other = type(convnet)().eval()
    with pytest.raises(ParityError, match="differs from torch in convnet.ort"):
        ort_variant(record, tmp_path, x, VariantConfig(), OrtConfig(), other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convnet.onnx"]
    found = ort_variant(record, tmp_path, x, VariantConfig(), OrtConfig(), convnet)
    assert found["path"] == "convnet.ort" and found["config_path"] == "convnet.required_operators.config"
    assert found["parity"]["against"] == "torch" and found["parity"]["batch_sizes"] == [1, 16]
    assert found["parity"]["passed"] and found["bytes"] == (tmp_path / "convnet.ort").stat().st_size
    again = ort_variant(record, tmp_path, x, VariantConfig(), OrtConfig())
    assert again["parity"]["against"] == "convnet.onnx" and again["parity"]["passed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convnet.onnx", "convnet.ort",
                                                          "convnet.required_operators.config"]


def test_cli_export_writes_both_files(workdir: Path, run_cli: Callable) -> None:
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--format",
                              "onnx,ort", "--ort-optimization", "extended"])
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("wrote m.ort"))
    shown = {"arm": "arm", "any": "any CPU"}[TARGET_PLATFORMS[cpu_int8_target()]]  # the default: this machine's
    assert f"({Path('m.ort').stat().st_size} bytes, optimisation extended, fixed, for {shown})" in line
    assert "and m.required_operators.config (" in line and "ORT parity ok against torch" in line
    ops = operator_names(read_operator_config("m.required_operators.config"))
    assert "ai.onnx:Gemm" in ops and not any(op.endswith(":Conv") for op in ops)  # Conv fused at 'extended'
    assert sorted(p.name for p in workdir.iterdir() if p.name != "__pycache__") == [
        "m.onnx", "m.ort", "m.required_operators.config", "net.py"]


def test_cli_export_int8_and_fixed_shapes_in_ort_format(workdir: Path, run_cli: Callable) -> None:
    """The INT8 file gets its own ``.ort`` file, checked against the INT8 ``.onnx`` file; with fixed shapes the
    ``.ort`` file is converted from the fixed file and checked at its batch."""
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--int8",
                              "--allow-random-calibration", "--fixed-shapes", "batch=1", "--format", "onnx,ort",
                              "--json", "-q"])
    assert code == 0, err
    record = json.loads(out)
    assert record["ort"]["path"] == "m.ort" and record["ort"]["parity"]["batch_sizes"] == [1]
    int8 = record["quantization"]["ort"]
    assert int8["path"] == "m.int8.ort" and int8["parity"]["against"] == "m.int8.onnx" and int8["parity"]["passed"]
    assert int8["bytes"] == Path("m.int8.ort").stat().st_size and Path("m.int8.required_operators.config").is_file()
    assert "com.microsoft:QLinearConv" in int8["operators"]
    session = ort.InferenceSession("m.ort", providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [1, 3, 8, 8]  # the fixed file was converted


def test_an_arm64_int8_file_is_converted_for_arm(workdir: Path, run_cli: Callable) -> None:
    """An arm64 INT8 file keeps ARM's int8 fusions in its .ort file (the converter's arm platform), not the uint8
    rewrite of this x86 machine's graph, unless a platform is asked for; and it still matches its .onnx source."""
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--int8",
                              "--allow-random-calibration", "--quant-target", "arm64", "--format", "onnx,ort",
                              "--json", "-q"])
    assert code == 0, err
    record = json.loads(out)
    assert record["ort"]["target_platform"] == "arm"  # the fp32 file too: it is made for the same device
    int8 = record["quantization"]["ort"]
    assert int8["target_platform"] == "arm" and int8["parity"]["passed"]


@pytest.mark.parametrize("args, platform", [
    (["--quant-target", "cpu-vnni"], "any"),  # x86: no NCHWc block of this CPU baked in unless asked for
    (["--quant-target", "tensorrt"], "any"),
    (["--quant-target", "cpu-vnni", "--ort-platform", "amd64"], "amd64"),  # asked for: kept
    (["--quant-target", "arm64", "--ort-platform", "any"], "any"),
])  # fmt: skip
def test_the_ort_platform_follows_the_quant_target(args: list[str], platform: str, workdir: Path,
                                                   run_cli: Callable) -> None:
    """The converter's platform is the one of the files' INT8 target unless asked for; only ``amd64`` files hold
    x86's NCHWc convolutions (ONNX Runtime's x86 builds; an ARM build may lack them, so the check is x86's)."""
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--format",
                              "onnx,ort", *args, "--json", "-q"])
    assert code == 0, err
    ort = json.loads(out)["ort"]
    assert ort["target_platform"] == platform and ort["parity"]["passed"]
    if cpu_isa().is_x86:
        assert any(op.startswith("com.microsoft.nchwc:") for op in ort["operators"]) == (platform == "amd64")


@pytest.mark.parametrize("target", ["arm64", "cpu-vnni"])
def test_an_arm_ort_file_is_checked_against_arm_s_graph_of_its_source(target: str, convnet, convnet_onnx: ExportResult,
                                                                      make_images, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``.ort`` file optimised for the arm platform keeps ARM's int8 QDQ fusions, which this x86 machine's graph of
    its ``.onnx`` source does not (int8 activations rewritten to uint8: the logits of trained arm64 ResNet-32 and SSM
    files differed by up to 0.24, benchmarks/edge.py), so ``ort_copy`` runs the source in ONNX Runtime's ARM graph:
    the two agree exactly, and the record says so. Any other file is checked against this machine's graph."""
    import minreal.export.verify as verify
    from minreal.export.ort_format import ort_copy
    from minreal.export.verify import feeds_of
    from minreal.runtime_bench.cpu import ARM_GRAPH_CONFIG

    x = make_images(20, 5)
    q = quantize_variant(_record(tmp_path, Path(convnet_onnx.path)), tmp_path, x, VariantConfig(quant_target=target))
    configs, real = {}, verify.create_session

    def spy(path: Path, **kwargs: object) -> object:
        configs[Path(path).suffix] = kwargs.get("config")  # the session config each file of the check runs with
        return real(path, **kwargs)

    monkeypatch.setattr(verify, "create_session", spy)
    record = ort_copy(tmp_path / q.onnx, [feeds_of(x[:1]), feeds_of(x)], OrtConfig(), quant_target=target)
    arm = target == "arm64"
    assert record["target_platform"] == ("arm" if arm else "any") and record["parity"]["passed"]
    assert record["parity"]["against"] == "convnet.int8.onnx" and record["path"] == "convnet.int8.ort"
    assert configs[".onnx"] == (ARM_GRAPH_CONFIG if arm else None) and configs[".ort"] is None
    assert ("reference_graph" in record["parity"]) == arm and record["parity"]["max_abs_err"] == 0


@pytest.mark.parametrize("args, message", [
    (["--format", "bogus"], "Invalid value for --format: expected comma-separated formats out of onnx, ort, got "
                            "'bogus'"),
    (["--format", "onnx", "--ort-style", "runtime"], "--ort-style applies to the ORT-format file"),
    (["--format", "onnx,ort", "--ort-optimization", "max"], "Invalid value for '--ort-optimization'"),
])
def test_cli_bad_format_options_are_one_line(workdir: Path, run_cli: Callable, args: list[str],
                                             message: str) -> None:
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", *args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out
    assert sorted(p.name for p in workdir.iterdir()) == ["net.py"]


def test_dynamic_int8_cannot_be_arm64_or_tensorrt() -> None:
    """Dynamic INT8 quantises activations to uint8 at run time: neither arm64's nor TensorRT's format, refused when
    the settings are made (before any export)."""
    from minreal.export.settings import VariantConfig

    for target in ("arm64", "tensorrt"):
        with pytest.raises(ValueError, match="--quant-mode dynamic cannot write the"):
            VariantConfig(quant_target=target, quant_mode="dynamic")
    assert VariantConfig(quant_target="arm64").quant_mode == "static"


def test_export_says_why_an_fp16_file_gets_no_ort_file(workdir: Path, run_cli: Callable) -> None:
    """``export --fp16 --format onnx,ort``: the fp32 file gets its ``.ort`` pair, the FP16 file none, and the output
    says why (once) instead of leaving it out silently."""
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--fp16",
                              "--format", "onnx,ort"])
    assert code == 0, err
    assert Path("m.ort").is_file() and Path("m.fp16.onnx").is_file() and not Path("m.fp16.ort").exists()
    assert (out + err).count("FP16 files are not converted to ORT format") == 1
