"""Run-report views: the verdict per case, warnings grouped by kind, TensorRT findings only for TensorRT files,
the spectra plot only when a method reports spectra."""

from pathlib import Path

from minreal.app.plots import plot_spectra
from minreal.app.report import spectra_layers


def _report(spectra: dict | None) -> dict:
    """A run report whose variant carries ``spectra`` in the typed CompressionReport field (not in details)."""
    variant = {"label": "cb", "compression": {"layers": [{"name": "2", "details": {}}],
                                              "spectra": {"2": spectra} if spectra else {}}}
    return {"cases": [{"name": "c", "variants": [variant]}]}


def test_spectra_plot_written_when_present(tmp_path: Path) -> None:
    rep = _report({"A": [4.0, 2.0, 1.0], "B": [1.0, 0.5, 0.0], "C": [2.0, 0.1, 0.0]})
    assert [name for _, name, _ in spectra_layers(rep)] == ["cb: 2"]
    assert plot_spectra(rep, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_spectra_no_plot(tmp_path: Path) -> None:
    assert not plot_spectra(_report(None), tmp_path / "s.png")
    assert not (tmp_path / "s.png").exists()


def test_a_variant_without_a_bound_is_rendered_as_such() -> None:
    """fde after fine-tuning has ``bounds = {"output": None}``: the report says so instead of crashing."""
    from minreal.app.report import _budget_and_bounds

    lines = _budget_and_bounds("fde-ft", {"bounds": {"output": None, "blocks.0": 0.25}})
    assert lines == ["- **fde-ft** error bounds: output=none (no bound holds for this variant), blocks.0=0.25"]


def _bench_case(p50: dict[str, tuple[float, float]], accuracy: dict[str, float], warnings=(), quant=None) -> dict:
    """A case whose models have p50 latencies (batch 1, batch 32) on cpu and held-out accuracies."""
    latency = [{"model": m, "provider": "cpu", "batch_size": b,
                "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms, "throughput_sps": b / ms}}
               for m, pair in p50.items() for b, ms in zip((1, 32), pair)]
    variants = [{"label": m, "method": m, "params": 10, "macs": 100, "onnx_bytes": 2048, "compression": None,
                 "quantization": (quant or {}).get(m),
                 "tensorrt_readiness": {"ready": False, "issues": ["uint8 zero points"]}} for m in p50]
    return {"name": "net", "bench": {"metrics": [{"model": m, "accuracy": a} for m, a in accuracy.items()],
                                     "latency": latency, "ratios": []},
            "variants": variants, "warnings": list(warnings), "notes": []}


def test_verdict_names_the_fastest_model_within_one_point_against_fp32_and_int8() -> None:
    from minreal.app.report import verdict_lines

    case = _bench_case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0), "svd": (3.0, 60.0),
                        "svd.int8": (1.0, 20.0), "tiny.int8": (0.5, 10.0)},
                       {"original": 0.90, "original.int8": 0.899, "svd": 0.895, "svd.int8": 0.8925, "tiny.int8": 0.80})
    [line] = verdict_lines({"cases": [case]})
    # tiny.int8 is fastest but 10 points down; svd.int8 (-0.75 pp) is the fastest within 1 pp
    assert "fastest within 1 pp: **svd.int8** (accuracy -0.75 pp)" in line
    assert "batch 1: 4.00× the original fp32, 2.00× original.int8" in line
    assert "batch 32: 4.00× the original fp32, 2.00× original.int8" in line


def test_verdict_says_plainly_when_nothing_compressed_beats_the_original() -> None:
    from minreal.app.report import verdict_lines

    case = _bench_case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0), "svd.int8": (1.0, 20.0)},
                       {"original": 0.90, "original.int8": 0.90, "svd.int8": 0.85})
    [line] = verdict_lines({"cases": [case]})
    assert "nothing compressed beats the original within 1 pp; fastest: **original.int8**" in line


def test_warnings_are_one_line_per_kind_and_tensorrt_findings_only_for_tensorrt_files() -> None:
    from minreal.app.report import grouped_warnings, render_markdown

    warnings = [f"INT8 slower than fp32: m{i}.int8 2 ms vs m{i} 1 ms" for i in range(5)]
    warnings.append("INT8 model loses quality: ssm.int8 -17.4 pp of ssm on the held-out data")
    lines = grouped_warnings(warnings)
    assert lines == ["- **WARNING** INT8 slower than fp32 (5×; all in report.json), e.g. m0.int8 2 ms vs m0 1 ms",
                     "- **WARNING** INT8 model loses quality: ssm.int8 -17.4 pp of ssm on the held-out data"]
    case = _bench_case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0)}, {"original": 0.9,
                                                                                 "original.int8": 0.9},
                       quant={"original.int8": {"target": "cpu-vnni"}})
    cpu_only = {"created_utc": "now", "config": {"providers": ["cpu"]}, "cases": [case]}
    assert "TensorRT-ready" not in render_markdown(cpu_only)
    for_trt = {"created_utc": "now", "config": {"providers": ["cpu", "tensorrt"]}, "cases": [case]}
    assert "not TensorRT-ready" in render_markdown(for_trt)


def test_verdict_without_labels_uses_agreement_or_says_quality_was_not_measured() -> None:
    from minreal.app.report import verdict_lines

    case = _bench_case({"original": (4.0, 80.0), "svd": (2.0, 40.0), "tiny": (1.0, 20.0)}, {})
    case["bench"]["metrics"] = [{"model": m, "accuracy": None, "top1_agreement": a}
                                for m, a in (("original", 1.0), ("svd", 0.995), ("tiny", 0.90))]
    [line] = verdict_lines({"cases": [case]})
    assert "fastest within 1 pp: **svd** (agreement 99.50 %)" in line
    for m in case["bench"]["metrics"]:
        m["top1_agreement"] = None
    [line] = verdict_lines({"cases": [case]})
    assert "**tiny**" in line and "quality not measured" in line and "no model is within" not in line


def test_verdict_of_a_regressor_allows_one_percent_more_error() -> None:
    from minreal.app.report import verdict_lines

    case = _bench_case({"original": (4.0, 80.0), "svd": (2.0, 40.0), "tiny": (1.0, 20.0)}, {})
    case["bench"]["metrics"] = [{"model": m, "accuracy": None, "mse": e}
                                for m, e in (("original", 1.0), ("svd", 1.005), ("tiny", 1.2))]
    [line] = verdict_lines({"cases": [case]})
    assert "fastest within 1 pp: **svd** (MSE +0.5 %)" in line


def test_warnings_without_a_colon_are_grouped_by_their_whole_text() -> None:
    from minreal.app.report import grouped_warnings

    assert grouped_warnings(["odd one", "odd one"]) == ["- **WARNING** odd one (2×; all in report.json), e.g. odd one"]


def test_an_int8_line_names_its_format_and_an_arm64_files_saturation_here_is_not_arms() -> None:
    """The run report says which format each INT8 file has; a saturating arm64 file is blamed on this CPU, not
    sent to cpu-avx2."""
    from minreal.app.int8_text import int8_cause
    from minreal.app.report import render_markdown

    arm64 = {"target": "arm64", "mode": "static", "activation_type": "int8", "activation_symmetric": True,
             "weight_type": "int8", "per_channel": True, "weight_bits": 8, "saturates_here": False}
    case = _bench_case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0)}, {"original": 0.9,
                                                                                 "original.int8": 0.9},
                       quant={"original.int8": arm64})
    text = render_markdown({"created_utc": "now", "config": {"providers": ["cpu"]}, "cases": [case]})
    assert "static for arm64 (S8S8: symmetric int8 activations, 8-bit per-channel int8 weights)" in text
    cause = int8_cause({**arm64, "saturates_here": True})
    assert "ARM's kernels do not have" in cause and "cpu-avx2" not in cause


def test_the_shape_the_macs_were_counted_at_is_said_where_the_length_varies() -> None:
    """Review (issue 44): with a dynamic length the table's MACs (one held-out sample, length 16) sat beside rows
    timed at length 8 and the compression report's ratio counted on calibration data of length 8, saying nothing."""
    from minreal.app.report import format_compact, macs_notes, render_markdown

    case = _bench_case({"original": (4.0, 80.0), "fac": (3.0, 60.0)}, {"original": 0.9, "fac": 0.9})
    assert macs_notes({"cases": [case]}) == []  # no length axis, counted at one shape: nothing to say
    for v in case["variants"]:
        v["macs_at"] = {"feats": [16, 8], "mask": [16]}
    case["variants"][1]["compression"] = {"layers": [], "macs_at": {"feats": [8, 8], "mask": [8]}}
    for row in case["bench"]["latency"]:
        row["shape"] = "seq=8"
    [line] = macs_notes({"cases": [case]})
    assert line == ("net: MACs are per sample at the held-out data's shape (feats 16×8, mask 16); rows at other "
                    "shapes have other MACs; the compression reports' ratios were counted at the calibration "
                    "data's (feats 8×8, mask 8)")
    assert f"- {line}." in render_markdown({"cases": [case]})
    assert format_compact({"cases": [case]}).endswith(f"\n{line}")
