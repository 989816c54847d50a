"""The console's end-of-run digest: warnings grouped per case and kind with exact counts, one winner line per case,
every warning in full in report.md, a library warning repeated word for word shown once."""

import pytest

from minreal.app.digest import WarningDigest, verdict_text, winner_lines
from minreal.app.report import case_verdict, render_markdown


def _slow(model: str, batch: str) -> str:
    return f"INT8 model slower than its fp32 source: {model}.int8 2 ms vs {model} 1 ms (cpu, batch {batch})"


def test_warnings_are_counted_per_case_and_kind() -> None:
    digest = WarningDigest()
    digest.add("mlp", [_slow("svd", "1"), _slow("svd", "32"), _slow("original", "1"),
                       "compressed model not faster than the original: svd 1 ms vs original 1 ms (cpu, batch 32)"])
    digest.add("cnn", [_slow("svd", "1")])
    digest.add("ssm", [_slow("ssm", "32 seq=64") + " (likely cause: 3 node(s) run in float (BatchNormalization 2))",
                       _slow("ssm", "1 seq=32"), "no FP16 copy of ssm: parity failed"])
    assert digest.count("mlp", "INT8 model slower than its fp32 source") == 3
    assert digest.count("mlp", "compressed model not faster than the original") == 1
    assert digest.count("cnn", "INT8 model slower than its fp32 source") == 1
    assert digest.count("cnn", "compressed model not faster than the original") == 0
    assert digest.lines() == [
        "WARNING mlp: INT8 model slower than its fp32 source (3×, at batch 1 and 32; details in report.md)",
        "WARNING mlp: compressed model not faster than the original (1×, at batch 32; details in report.md)",
        "WARNING cnn: INT8 model slower than its fp32 source (1×, at batch 1; details in report.md)",
        "WARNING ssm: INT8 model slower than its fp32 source (2×, at batch 1 seq=32 and 32 seq=64; details in "
        "report.md)",
        "WARNING ssm: no FP16 copy of ssm (1×; details in report.md)"]


def _case(p50: dict[str, tuple[float, float]], accuracy: dict[str, float], warnings: tuple[str, ...] = ()) -> dict:
    """A case whose models have p50 latencies (batch 1, batch 32) on cpu and held-out accuracies."""
    latency = [{"model": m, "provider": "cpu", "batch_size": b, "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms,
                                                                          "throughput_sps": b / ms}}
               for m, pair in p50.items() for b, ms in zip((1, 32), pair)]
    variants = [{"label": m, "method": m, "params": 10, "macs": 100, "onnx_bytes": 2048, "compression": None,
                 "quantization": None, "tensorrt_readiness": None} for m in p50]
    return {"name": "net", "bench": {"metrics": [{"model": m, "accuracy": a} for m, a in accuracy.items()],
                                     "latency": latency, "ratios": []},
            "variants": variants, "warnings": list(warnings), "notes": []}


def test_a_compressed_winner_is_named_with_its_mean_speed_ups() -> None:
    case = _case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0), "svd": (1.0, 40.0), "tiny": (0.5, 10.0)},
                 {"original": 0.90, "original.int8": 0.90, "svd": 0.895, "tiny": 0.80})
    # svd: 4× and 2× the original fp32's speed, 2× and 1× original.int8's; tiny is 10 points down
    assert winner_lines({"cases": [case]}) == [
        "net: svd won (accuracy -0.50 pp): 4.00×/2.00× the original fp32's speed, 2.00×/1.00× original.int8's "
        "(batch 1/32, p50, cpu)"]


def test_an_original_winner_says_what_kept_the_compressed_models_out() -> None:
    too_lossy = _case({"original": (4.0, 80.0), "svd": (1.0, 20.0)}, {"original": 0.90, "svd": 0.85})
    assert verdict_text(case_verdict(too_lossy)) == (
        "net: original won; the fastest compressed model, svd (on average 0.25× the original's p50 latency), costs "
        "accuracy -5.00 pp, past 1 pp")
    too_slow = _case({"original": (4.0, 80.0), "svd": (5.0, 120.0)}, {"original": 0.90, "svd": 0.90})
    assert verdict_text(case_verdict(too_slow)) == (
        "net: original won; the fastest compressed model within 1 pp, svd (accuracy +0.00 pp), is not faster: "
        "on average 1.38× the p50 latency of original")
    # faster than the original fp32 (2/4 and 40/80) but not than its INT8 file (2/1 and 40/20): 2× the winner's
    beaten_by_int8 = _case({"original": (4.0, 80.0), "original.int8": (1.0, 20.0), "svd": (2.0, 40.0)},
                           {"original": 0.90, "original.int8": 0.90, "svd": 0.90})
    assert verdict_text(case_verdict(beaten_by_int8)) == (
        "net: original.int8 won; the fastest compressed model within 1 pp, svd (accuracy +0.00 pp), is not faster: "
        "on average 2.00× the p50 latency of original.int8")


def test_report_md_keeps_every_warning_in_full() -> None:
    warnings = tuple(_slow(f"m{i}", "1") for i in range(3))
    case = _case({"original": (4.0, 80.0)}, {"original": 0.9}, warnings)
    text = render_markdown({"created_utc": "now", "config": {"providers": ["cpu"]}, "cases": [case]})
    assert all(text.count(f"- {w}") == 1 for w in warnings)


def test_a_repeated_log_warning_is_shown_once_and_counted() -> None:
    import logging

    from minreal.app.console import RepeatFilter

    def record(name: str, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)

    repeats = RepeatFilter()
    shown = [repeats.filter(record("minreal.export.quantize", "pre-processing failed: %s", "shape inference"))
             for _ in range(3)]
    shown.append(repeats.filter(record("minreal.export.quantize", "pre-processing failed: %s", "another cause")))
    shown.append(repeats.filter(record("minreal.compress", "pre-processing failed: %s", "shape inference")))
    assert shown == [True, False, False, True, True]
    assert repeats.seen[("minreal.export.quantize", "pre-processing failed: shape inference")] == 3


def test_the_repeats_held_back_are_counted_in_one_line() -> None:
    import logging

    from minreal.app.console import RepeatFilter

    repeats = RepeatFilter()
    assert repeats.summary() is None
    for name, text in [("a", "x")] * 3 + [("a", "y")] * 2 + [("b", "x")]:
        repeats.filter(logging.LogRecord(name, logging.WARNING, __file__, 1, text, None, None))
    # ("a", "x") repeated twice and ("a", "y") once: 3 repeats of 2 warnings; ("b", "x") was shown once only
    assert repeats.summary() == ("WARNING minreal: 3 repeat(s) of 2 warning(s) above not shown (each text is shown "
                                 "once)")


def test_brief_progress_says_one_line_per_case() -> None:
    from minreal.app.digest import CaseProgress

    said: list[str] = []
    progress = CaseProgress(said.append, 2)
    for message in ("[mlp] exporting original", "[mlp] compressing with svd (svd-0.5)", "timing cpu batch 1",
                    "[cnn] exporting original", "[cnn] 3 warning(s), listed with the results"):
        progress(message)
    assert said == ["mlp (1/2): compressing, exporting, quantising, timing",
                    "cnn (2/2): compressing, exporting, quantising, timing"]


def test_the_short_table_keeps_the_models_the_verdicts_name() -> None:
    from minreal.app.digest import verdict_models
    from minreal.app.report import format_compact

    case = _case({"original": (4.0, 80.0), "original.int8": (2.0, 40.0), "svd": (1.0, 40.0), "tiny": (0.5, 10.0),
                  "tiny.int8": (0.4, 8.0)},
                 {"original": 0.90, "original.int8": 0.90, "svd": 0.895, "tiny": 0.80, "tiny.int8": 0.80})
    report = {"cases": [case]}
    names = verdict_models(report)
    assert names == {("net", "original"), ("net", "original.int8"), ("net", "svd")}  # svd wins and is the rival
    rows = format_compact(report, keep=lambda c, m: (c, m) in names).splitlines()[3:]
    assert [r.split()[1] for r in rows] == ["original", "original.int8", "svd"]


def test_cases_timed_at_different_cells_get_a_table_each() -> None:
    from minreal.app.report import format_compact

    flat = _case({"original": (4.0, 80.0), "svd": (2.0, 40.0)}, {"original": 0.9, "svd": 0.9})
    seq = _case({"original": (4.0, 80.0)}, {"original": 0.9})
    seq["name"] = "ssm"
    for row in seq["bench"]["latency"]:
        row["shape"] = "seq=32"
    lines = format_compact({"cases": [flat, seq]}).splitlines()
    headers = [line for line in lines if line.split()[:2] == ["case", "model"]]
    assert len(headers) == 2 and "ratio b32" in headers[0] and "seq=32" not in headers[0]
    assert headers[1].split().count("seq=32") == 4  # p50 and ratio at b1 seq=32 and b32 seq=32, nothing else
    assert "ratio b32 seq=32" in headers[1] and "b32 " not in headers[1].replace("b32 seq=32", "")
    assert sum(line.split()[:1] in (["net"], ["ssm"]) for line in lines) == 3


def test_a_demo_with_many_models_ends_within_a_screen(capsys: pytest.CaptureFixture) -> None:
    from types import SimpleNamespace

    from minreal.app.commands._shared import finish_run
    from minreal.app.console import Console
    from minreal.app.digest import SCREEN_LINES

    models = ["original", "original.int8", *(f"m{i}" for i in range(6)), *(f"m{i}.int8" for i in range(6))]
    cases = []
    for k in range(5):
        case = _case({m: (4.0 - 0.1 * i, 80.0 - i) for i, m in enumerate(models)}, dict.fromkeys(models, 0.9),
                     tuple(_slow(m, "1") for m in models[1:]))
        case["name"] = f"net{k}"
        cases.append(SimpleNamespace(**case, ort_config=None))
    report = SimpleNamespace(cases=cases, config={"providers": ["cpu"]}, created_utc="now")
    finish_run(Console(quiet=True, as_json=False), report, "runs/demo", digest=True)
    out, err = capsys.readouterr()
    assert len(out.splitlines()) + len(err.splitlines()) + 1 + len(cases) <= SCREEN_LINES  # + the progress lines
    assert err.splitlines() == [f"WARNING net{k}: INT8 model slower than its fp32 source (13×, at batch 1; details "
                                "in report.md)" for k in range(5)]
    # 14 models a case would not fit: the original, its INT8 and the winner (the fastest, m5.int8, also the rival)
    rows = [line.split()[:2] for line in out.splitlines() if line.split()[:1] in ([c.name] for c in cases)]
    assert rows == [[f"net{k}", m] for k in range(5) for m in ("original", "original.int8", "m5.int8")]
    # m5.int8 at (2.7, 67) ms: 4.0/2.7 = 1.48 and 80/67 = 1.19 over the original; 3.9/2.7 = 1.44, 79/67 = 1.18
    assert [line for line in out.splitlines() if line.startswith("net0:")] == [
        "net0: m5.int8 won (accuracy +0.00 pp): 1.48×/1.19× the original fp32's speed, 1.44×/1.18× original.int8's "
        "(batch 1/32, p50, cpu)"]


def test_an_error_a_case_logged_is_grouped_by_its_kind_and_shown_as_an_error() -> None:
    digest = WarningDigest()
    digest.add("mlp", ["ERROR: ORT conversion failed: no kernel", "ERROR: ORT conversion failed: no file",
                       _slow("svd", "1")])
    assert digest.count("mlp", "ORT conversion failed") == 2
    assert digest.lines() == ["ERROR mlp: ORT conversion failed (2×; details in report.md)",
                              "WARNING mlp: INT8 model slower than its fp32 source (1×, at batch 1; details in "
                              "report.md)"]
