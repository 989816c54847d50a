"""The minreal CLI through click's CliRunner: every subcommand, JSON output, exit codes, bad input."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from minreal.app.cli import cli

QUICK_BENCH = ["--min-seconds", "0.05", "--repeats", "1"]


def test_help_lists_every_subcommand() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("compress", "export", "bench", "check", "run", "demo", "methods"):
        assert name in result.output


def test_each_subcommand_has_help() -> None:
    for name in ("compress", "export", "bench", "check", "run", "demo", "methods"):
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output


def test_method_choice_is_the_registry() -> None:
    from minreal.compress import method_names

    result = CliRunner().invoke(cli, ["compress", "--help"])
    for name in method_names():
        assert name in result.output


def test_methods_json(workdir: Path) -> None:
    result = CliRunner().invoke(cli, ["methods", "--json"])
    data = json.loads(result.output)
    assert "--layer-mac-ratio" in data["svd"]["options"] and "--mac-ratio" in data["svd"]["options"]


def test_methods_name_lists_that_methods_options_budgets_and_defaults() -> None:
    import dataclasses

    from minreal.compress.methods.fde import FDEConfig

    result = CliRunner().invoke(cli, ["methods", "fde", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["name"] == "fde" and record["budgets"] == ["mac_ratio", "param_ratio"]
    options = {o["flag"]: o for o in record["options"]}
    defaults = {f.name: f.default for f in dataclasses.fields(FDEConfig)}
    assert options["--merge-eps"]["default"] == defaults["merge_eps"] and options["--merge-eps"]["help"]
    assert options["--representative"]["choices"] and "--rank-multiple" not in options
    svd = json.loads(CliRunner().invoke(cli, ["methods", "svd", "--json"]).output)
    rank = next(o for o in svd["options"] if o["flag"] == "--rank-multiple")
    assert rank["default_by_provider"]["cpu"] == 16 and rank["default"] == 1  # the CLI's and the Python API's
    page = CliRunner().invoke(cli, ["methods", "fde"]).output
    assert page.startswith("fde: ") and "--merge-eps" in page and "budgets: --mac-ratio, --param-ratio" in page
    bad = CliRunner().invoke(cli, ["methods", "nope"])
    assert bad.exit_code == 2 and "unknown method 'nope'" in bad.output


@pytest.mark.parametrize("command", ["compress", "run"])
def test_help_shows_common_options_and_points_to_each_methods_own(command: str) -> None:
    """``--help`` leaves each method's own options to ``minreal methods NAME`` (they stay accepted);
    ``--help-all`` lists every option with its help."""
    short = CliRunner().invoke(cli, [command, "--help"]).output
    full = CliRunner().invoke(cli, [command, "--help-all"]).output
    assert "minreal methods" in short and "--merge-eps" not in short and "--mac-ratio" in short
    assert "--merge-eps" in full and "--recover-lr" in full
    assert len(short.splitlines()) < len(full.splitlines()) / 2


def test_compress_writes_program_and_report(workdir: Path) -> None:
    import torch

    result = CliRunner().invoke(cli, ["compress", "net.py:make", "--method", "svd",
                                      "--layer-mac-ratio", "0.5", "--data",
                                      "digits-flat", "--out", "small.pt2", "--report", "r.json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(Path("r.json").read_text())
    assert report["method"] == "svd" and report["macs_after"] <= 0.5 * report["macs_before"] + 1
    program = torch.export.load("small.pt2")
    out = program.module()(torch.rand(3, 64))
    assert out.shape == (3, 10)
    # wall time by phase: the method's phases, the cost count, then the command's own, in order
    command = [k for k in report["timings_s"] if k.startswith("command:")]
    assert command == ["command:load", "command:compress", "command:held_out", "command:save"]
    assert {"prepare", "realise", "costs"} <= set(report["timings_s"]) and min(report["timings_s"].values()) >= 0
    inner = sum(report["timings_s"][k] for k in ("prepare", "realise", "costs"))
    assert inner <= report["timings_s"]["command:compress"] + 0.003  # the laps are rounded to the millisecond


def test_compress_prints_its_wall_time_by_phase(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--layer-mac-ratio", "0.5", "--data",
                            "digits-flat", "--out", "small.pt2"])
    assert code == 0, err
    line = next(ln for ln in err.splitlines() if "wall time by phase" in ln)
    assert all(f"{phase} " in line for phase in ("load", "compress", "prepare", "realise", "costs", "held-out",
                                                   "save"))


def test_option_not_of_method_is_usage_error(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat", "--merge-eps",
                            "0.1"])
    assert code == 2
    assert "--merge-eps does not apply to method 'svd'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, culprit", [
    (["compress", "missing.py:make", "--method", "svd", "--data", "digits-flat"], "missing.py"),
    (["compress", "net.py:nothere", "--method", "svd", "--data", "digits-flat"], "nothere"),
    (["compress", "net.py:make", "--method", "svd", "--data", "nofile.npz"], "nofile.npz"),
    (["compress", "net.py:broken", "--method", "svd", "--data", "digits-flat"], "net.py:broken"),
    (["compress", "net.py:make", "--method", "nosuch", "--data", "digits-flat"], "nosuch"),
    (["bench", "absent.onnx"], "absent.onnx"),
    (["bench", "net.py", "--providers", "warp"], "warp"),
    (["check", "absent.json", "--min-agreement", "0.9"], "absent.json"),
])
def test_bad_input_is_one_line_error(workdir: Path, run_cli: Callable, args: list[str],
                                     culprit: str) -> None:
    code, _, err = run_cli(args)
    assert code == 2
    assert culprit in err
    assert "Traceback" not in err
    assert len([line for line in err.strip().splitlines() if "error" in line.lower()]) == 1


def test_data_of_wrong_shape(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "bad.npz", x=np.zeros((10, 5), np.float32))
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "bad.npz"])
    assert code == 2 and "forward failed" in err and "(2, 5)" in err


def test_export_bench_check_roundtrip(workdir: Path, run_cli: Callable) -> None:
    code, out, err = run_cli(["export", "net.py:make", "--out", "m.onnx", "--data", "digits-flat", "--int8", "-q",
                              "--json"])
    assert code == 0, err
    record = json.loads(out)  # --json: stdout holds exactly one JSON document
    assert record["macs"] == 64 * 48 + 48 * 10 and record["tensorrt_readiness"]["ready"]
    # the records name the written file, not the temporary ones the export and the simplifier worked on
    assert record["export"]["path"] == record["simplify"]["path_in"] == record["parity"]["onnx_path"] == "m.onnx"
    # wall time by phase: loading first, the export's own phases, then INT8 (no ORT format, no FP16 asked for)
    assert list(record["timings_s"]) == ["load", "export", "simplify", "parity", "fixed_shapes", "costs", "checks",
                                         "int8"]
    assert Path("m.onnx").exists() and Path("m.int8.onnx").exists()
    assert not list(workdir.glob(".*tmp*"))  # no temp files left behind
    code, out, err = run_cli(["export", "net.py:make", "--out", "w.onnx", "--data", "digits-flat", "--int8"])
    assert code == 0, err
    wrote = [line for line in out.splitlines() if line.startswith("wrote ")]  # every file written is said
    assert wrote[0].startswith("wrote w.onnx (") and wrote[1].startswith(
        f"wrote w.int8.onnx ({Path('w.int8.onnx').stat().st_size} bytes, INT8 in the "), wrote
    code, out, err = run_cli(["bench", "m.onnx", "m.int8.onnx", "--data", "digits-flat", "--batch", "1,4",
                              "--out", "b.json", "--json", "-q", *QUICK_BENCH])
    assert code == 0, err
    report = json.loads(out)
    assert {r["batch_size"] for r in report["latency"]} == {1, 4}
    assert Path("b.json").exists() and Path("b.md").exists()
    code, _, _ = run_cli(["check", "b.json", "--min-agreement", "0.5", "-q"])
    assert code == 0
    # two files of one stem are named by their paths (they were refused as "duplicate model names"); one file
    # given twice is a usage error before any work
    Path("e").mkdir()
    shutil.copy("m.onnx", "e/m.onnx")
    code, out, err = run_cli(["bench", "m.onnx", "e/m.onnx", "--batch", "1", "--out", "two.json", "--json", "-q",
                              *QUICK_BENCH])
    assert code == 0, err
    assert [m["name"] for m in json.loads(out)["models"]] == ["m", "e/m"]
    from minreal.app.commands.bench import _model_names

    assert _model_names(("a.onnx", "b.int8.onnx")) == ["a", "b.int8"]  # unique stems: as before
    assert _model_names(("m.onnx", "m.ort", "e/m.onnx")) == ["m.onnx", "m.ort", "e/m"]  # export --format onnx,ort
    code, _, err = run_cli(["bench", "m.onnx", "./m.onnx", "--out", "twice.json"])
    assert code == 2 and "./m.onnx is given twice (as m.onnx too)" in err and not Path("twice.json").exists()
    code, _, err = run_cli(["check", "b.json", "--min-agreement", "1.5", "-q"])  # a fraction: a usage error
    assert code == 2 and "--min-agreement" in err and "0<=x<=1" in err, err
    # a measuring process past --worker-timeout: one line naming the option, and no report (a fresh Python
    # process never starts within a millisecond)
    code, _, err = run_cli(["bench", "m.onnx", "--worker-timeout", "0.001", "--out", "slow.json", *QUICK_BENCH])
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("·")]
    assert code != 0 and len(lines) == 1 and "--worker-timeout" in lines[0] and "exceeded 0.001 s" in lines[0]
    assert not Path("slow.json").exists() and not Path("slow.md").exists()
    for bad in ("0", "inf", "nan", "1e10"):  # refused before any work, naming the option
        code, _, err = run_cli(["bench", "m.onnx", "--worker-timeout", bad, "--out", "slow.json"])
        assert code == 2 and "--worker-timeout" in err and "must be > 0 and at most" in err, (bad, err)
    code, out, err = run_cli(["check", "b.json", "--max-latency-ratio", "1e-6"])
    assert code == 1
    assert "FAIL" in out and "latency_ratio" in err and "allowed 1e-06" in err
    models = {m["name"]: m for m in report["models"]}
    small = models["m.int8"]
    assert small["file_size_bytes"] == Path("m.int8.onnx").stat().st_size and 0 < small["gzip_bytes"]
    limit = math.ceil(small["file_size_bytes"] / 1024 * 1e6) / 1e6  # 6 decimals, never below the size itself
    code, _, err = run_cli(["check", "b.json", "--max-size", f"{limit:.6f}", "-q"])
    assert code == 0, err
    code, _, err = run_cli(["check", "b.json", "--max-size", f"{limit - 0.01:.6f}", "-q"])
    assert code == 1 and len(err.strip().splitlines()) == 1 and "size_kb m.int8" in err, err
    ratio = small["file_size_bytes"] / models["m"]["file_size_bytes"]
    code, _, err = run_cli(["check", "b.json", "--max-size-ratio", f"{ratio * 0.99:.6f}", "-q"])
    assert code == 1 and "size_ratio m.int8" in err, err


def test_export_int8_keep_roundtrips_reaches_the_quantiser(workdir: Path, run_cli: Callable,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import minreal.export.int8.cleanup as int8_cleanup
    from minreal.export.settings import VariantConfig

    seen = []
    real = int8_cleanup.drop_roundtrips
    monkeypatch.setattr(int8_cleanup, "drop_roundtrips", lambda *a: seen.append(a) or real(*a))
    for out, flag in (("a.onnx", []), ("b.onnx", ["--int8-keep-roundtrips"])):
        code, _, err = run_cli(["export", "net.py:make", "--out", out, "--data", "digits-flat", "--int8", "-q",
                                *flag])
        assert code == 0, err
        assert len(seen) == 1  # the default pass runs; with the flag it is skipped
    assert VariantConfig(drop_roundtrips=False).quant_config().drop_roundtrips is False


def test_export_int8_says_its_format_and_warns_where_it_saturates(workdir: Path, run_cli: Callable,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu`` is shown resolved; an 8-bit file on a (pretended) AVX2-only CPU is flagged with its cause; the INT8
    file's agreement with its fp32 source on --data is measured and recorded."""
    import minreal.runtime_bench.cpu as cpu_facts

    monkeypatch.setattr(cpu_facts, "cpu_isa", lambda: cpu_facts.CpuIsa("x86_64", ("avx2",), "/proc/cpuinfo"))
    monkeypatch.setattr(cpu_facts, "u8s8_saturates", lambda: None)
    code, _, err = run_cli(["export", "net.py:make", "--out", "a.onnx", "--data", "digits-flat", "--int8"])
    assert code == 0, err
    assert "quantising to INT8 (static, cpu → cpu-avx2)" in err and "INT8 format: cpu-avx2 (U8S8: asymmetric uint8 " \
        "activations, 7-bit per-channel int8 weights)" in err and "top-1 agreement" in err
    code, out, err = run_cli(["export", "net.py:make", "--out", "b.onnx", "--data", "digits-flat", "--int8",
                              "--quant-target", "cpu-vnni", "--json"])
    assert code == 0, err
    assert "WARNING: the INT8 file may be inaccurate here (likely cause: saturation" in err
    quantization = json.loads(out)["quantization"]
    assert quantization["saturates_here"] and quantization["weight_bits"] == 8
    assert 0.0 <= quantization["fp32_agreement"] <= 1.0 and quantization["fp32_relative_mse"] >= 0.0


def test_export_int8_for_arm64_writes_signed_symmetric_activations(workdir: Path, run_cli: Callable) -> None:
    """``--quant-target arm64``: the file's every activation quantiser is int8 with zero point 0, its weights int8;
    the command says the format, and the record keeps it."""
    import onnx
    from onnx import numpy_helper

    code, out, err = run_cli(["export", "net.py:make", "--out", "a.onnx", "--data", "digits-flat", "--int8",
                              "--quant-target", "arm64", "--json"])
    assert code == 0, err
    assert "INT8 format: arm64 (S8S8: symmetric int8 activations, 8-bit per-channel int8 weights)" in err
    quantization = json.loads(out)["quantization"]
    assert (quantization["target"], quantization["activation_type"], quantization["activation_symmetric"],
            quantization["weight_bits"]) == ("arm64", "int8", True, 8)
    model = onnx.load("a.int8.onnx")
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zeros = [values[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zeros and all(z.dtype == np.int8 and not z.any() for z in zeros)


def test_export_without_calibration_refuses_int8(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["export", "net.py:make", "--out", "m.onnx", "--input-shape", "64", "--int8"])
    assert code == 2 and "calibration" in err
    assert not Path("m.onnx").exists()


def test_run_pipeline_and_overwrite_guard(workdir: Path, run_cli: Callable) -> None:
    args = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd",
            "--layer-mac-ratio", "0.5", "--data", "digits-flat",
            "--out", "runs/a", "--batch", "1", "-q", *QUICK_BENCH]
    code, _, err = run_cli(args)
    assert code == 0, err
    text = Path("runs/a/report.json").read_text()
    assert "staging" not in text and str(workdir) not in text  # paths are relative to the run directory
    report = json.loads(text)
    assert report["schema_version"] == 1
    labels = [v["label"] for v in report["cases"][0]["variants"]]
    assert labels == ["original", "svd", "original.int8", "svd.int8"]  # INT8 of the original: the baseline
    assert Path("runs/a/report.md").exists() and Path("runs/a/plot.png").exists()
    code, _, err = run_cli(args)
    assert code == 2 and "--overwrite" in err
    code, _, _ = run_cli(["check", "runs/a/report.json", "--min-agreement", "0.0", "-q"])
    assert code == 0


def test_run_computes_the_original_s_outputs_once_per_data(workdir: Path, run_cli: Callable,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """"Never compute twice": a run judges every variant (before and after recovery, on the calibration and the
    held-out data) against the original's outputs, which it computes once per batch of data (a variant's own passes
    and the one-row output probe aside). Without the kept predictions the same batches ran again for every variant."""
    import hashlib

    import torch

    from minreal.app import pipeline
    from minreal.compress.core import evaluate

    seen: list[tuple[int, str]] = []
    real_call = evaluate.call

    def recorded(model: torch.nn.Module, xb: torch.Tensor) -> object:
        if len(xb) > 1:
            seen.append((id(model), hashlib.sha1(xb.numpy().tobytes()).hexdigest()))
        return real_call(model, xb)

    monkeypatch.setattr(evaluate, "call", recorded)
    args = ["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--mac-ratio", "0.6",
            "--recover-epochs", "1", "--data", "digits-flat", "--no-int8", "--batch", "1", "-q", *QUICK_BENCH]

    def original_repeats(out: str) -> int:
        code, _, err = run_cli([*args, "--out", out])
        assert code == 0, err
        original = seen[0][0]  # the data check predicts it first
        batches = [b for m, b in seen if m == original]
        seen.clear()
        return len(batches) - len(set(batches))

    assert original_repeats("runs/kept") == 0
    monkeypatch.setattr(pipeline, "predictions_kept", lambda *models: contextlib.nullcontext())
    assert original_repeats("runs/again") > 0  # what the kept predictions save


def test_run_warns_when_int8_calibrates_on_few_samples(workdir: Path, run_cli: Callable) -> None:
    from sklearn.datasets import load_digits

    from minreal.export.settings import FEW_CALIBRATION_SAMPLES

    digits = load_digits()
    rows = 40  # 30 calibrate after the default 25 % held-out split
    np.savez("few.npz", x=(digits.data[:rows] / 16).astype(np.float32), y=digits.target[:rows])
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--layer-mac-ratio",
                            "0.5", "--data", "few.npz", "--out", "runs/few", "--batch", "1", *QUICK_BENCH])
    assert code == 0, err
    line = f"INT8 ranges from 30 calibration sample(s) hold for those only: give --data with {FEW_CALIBRATION_SAMPLES}"
    assert line in err
    report = json.loads(Path("runs/few/report.json").read_text())
    assert any(line in w for w in report["cases"][0]["warnings"])


def test_unwritable_output_directory(workdir: Path, run_cli: Callable) -> None:
    Path("blocker").write_text("a file, not a directory")
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--out", "blocker/run"])
    assert code == 2 and "blocker" in err


def test_slowdown_warnings_flag_int8_and_compressed() -> None:
    from minreal.app.pipeline import slowdown_warnings
    from minreal.app.run_report import CaseResult

    lat = lambda m, ms: {"model": m, "provider": "cpu", "batch_size": 1, "stats": {"p50_ms": ms}}  # noqa: E731
    bench = {"latency": [lat("original", 1.0), lat("svd", 1.2), lat("svd.int8", 1.5), lat("fz", 0.5),
                         lat("fz.int8", 0.4)]}
    warnings = slowdown_warnings(CaseResult("c", [], bench, {}))
    assert len(warnings) == 2
    assert any(w.startswith("compressed model not faster") and "svd 1.2" in w for w in warnings)
    assert any(w.startswith("INT8 model slower") and "svd.int8 1.5" in w for w in warnings)
    # with the original in INT8 as the baseline to beat: fz (0.5) and svd.int8 lose to it, fz.int8 (0.4) wins
    bench["latency"].append(lat("original.int8", 0.45))
    against_int8 = [w for w in slowdown_warnings(CaseResult("c", [], bench, {})) if "simply quantising" in w]
    assert sorted(w.split(": ")[1].split(" ")[0] for w in against_int8) == ["fz", "svd", "svd.int8"]
    bench["latency"].append(lat("original.int8", 1.1))  # slower than the fp32 original: an INT8 warning
    (line,) = [w for w in slowdown_warnings(CaseResult("c", [], {"latency": bench["latency"][-1:] + [
        lat("original", 1.0)]}, {}))]
    assert line.startswith("INT8 model slower than its fp32 source: original.int8")


def test_int8_quality_warnings_name_the_likely_cause() -> None:
    """An INT8 file more than 1 pp (accuracy or agreement) or 10 % (MSE) below its fp32 source is flagged, with the
    cause its quantisation record points to: saturation on this CPU first, then non-finite scales, round trips."""
    from minreal.app.pipeline import int8_quality_warnings
    from minreal.app.run_report import CaseResult
    from minreal.export.record import VariantRecord

    def rec(label: str, **quantization: object) -> VariantRecord:
        return VariantRecord(label, "m", 1, 1, f"{label}.onnx", 1, quantization=quantization)

    met = lambda m, acc: {"model": m, "accuracy": acc, "mse": None, "top1_agreement": None}  # noqa: E731
    bench = {"metrics": [met("original", 0.947), met("original.int8", 0.773), met("svd", 0.94),
                         met("svd.int8", 0.931), met("fz", 0.90), met("fz.int8", 0.85)]}
    variants = [rec("original.int8", saturates_here=True), rec("svd.int8"),
                rec("fz.int8", float_roundtrips={"Pad": 2}, weight_bits=7)]
    lines = int8_quality_warnings(CaseResult("c", variants, bench, {}))
    assert len(lines) == 2  # svd.int8 loses 0.9 pp: within the threshold
    assert "original.int8 accuracy 77.30 % vs 94.70 % of original" in lines[0] and "saturation" in lines[0]
    assert "fz.int8" in lines[1] and "Pad" in lines[1]
    variants[0] = rec("original.int8", nonfinite_nodes=["a", "b"])
    assert "non-finite calibration scales" in int8_quality_warnings(CaseResult("c", variants, bench, {}))[0]
    mse = lambda m, v: {"model": m, "accuracy": None, "mse": v, "top1_agreement": None}  # noqa: E731
    regression = {"metrics": [mse("original", 1.0), mse("original.int8", 1.09), mse("svd", 2.0), mse("svd.int8", 2.3)]}
    (line,) = int8_quality_warnings(CaseResult("r", [rec("svd.int8", weight_bits=7)], regression, {}))
    assert line.startswith("INT8 model loses quality: svd.int8 MSE 2.3 vs 2 (+15 %)") and "7-bit" in line


def test_run_records_tensorrt_readiness_and_dynamic_int8(workdir: Path, run_cli: Callable) -> None:
    args = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "digits-flat", "--out",
            "runs/d", "--batch", "2", "--quant-mode", "dynamic", "-q", *QUICK_BENCH]
    code, _, err = run_cli(args)
    assert code == 0, err
    variants = json.loads(Path("runs/d/report.json").read_text())["cases"][0]["variants"]
    assert variants[0]["tensorrt_readiness"]["ready"] is True  # fp32 graph: standard ops only
    assert [v["label"] for v in variants] == ["original", "svd", "original.int8", "svd.int8"]
    assert variants[3]["quantization"]["mode"] == "dynamic"
    assert variants[3]["quantization"]["integer_kernels"] > 0


def test_output_never_overwrites_an_input(workdir: Path, run_cli: Callable) -> None:
    before = Path("net.py").read_text()
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat", "--out",
                            "net.py"])
    assert code == 2 and "is the input file" in err
    assert Path("net.py").read_text() == before


def test_export_says_how_many_samples_calibrate_int8_and_warns_when_they_are_few(workdir: Path,
                                                                                 run_cli: Callable) -> None:
    """It said all 1797 samples calibrated INT8 while 256 did, and calibrated on one sample without a word."""
    import numpy as np

    from minreal.app.single import _data_line
    from minreal.export.settings import FEW_CALIBRATION_SAMPLES

    assert _data_line(1797, None) == "using all 1797 samples of --data for the example input and parity"
    assert _data_line(1797, 256).endswith("parity, a seeded random 256 of them for INT8 calibration")
    assert _data_line(100, 256).endswith("parity, all of them for INT8 calibration")
    assert "WARNING" not in _data_line(FEW_CALIBRATION_SAMPLES, 256)
    np.savez(workdir / "one.npz", x=np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32))
    code, _, err = run_cli(["export", "net.py:make", "--data", "one.npz", "--int8", "--out", "o.onnx"])
    assert code == 0, err
    assert "all of them for INT8 calibration; WARNING: INT8 ranges from 1 sample(s) hold for those only" in err, err


def test_export_of_a_program_counts_its_macs(workdir: Path, run_cli: Callable) -> None:
    """A torch.export program has no layers for the cost rules (its MACs read 0); torch counts its ATen operations."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10)).eval()
    program = torch.export.export(model, (torch.randn(2, 64),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, workdir / "p.pt2")
    code, out, err = run_cli(["export", "p.pt2", "--data", "digits-flat", "--out", "p.onnx", "--json", "-q"])
    assert code == 0, err
    record = json.loads(out)
    assert record["macs"] == 64 * 48 + 48 * 10 and record["params"] == 64 * 48 + 48 + 48 * 10 + 10


def test_check_names_a_compression_report_as_such(workdir: Path, run_cli: Callable) -> None:
    """It said "report r.json is malformed (KeyError: 'metrics')" of the report compress writes."""
    from minreal.compress.core.report import CompressionReport
    from minreal.export.json_safe import write_json

    write_json(CompressionReport("svd", {}), Path("r.json"))  # as `compress --report` writes it
    code, _, err = run_cli(["check", "r.json", "--min-agreement", "0.5"])
    assert code == 2 and err.strip() == ("minreal: error: report r.json is a compression report (minreal compress "
                                         "--report), which measures no latency; check reads the reports of minreal "
                                         "bench, run and tune"), err


def test_run_refuses_a_budget_a_method_cannot_meet_before_any_work(workdir: Path, run_cli: Callable) -> None:
    """It exported the original first, then said the method has no --mac-ratio (cbalanced then; ssm now)."""
    code, out, err = run_cli(["run", "net.py:make", "-m", "ssm", "--mac-ratio", "0.5", "--data", "digits-flat",
                              "--out", "r", "--allow-data-mismatch"])
    assert code == 2 and not out and not Path("r").exists(), err
    assert err.strip() == ("minreal: error: method 'ssm' does not support --mac-ratio (its budgets: none; "
                           "use its own options (minreal methods))"), err


def test_compress_writes_a_program_only_under_the_pt2_suffix(workdir: Path, run_cli: Callable) -> None:
    """A program saved as c.onnx was written with exit 0, and neither bench nor export could read it back."""
    code, out, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat", "--out",
                              "c.onnx", "--report", "r.json"])
    assert code == 2 and "--out" in err and "'c.onnx': compress writes a torch.export program" in err, err
    assert sorted(p.name for p in workdir.iterdir()) == ["net.py"]


def test_demo_single_case_end_to_end(workdir: Path, run_cli: Callable) -> None:
    code, out, err = run_cli(["demo", "--only", "digits-mlp", "--out", "runs/demo"])
    assert code == 0, err
    report = json.loads(Path("runs/demo/report.json").read_text())
    assert [c["name"] for c in report["cases"]] == ["digits-mlp"]
    labels = [v["label"] for v in report["cases"][0]["variants"]]
    assert labels == ["original", "svd-0.5", "factorize-0.5", "original.int8", "svd-0.5.int8", "factorize-0.5.int8"]
    metrics = {m["model"]: m for m in report["cases"][0]["bench"]["metrics"]}
    assert metrics["original"]["accuracy"] > 0.9  # trained on digits, held-out accuracy
    assert "factorize-0.5" in out and "p50 ms b1" in out  # the compact table
    assert Path("runs/demo/plot.png").exists() and Path("runs/demo/report.md").exists()


def test_demo_unknown_case_is_usage_error(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["demo", "--only", "nosuch", "--out", "runs/x"])
    assert code == 2 and "nosuch" in err and "digits-mlp" in err
    assert not Path("runs/x").exists()


def test_check_without_criteria_is_usage_error(workdir: Path, run_cli: Callable) -> None:
    Path("r.json").write_text("{}")
    code, _, err = run_cli(["check", "r.json"])
    assert code == 2 and "at least one criterion" in err


def test_overwrite_replaces_only_run_directories(workdir: Path, run_cli: Callable) -> None:
    project = workdir / "proj"
    project.mkdir()
    (project / "notes.txt").write_text("keep me")
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--out", "proj", "--overwrite"])
    assert code == 2 and "not a minreal run directory" in err
    assert (project / "notes.txt").read_text() == "keep me"


def test_run_directory_may_not_contain_inputs(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--out", "."])
    assert code == 2 and "contains the input" in err
    assert Path("net.py").exists()


def test_bench_and_report_outputs_never_overwrite_inputs(workdir: Path, run_cli: Callable) -> None:
    np.savez("d.npz", x=np.random.rand(8, 64).astype(np.float32))
    before = Path("d.npz").read_bytes()
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "d.npz", "--report", "d.npz"])
    assert code == 2 and "is the input file" in err and Path("d.npz").read_bytes() == before
    code, _, err = run_cli(["bench", "net.py", "--out", "net.py"])
    assert code == 2 and "is the input file" in err


def test_compress_with_recovery_records_it(workdir: Path) -> None:
    result = CliRunner().invoke(cli, ["compress", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
                                      "digits-flat", "--out", "small.pt2", "--report", "r.json", "-q",
                                      "--recover-epochs", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(Path("r.json").read_text())
    assert report["recovery"]["epochs"] == 1 and report["recovery"]["interrupted"] is False
    assert set(report["recovery"]["before"]) >= {"agreement", "kl", "accuracy"}
    held = report["measured"]
    assert set(held["held_out_zero_shot"]) == set(held["held_out_recovered"]) >= {"agreement", "kl"}
    assert "top1_agreement" in held["held_out"]  # the recovered model on the held-out split
    # measured on the held-out 25 %: the calibration data is not compared again (one pass of each model saved)
    assert "recovered" not in held and "top1_agreement" not in held


def test_compress_without_held_out_compares_on_the_calibration_data(workdir: Path) -> None:
    result = CliRunner().invoke(cli, ["compress", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
                                      "digits-flat", "--out", "small.pt2", "--report", "r.json", "-q",
                                      "--recover-epochs", "1", "--data-holdout", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(Path("r.json").read_text())
    assert "top1_agreement" in report["measured"]["recovered"] and report["measured"]["held_out"] is None
    assert "top1_agreement" in report["measured"]  # the zero-shot measurement stays


def test_compress_without_recovery_reports_none(workdir: Path) -> None:
    result = CliRunner().invoke(cli, ["compress", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
                                      "digits-flat", "--out", "small.pt2", "--report", "r.json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(Path("r.json").read_text())
    assert report["recovery"] is None and "recovered" not in report["measured"]


def test_recovery_flags_clash_is_an_error(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--recover-epochs", "1", "--recover-steps", "3"])
    assert code != 0 and "--recover-steps" in err and not Path("compressed.pt2").exists()


def test_run_with_recovery_reports_zero_shot_and_recovered(workdir: Path, run_cli: Callable) -> None:
    args = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
            "digits-flat", "--out", "runs/r", "--batch", "1", "--no-int8", "--recover-epochs", "1",
            "--recover-features", "auto", *QUICK_BENCH]
    code, out, err = run_cli(args)
    assert code == 0, err
    report = json.loads(Path("runs/r/report.json").read_text())
    comp = report["cases"][0]["variants"][1]["compression"]
    assert comp["recovery"]["epochs"] == 1 and "recovered" in comp["measured"]
    assert comp["recovery"]["feature_points"]  # the factorised layers
    zero, rec = comp["measured"]["held_out_zero_shot"], comp["measured"]["held_out_recovered"]
    # the run's held-out data: the recovered torch model is the exported one, so ORT's accuracy equals it
    ort = next(m for m in report["cases"][0]["bench"]["metrics"] if m["model"] == "svd")
    assert ort["accuracy"] == pytest.approx(rec["accuracy"], abs=0.01)  # float rounding may flip a few samples
    assert "zero-shot vs recovered" in out and f"{100 * zero['accuracy']:.2f}" in out
    md = Path("runs/r/report.md").read_text()
    assert "**svd** recovery: zero-shot → recovered" in md and "1 epochs" in md
    assert "## Recovery: zero-shot vs recovered" in md


def test_run_compresses_every_variant_before_it_recovers_any(workdir: Path, run_cli: Callable,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's later variant whose budget cannot be met (magnitude at 0.01 of the MACs: one neuron per hidden layer
    is more) stopped the run after the earlier variants' compression and recovery, whose epochs were lost. Every
    variant is now compressed first, then each is recovered: the refusal comes before any recovery, and a run whose
    budgets hold recovers each variant once, after all are compressed."""
    from minreal.app import pipeline

    recovered: list[str] = []
    real = pipeline.apply_recovery

    def counted(report: object, *args: object, **kwargs: object) -> object:
        recovered.append(report.method)  # type: ignore[attr-defined]
        return real(report, *args, **kwargs)

    monkeypatch.setattr(pipeline, "apply_recovery", counted)
    Path("plan.toml").write_text('[[variant]]\nmethod = "svd"\nmac_ratio = 0.6\n\n'
                                 '[[variant]]\nmethod = "magnitude"\nmac_ratio = 0.01\n')
    args = ["run", "--allow-data-mismatch", "net.py:make", "--plan", "plan.toml", "--data", "digits-flat",
            "--batch", "1", "--no-int8", "--recover-epochs", "1", *QUICK_BENCH]
    code, out, err = run_cli([*args, "--out", "runs/refused"])
    assert code != 0 and "0.01 cannot be reached" in err and "Traceback" not in err, err
    assert recovered == [] and not Path("runs/refused").exists()
    assert "[make] compressing with svd (svd), recovery after every variant is compressed" in err
    assert "recovering" not in err

    Path("plan.toml").write_text('[[variant]]\nmethod = "svd"\nmac_ratio = 0.6\n\n'
                                 '[[variant]]\nmethod = "magnitude"\nmac_ratio = 0.6\n')
    code, out, err = run_cli([*args, "--out", "runs/ok"])
    assert code == 0, err
    assert recovered == ["svd", "magnitude"]
    lines = [ln for ln in err.splitlines() if "compressing with" in ln or "recovering" in ln]
    assert [ln.split("] ", 1)[1].split(" (")[0] for ln in lines] == [
        "compressing with svd", "compressing with magnitude", "recovering svd", "recovering magnitude"], lines
    assert "[make] recovering svd (1 epoch)" in err
    report = json.loads(Path("runs/ok/report.json").read_text())
    for variant in report["cases"][0]["variants"][1:]:
        assert variant["compression"]["recovery"]["epochs"] == 1
        assert "held_out_recovered" in variant["compression"]["measured"]


def test_first_ctrl_c_in_recovery_ends_it_and_the_run_goes_on(workdir: Path, run_cli: Callable,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C arrives as KeyboardInterrupt in the training loop (here at the 4th step): the best weights so far are
    kept, the run finishes, exit 0, and the report says "interrupted"."""
    import minreal.compress.core.recover as recover_mod

    step, calls = recover_mod._step, []

    def interrupting(*args: object) -> None:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        step(*args)

    monkeypatch.setattr(recover_mod, "_step", interrupting)
    args = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
            "digits-flat", "--out", "runs/i", "--batch", "1", "--no-int8", "--recover-epochs", "50", *QUICK_BENCH]
    code, out, err = run_cli(args)
    assert code == 0, err
    comp = json.loads(Path("runs/i/report.json").read_text())["cases"][0]["variants"][1]["compression"]
    assert comp["recovery"]["interrupted"] is True and comp["recovery"]["steps"] == 3
    assert "interrupted" in out and "INTERRUPTED" in Path("runs/i/report.md").read_text()


def test_second_ctrl_c_while_recovery_stops_aborts_and_leaves_nothing(workdir: Path, run_cli: Callable,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import minreal.compress.core.recover as recover_mod

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recover_mod, "_step", interrupt)
    monkeypatch.setattr(recover_mod, "log_progress", interrupt)  # the second one arrives while stopping
    args = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--mac-ratio", "0.5", "--data",
            "digits-flat", "--out", "runs/j", "--batch", "1", "--no-int8", "--recover-epochs", "5", *QUICK_BENCH]
    code, _, err = run_cli(args)
    assert code == 1 and "aborted" in err and "Traceback" not in err
    assert not Path("runs/j").exists()
    assert not Path("runs").exists() or not list(Path("runs").iterdir())  # no staging folder, no lock file


def test_second_ctrl_c_in_the_next_variants_recovery_aborts(workdir: Path, run_cli: Callable,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each variant recovers separately: after the first Ctrl-C ended one recovery, the next one aborts the run."""
    import minreal.compress.core.recover as recover_mod

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recover_mod, "_step", interrupt)
    args = ["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "-m", "factorize", "--mac-ratio", "0.5",
            "--data", "digits-flat", "--out", "runs/k", "--batch", "1", "--no-int8", "--recover-epochs", "5",
            *QUICK_BENCH]
    code, _, err = run_cli(args)
    assert code == 1 and "aborted" in err and "Traceback" not in err and not Path("runs/k").exists()


def test_a_ctrl_c_in_cbalanced_controls_counts_as_the_first_and_is_said(workdir: Path, run_cli: Callable,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of cc62dc9: cbalanced trains its controls while every variant is compressed, before any recovery; a
    Ctrl-C there ended a control's training unsaid, and was not counted, so the next Ctrl-C (in the recoveries)
    was swallowed too. It counts as the first now: the report says which control it cut short, and the next Ctrl-C
    aborts the run."""
    import minreal.compress.core.recover as recover_mod

    step, calls = recover_mod._step, []

    def interrupting_once(*args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        step(*args)

    monkeypatch.setattr(recover_mod, "_step", interrupting_once)
    Path("plan.toml").write_text('[[variant]]\nmethod = "cbalanced"\ncontrols = true\n')
    args = ["run", "--allow-data-mismatch", "net.py:make", "--plan", "plan.toml", "--data", "digits-flat",
            "--batch", "1", "--no-int8", "--recover-steps", "4", *QUICK_BENCH]
    code, out, err = run_cli([*args, "--out", "runs/c"])
    assert code == 0, err
    comp = json.loads(Path("runs/c/report.json").read_text())["cases"][0]["variants"][1]["compression"]
    cut = [name for name, v in comp["measured"]["variants"].items() if isinstance(v, dict) and v.get("interrupted")]
    assert len(cut) == 1 and any(n.startswith(f"Ctrl-C ended the training of the control(s) {cut[0]}")
                                 for n in comp["notes"])

    def interrupt(*a: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        if len(calls) > 2:  # every later training step: the second Ctrl-C
            raise KeyboardInterrupt
        step(*a)

    calls.clear()
    monkeypatch.setattr(recover_mod, "_step", interrupt)
    code, _, err = run_cli([*args, "--out", "runs/d"])
    assert code == 1 and "aborted" in err and "Traceback" not in err and not Path("runs/d").exists()


def test_run_frees_each_compressed_model_once_it_is_exported(workdir: Path, run_cli: Callable,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of cc62dc9: every compressed model stayed alive through INT8 and the benchmark (the list of compressed
    variants was never released); before, only the last one did. None is alive when the benchmark starts."""
    import gc
    import weakref

    from minreal.app import pipeline

    made: list[weakref.ref] = []
    real_variant, real_bench = pipeline.run_variant, pipeline.rb.run_benchmark

    def recorded(*args: object, **kwargs: object) -> object:
        small, report = real_variant(*args, **kwargs)
        made.append(weakref.ref(small))
        return small, report

    alive: list[bool] = []

    def bench(*args: object, **kwargs: object) -> object:
        gc.collect()
        alive.extend(ref() is not None for ref in made)
        return real_bench(*args, **kwargs)

    monkeypatch.setattr(pipeline, "run_variant", recorded)
    monkeypatch.setattr(pipeline.rb, "run_benchmark", bench)
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "-m", "magnitude",
                            "--mac-ratio", "0.6", "--data", "digits-flat", "--out", "runs/m", "--batch", "1",
                            "--no-int8", *QUICK_BENCH])
    assert code == 0, err
    assert alive == [False, False]


def test_compress_refuses_int8_ranges_it_could_not_use(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", "--mac-ratio", "0.5", "--data", "digits-flat",
                            "--recover-epochs", "1", "--recover-int8"])
    assert code == 2 and "minreal run" in err and not Path("compressed.pt2").exists()


def test_progress_without_a_terminal_is_one_throttled_line_per_task(capsys: pytest.CaptureFixture) -> None:
    """Logs and CI see progress too: a line at the first record, then at most one every LINE_EVERY_S seconds (an
    injected clock), and always the last, with the elapsed time."""
    import logging

    from minreal.app.console import ProgressBars
    from minreal.facts import DETAIL_KEY, PROGRESS_KEY

    now = [0.0]
    bars = ProgressBars(clock=lambda: now[0])
    for done, t in ((1, 0.0), (2, 3.0), (3, 12.0), (4, 13.0), (5, 14.0)):
        now[0] = t
        record = logging.LogRecord("x", logging.INFO, "", 0, "msg", (), None)
        setattr(record, PROGRESS_KEY, ("recovery (steps)", done, 5))
        bars.emit(record)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["· recovery (steps): 1/5 (0 s)", "· recovery (steps): 3/5 (12 s)",
                     "· recovery (steps): 5/5 (14 s)"]
    for done, t in ((1, 20.0), (2, 21.0)):  # an epoch's record carries its losses: never thinned out
        now[0] = t
        record = logging.LogRecord("x", logging.INFO, "", 0, "msg", (), None)
        setattr(record, PROGRESS_KEY, ("recovery (epochs)", done, 3))
        setattr(record, DETAIL_KEY, f"training loss {done}")
        bars.emit(record)
    assert capsys.readouterr().err.splitlines() == ["· recovery (epochs): 1/3: training loss 1",
                                                    "· recovery (epochs): 2/3: training loss 2"]


def test_compress_states_an_overshot_budget_on_the_console(workdir: Path, run_cli: Callable) -> None:
    """svd's ranks on this 64-16-10 MLP are coarse (multiples of the provider's rank step): 0.6 of the MACs asked,
    well under 0.55 reached. The report's ``predicted.budget_overshot`` reaches stderr as one ``note:`` line
    naming the flag, never the Python field."""
    import minreal.compress.registry as registry

    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat", "--mac-ratio",
                            "0.6", "--data-holdout", "0", "--out", "c.pt2", "--report", "r.json"])
    assert code == 0, err
    predicted = json.loads(Path("r.json").read_text())["predicted"]
    reached = predicted["budget"]["achieved"]
    assert reached < 0.6 - registry.OVERSHOOT and "`mac_ratio` 0.6 was asked" in predicted["budget_overshot"]
    notes = [line for line in err.splitlines() if line.startswith("note: budget overshot")]
    assert notes == [f"note: budget overshot: --mac-ratio 0.6 was asked, {reached:.3f} was reached: svd's steps are "
                     "coarser than the budget here (more was cut than asked); check the accuracy, or ask for a "
                     "larger --mac-ratio"]


CHECKED = '''
import torch
from torch import nn


class Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        if x.shape[-1] != 64:
            raise ValueError("expected 64 features")
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    torch.manual_seed(0)
    return Checked()
'''


SEQUENCE = '''
import torch
from torch import nn


class Sequence(nn.Module):
    def __init__(self, by_length):
        super().__init__()
        self.by_length = by_length
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x):
        if (x.shape[1] > 8) if self.by_length else (x.shape[-1] != 8):
            x = x * 0.5
        return self.fc2(torch.relu(self.fc1(x)))


def by_length():
    torch.manual_seed(0)
    return Sequence(True)


def by_features():
    torch.manual_seed(0)
    return Sequence(False)
'''


@pytest.mark.parametrize("factory, length", [("by_length", 12), ("by_length", 32), ("by_features", 12)])
def test_a_graph_fixed_at_the_datas_shape_keeps_a_dynamic_axis_only_where_it_decides_the_same_at_half_of_it(
        factory: str, length: int, workdir: Path, run_cli: Callable) -> None:
    """``--dynamic-axes`` asks the program to run at other lengths; a graph traced with example values decided at
    the data's length. It is traced again at half the length and one less: a decision on the length that goes the other
    way there (12 > 8, 6 > 8) stops the command in one line with nothing written; one that goes the same way on
    other sizes (32 > 8, 16 > 8) is a warning; a decision on the features holds, the note says so and the program
    runs at another length, as the model does."""
    import numpy as np
    import torch

    (workdir / "seq.py").write_text(SEQUENCE)
    x = np.random.default_rng(0).standard_normal((48, length, 8)).astype(np.float32)
    np.savez(workdir / "seq.npz", x=x)
    code, _, err = run_cli(["compress", f"seq.py:{factory}", "--method", "wanda", "--data", "seq.npz",
                            "--mac-ratio", "0.8", "--data-holdout", "0", "--dynamic-axes", "input:batch,seq",
                            "--out", "s.pt2", "--report", "r.json"])
    line = 1 + next(i for i, text in enumerate(SEQUENCE.splitlines()) if "if (x.shape[1] > 8)" in text)
    if factory == "by_length" and length == 32:
        assert code == 0 and Path("s.pt2").exists(), err
        assert "WARNING: dynamic axes besides the batch, decisions that rest on them: seq: 1 of the trace's 1 " \
               f"decision(s) rest on sizes that change with them and went the same way at the lengths tried: the " \
               f"graph holds only where they still do (seq.py:{line}: bool(32 > 8) = True at seq 32, bool(16 > 8) at " \
               "seq 16, bool(31 > 8) at seq 31)" in err
        return
    if factory == "by_length":
        assert code != 0 and not Path("s.pt2").exists() and not Path("r.json").exists()
        said = [ln for ln in err.splitlines() if ln.strip()]
        assert len(said) == 3, err
        assert said[-1].startswith("minreal: error: dynamic axes besides the batch: seq: the trace fixed "), err
        assert f"decides otherwise at seq 6: seq.py:{line}: bool(12 > 8) = True at seq 12, seq.py:{line}: " \
               "bool(6 > 8) = False at seq 6" in said[-1]
        return
    assert code == 0, err
    assert "note: dynamic axes besides the batch: seq: the trace fixed 1 decision(s) on sizes at the " \
           "calibration data's shape (input (12, 8)); traced again at seq 6, seq 11, every decision rests on the " \
           "same sizes" in err
    report = json.loads(Path("r.json").read_text())
    assert report["predicted"]["traced_decisions"] == [f"seq.py:{line}: bool = False"]
    shorter = torch.from_numpy(x[:3, :5])
    out = torch.export.load("s.pt2").module()(shorter)
    assert out.shape == (3, 5, 4) and bool(torch.isfinite(out).all())


FEATURES = '''
import torch
from torch import nn


class Features(nn.Module):
    """A Linear over the last axis (needs its size), or, with ``pooled``, a mean over it first (takes any size)."""

    def __init__(self, features, pooled):
        super().__init__()
        self.pooled, self.fc = pooled, nn.Linear(1 if pooled else features, 4)

    def forward(self, x):
        return self.fc(x.mean(-1, keepdim=True) if self.pooled else x).mean(1)


def needs(features=8):
    torch.manual_seed(0)
    return Features(features, False)


def needs_one():
    return needs(1)


def any_size():
    torch.manual_seed(0)
    return Features(1, True)
'''


@pytest.mark.parametrize("factory, features", [("needs", 8), ("needs_one", 1), ("any_size", 1)])
def test_a_dynamic_axis_the_exporter_fixed_is_never_claimed(factory: str, features: int, workdir: Path,
                                                           run_cli: Callable, caplog: pytest.LogCaptureFixture) -> None:
    """The dynamo exporter fixes a dimension the model's code needs (a Linear's features), and the file claimed it
    dynamic with exit 0. Now that exporter's file is refused naming the axis; the TorchScript one, which names it,
    is checked at another length (half, or 2 for a length of 1), where a model that cannot take it fails. A model
    that takes any size, calibrated at 1, keeps the axis and runs at another size."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    (workdir / "feat.py").write_text(FEATURES)
    np.savez(workdir / "f.npz", x=np.random.default_rng(0).standard_normal((16, 6, features)).astype(np.float32))
    code, out, err = run_cli(["export", f"feat.py:{factory}", "--data", "f.npz", "--dynamic-axes",
                              "input:batch,seq,feat", "--out", "f.onnx", "-q"])
    if factory.startswith("needs"):
        said = f"the dynamo exporter fixed dynamic dimension 'feat' (axis 2 of input 'input') at {features}"
        assert said in caplog.text, (err, caplog.text)
        assert code == 1 and not Path("f.onnx").exists(), err
        assert err.strip().splitlines()[-1].startswith("minreal: error: the torch module fails on the parity inputs")
        return
    assert code == 0, err
    dims = onnx.load("f.onnx").graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", "seq", "feat"]
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    got = ort.InferenceSession("f.onnx", providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    import runpy

    import torch

    with torch.no_grad():
        want = runpy.run_path("feat.py")["any_size"]()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_lists_the_axes_warning_of_a_single_method_and_of_a_chains_step() -> None:
    """``minreal run``'s warnings name each variant whose width trace rests on a dynamic axis's length, a chain's
    (whose notes name their step first) too; other notes are not warnings."""
    from types import SimpleNamespace

    from minreal.app.pipeline import axes_warnings
    from minreal.compress.core.width.tracing import AXES_WARNING

    said = f"{AXES_WARNING} seq: 1 of the trace's 1 decision(s) rest on sizes that change with them"
    records = [SimpleNamespace(label="original", compression=None),
               SimpleNamespace(label="wanda", compression=SimpleNamespace(notes=["widths on multiples of 8", said])),
               SimpleNamespace(label="wanda+svd", compression=SimpleNamespace(notes=[f"wanda: {said}"]))]
    assert axes_warnings(records) == [f"wanda: {said}", f"wanda+svd: wanda: {said}"]


def test_a_dynamic_axis_beyond_the_inputs_dimensions_is_refused_before_any_work(workdir: Path,
                                                                                 run_cli: Callable) -> None:
    import numpy as np

    (workdir / "seq.py").write_text(SEQUENCE)
    np.savez(workdir / "seq.npz", x=np.zeros((16, 12, 8), np.float32))
    code, _, err = run_cli(["compress", "seq.py:by_features", "--method", "wanda", "--data", "seq.npz",
                            "--dynamic-axes", "input:batch,seq,feat,extra", "--out", "s.pt2"])
    assert code != 0 and not Path("s.pt2").exists()
    assert "--dynamic-axes names extra (axis 3) of input, which has 3 axes (0 to 2, the batch's included)" in err
    assert "compressing" not in err
    np.savez(workdir / "seqy.npz", x=np.zeros((16, 12, 8), np.float32), y=np.zeros((16, 12, 4), np.float32))
    code, _, err = run_cli(["tune", "seq.py:by_features", "--method", "wanda", "--data", "seqy.npz", "--no-int8",
                            "--max-mse-increase", "1", "--dynamic-axes", "input:batch,seq,feat,extra", "--out", "t"])
    assert code != 0 and not Path("t").exists() and "baseline" not in err
    assert "--dynamic-axes names extra (axis 3) of input" in err.splitlines()[-1]


def test_compress_states_decisions_fixed_at_the_datas_shape_on_the_console(workdir: Path,
                                                                          run_cli: Callable) -> None:
    """A model whose own forward checks its input's size is traced carrying example values (plain torch.fx stops
    there); that the compressed graph holds for inputs of the data's shape reaches stderr as one ``note:`` line,
    naming the file and line that decided."""
    (workdir / "checked.py").write_text(CHECKED)
    code, _, err = run_cli(["compress", "checked.py:make", "--method", "wanda", "--data", "digits-flat",
                            "--mac-ratio", "0.7", "--data-holdout", "0", "--out", "c.pt2", "--report", "r.json"])
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: traced carrying example values")]
    line = 1 + next(i for i, text in enumerate(CHECKED.splitlines()) if "x.shape[-1] != 64" in text)
    assert len(notes) == 1 and f"checked.py:{line}: bool = False" in notes[0] and "any batch size" in notes[0]
    report = json.loads(Path("r.json").read_text())
    assert report["macs_after"] <= 0.7 * report["macs_before"]
