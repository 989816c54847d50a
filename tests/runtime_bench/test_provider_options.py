"""Provider settings: CLI/TOML parsing, TensorRT/CUDA option mapping, profiles, and where they reach sessions."""

from __future__ import annotations

from pathlib import Path

import pytest

from minreal.runtime_bench.config import BenchConfig
from minreal.runtime_bench.errors import BenchInputError
from minreal.runtime_bench.provider_options import (
    ProviderSettings,
    load_provider_config,
    merge_settings,
    ort_options,
    parse_provider_option,
    trt_profiles,
)

CONFIG = """
[cuda]
device_id = 1

[tensorrt]
fp16 = true
int8 = false
engine_cache = "cache/engines"
opt_level = 5
workspace = "2G"

[tensorrt.profiles]
input = ["1x3x32x32", "32x3x32x32", "32x3x32x32"]
"""


def test_config_file_maps_to_tensorrt_options(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(CONFIG)
    settings = load_provider_config(tmp_path / "p.toml")
    assert settings["cuda"] == ProviderSettings(device_id=1)
    options = ort_options("tensorrt", settings["tensorrt"], cache_dir=tmp_path / "shared")
    assert options == {
        "trt_fp16_enable": "1", "trt_int8_enable": "0",
        "trt_engine_cache_enable": "1", "trt_engine_cache_path": "cache/engines",
        # the timing cache was not set: it goes to the run's shared directory
        "trt_timing_cache_enable": "1", "trt_timing_cache_path": str(tmp_path / "shared"),
        "trt_builder_optimization_level": "5", "trt_max_workspace_size": str(2 * 2**30),
        "trt_profile_min_shapes": "input:1x3x32x32", "trt_profile_opt_shapes": "input:32x3x32x32",
        "trt_profile_max_shapes": "input:32x3x32x32",
    }
    assert ort_options("cuda", settings["cuda"]) == {"device_id": "1"}
    assert ort_options("cpu", None, cache_dir=tmp_path) == {}


def test_cli_options_override_the_file(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(CONFIG)
    merged = merge_settings(load_provider_config(tmp_path / "p.toml"), ["tensorrt.fp16=false", "tensorrt.device_id=2"])
    assert merged["tensorrt"].fp16 is False and merged["tensorrt"].device_id == 2
    assert merged["tensorrt"].opt_level == 5 and merged["tensorrt"].profiles  # the rest kept
    assert parse_provider_option(" cuda.device_id = 3 ") == ("cuda", "device_id", "3")


@pytest.mark.parametrize("option, message", [
    ("tensorrt.fp16", "PROVIDER.KEY=VALUE"),
    ("fp16=1", "PROVIDER.KEY=VALUE"),
    ("tensorrt.fp16=maybe", "expected true or false"),
    ("tensorrt.opt_level=9", r"integer in \[0, 5\]"),
    ("tensorrt.workspace=4T", "expected bytes"),
    ("cuda.fp16=1", "not a setting of cuda"),
    ("cpu.device_id=0", "not a setting of cpu"),
    ("gpu.device_id=0", "unknown provider 'gpu'"),
    ("tensorrt.profiles=x", "--provider-config"),
])
def test_bad_cli_options_name_the_option(option: str, message: str) -> None:
    with pytest.raises(BenchInputError, match=message) as info:
        merge_settings(None, [option])
    assert "\n" not in str(info.value) and "--provider-option" in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("[tensorrt]\nfp16 = 'yes please'\n", "tensorrt.fp16"),
    ("[tensorrt.profiles]\ninput = ['1x3', '8x3']\n", "three shapes"),
    ("[tensorrt.profiles]\ninput = ['8x3', '1x3', '8x3']\n", "min <= opt <= max"),
    ("[tensorrt]\nfp16 = \n", "not valid TOML"),
    ("cuda = 1\n", "must be a table"),
])
def test_bad_config_files_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(BenchInputError, match=message) as info:
        load_provider_config(tmp_path / "p.toml")
    assert str(tmp_path / "p.toml") in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(BenchInputError, match="cannot read it"):
        load_provider_config(tmp_path / "absent.toml")


def test_default_profile_covers_every_timed_batch_and_length() -> None:
    inputs = {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq"), "scale": (1,),
              "image": ("N", 3, 32, 32), "odd": ("batch", "unknown")}
    profiles = trt_profiles(inputs, batch_sizes=(1, 8, 32), axis_values={"seq": (32, 128)})
    assert profiles == {
        "input_ids": ("1x32", "32x128", "32x128"), "attention_mask": ("1x32", "32x128", "32x128"),
        "image": ("1x3x32x32", "32x3x32x32", "32x3x32x32"),
    }  # static inputs and an axis without values are left to TensorRT


def test_settings_for_a_provider_not_requested_are_refused() -> None:
    with pytest.raises(BenchInputError, match=r"provider settings for \['tensorrt'\]"):
        BenchConfig(providers=("cpu",), provider_settings={"tensorrt": ProviderSettings(fp16=True)})


def _graph(path: Path, qdq: bool) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = ([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
              helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
             if qdq else [helper.make_node("Relu", ["x"], ["y"])])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              inits if qdq else [])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tensorrt_runs_qdq_files_in_int8_and_shares_one_cache(tmp_path: Path) -> None:
    from minreal.runtime_bench.bench import _provider_options
    from minreal.runtime_bench.config import ModelEntry

    models = [ModelEntry("fp32", _graph(tmp_path / "f.onnx", False)),
              ModelEntry("int8", _graph(tmp_path / "q.onnx", True))]
    config = BenchConfig(providers=("tensorrt",), batch_sizes=(1, 32))
    options = _provider_options("tensorrt", models, config, tmp_path)
    assert options["int8"]["trt_int8_enable"] == "1" and "trt_int8_enable" not in options["fp32"]
    assert {o["trt_engine_cache_path"] for o in options.values()} == {str(tmp_path / "trt-cache")}
    assert (options["fp32"]["trt_profile_min_shapes"] == "x:1x4"
            and options["fp32"]["trt_profile_max_shapes"] == "x:32x4")
    off = BenchConfig(providers=("tensorrt",), provider_settings={"tensorrt": ProviderSettings(int8=False)})
    assert _provider_options("tensorrt", models, off, tmp_path)["int8"]["trt_int8_enable"] == "0"  # the user's word


def test_user_profiles_are_checked_and_user_engine_caches_split_by_file(tmp_path: Path) -> None:
    from minreal.runtime_bench.bench import _provider_options, file_digest
    from minreal.runtime_bench.config import ModelEntry

    models = [ModelEntry("a", _graph(tmp_path / "a.onnx", False)), ModelEntry("b", _graph(tmp_path / "b.onnx", True))]
    user = ProviderSettings(engine_cache=str(tmp_path / "engines"), profiles={"x": ("1x4", "8x4", "8x4")})
    options = _provider_options("tensorrt", models, BenchConfig(providers=("tensorrt",),
                                                                provider_settings={"tensorrt": user}), tmp_path)
    paths = {name: o["trt_engine_cache_path"] for name, o in options.items()}
    assert paths == {m.name: str(tmp_path / "engines" / file_digest(m.path)) for m in models}
    assert len(set(paths.values())) == 2  # same file name elsewhere, other weights: never the same engine
    for bad, message in ((("nope", ("1x4", "8x4", "8x4")), "names input 'nope'"),
                         (("x", ("1x4x1", "8x4x1", "8x4x1")), "has rank 3")):
        settings = ProviderSettings(profiles=dict([bad]))
        with pytest.raises(BenchInputError, match=message):
            _provider_options("tensorrt", models, BenchConfig(providers=("tensorrt",),
                                                              provider_settings={"tensorrt": settings}), tmp_path)
