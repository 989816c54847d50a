"""The demo's console fits one screen: every line at most 100 columns (as bytes, what ``awk length`` counts) and the
end of run, progress lines included, at most 50 lines, for a report shaped like the demo's (five cases with long
names and labels, a sequence model timed at four cells, an MSE case, a dozen warnings)."""

import pytest

from minreal.app.screen import SCREEN_COLUMNS, clip, clip_label, first_fitting, screen_table, width

CELLS = [(1, ""), (32, "")]
SEQ_CELLS = [(1, "seq=32"), (1, "seq=64"), (32, "seq=32"), (32, "seq=64")]


def _case(name: str, models: dict[str, tuple[int, int, list[float]]], quality: dict[str, dict[str, float]],
          cells: list[tuple[int, str]] = CELLS, warnings: tuple[str, ...] = ()) -> dict:
    """A case whose models have (params, MACs, p50 ms per cell) and held-out metrics."""
    latency = [{"model": m, "provider": "cpu", "batch_size": b, **({"shape": s} if s else {}),
                "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms, "throughput_sps": b / ms}}
               for m, (_, _, p50) in models.items() for (b, s), ms in zip(cells, p50)]
    variants = [{"label": m, "method": m, "params": p, "macs": macs, "onnx_bytes": 4 * p, "compression": None,
                 "quantization": None, "tensorrt_readiness": None} for m, (p, macs, _) in models.items()]
    return {"name": name, "bench": {"metrics": [{"model": m, **q} for m, q in quality.items()], "latency": latency,
                                    "ratios": []},
            "variants": variants, "warnings": list(warnings), "notes": []}


def _slow(model: str, cell: str) -> str:
    return f"INT8 model slower than its fp32 source: {model}.int8 2 ms vs {model} 1 ms (cpu, batch {cell})"


def _demo_like() -> dict:
    """Five cases as the demo has them: each with the original, two compressed models and their INT8 files."""
    cases = []
    for name, label in (("digits-mlp", "svd-0.5"), ("digits-cnn", "factorize-0.6"),
                        ("digits-mlp-4x256-silu", "C-balanced (warm start + distilled)"),
                        ("reaction-mlp", "fde ε=0.3 + recovery")):
        fp32 = {"original": (216586, 215552, [0.0406, 0.179]), label: (41715, 41305, [0.0131, 0.0692]),
                "magnitude (same widths)": (41715, 41305, [0.0125, 0.0601])}
        models = {**fp32, **{f"{m}.int8": (p, macs, [1.1 * ms for ms in p50]) for m, (p, macs, p50) in fp32.items()}}
        metric = "mse" if name == "reaction-mlp" else "accuracy"
        good = 4.1e-05 if metric == "mse" else 0.9666
        quality = {m: {metric: good if not m.startswith("magnitude") else 0.5} for m in models}
        cases.append(_case(name, models, quality, warnings=tuple(_slow(m, c) for m in fp32 for c in ("1", "32"))))
    fp32 = {"original": (4778, 283376, [0.513, 0.323, 9.957, 5.145]), "ssm trunc 50%": (3210, 180976, [0.417] * 4),
            "ssm trunc 70%": (2622, 142576, [0.325] * 4)}
    models = {**fp32, **{f"{m}.int8": (p, macs, p50) for m, (p, macs, p50) in fp32.items()}}
    warnings = (*(_slow(m, c) for m in fp32 for c in ("1 seq=32", "32 seq=64")),
                *(f"quant_pre_process failed: Incomplete symbolic shape inference ({m}.onnx; retrying without "
                  "symbolic shape inference)" for m in fp32))
    cases.append(_case("ssm-sequential-digits", models, {m: {"accuracy": 0.9465} for m in models}, SEQ_CELLS,
                       warnings))
    return {"cases": cases, "config": {"providers": ["cpu"]}, "created_utc": "now"}


def test_width_counts_bytes_and_clip_keeps_within_it() -> None:
    assert width("3.1× fp32") == 10 and width("µs") == 3  # × and µ are two bytes each in UTF-8
    assert clip("abcdef", 4) == "a…" and width(clip("abcdef", 4)) == 4
    assert clip("abc", 3) == "abc" and clip("abcdef", None) == "abcdef"
    assert first_fitting(["a long wording", "short"], 10) == "short"
    assert first_fitting(["a long wording", "still too long"], 10) == "still t…"  # … is three bytes


def test_latencies_and_counts_are_rounded_to_what_a_reader_compares() -> None:
    from minreal.app.screen import _millis, _thousands

    assert [_millis(ms) for ms in (0.00791, 0.0366, 0.315, 9.957, 51.43, 581.2, None)] == [
        "0.0079", "0.0366", "0.315", "9.96", "51.4", "581", "-"]
    assert [_thousands(n) for n in (950, 4778, 26122, 216586, 2_500_000)] == ["950", "4.78k", "26.1k", "217k", "2.5M"]


def test_a_clipped_label_keeps_its_ends_and_precision_suffix() -> None:
    assert clip_label("ssm trunc 50%.int8", 15) == "ssm t… 50%.int8"
    assert clip_label("ssm trunc 70%.ptq.int8", 19) == "ssm t… 70%.ptq.int8"
    assert clip_label("svd-0.5", 7) == "svd-0.5"
    assert len(clip_label("C-balanced (warm start + distilled)", 20)) == 20


def test_the_screen_table_rounds_and_names_its_units() -> None:
    case = _case("net", {"original": (26122, 25856, [0.00791, 0.0366]), "svd-0.5": (11786, 11520, [0.00788, 0.0345])},
                 {"original": {"accuracy": 0.96882}, "svd-0.5": {"accuracy": 0.96659}})
    title, header, *rows = screen_table({"cases": [case]}).splitlines()
    assert "p50 latency in ms" in title and "MACs in %" in title and "accuracy in %" in title
    assert header.split() == ["case", "model", "params", "MACs", "%", "KB", "p50", "ms", "b1", "b32", "acc", "%"]
    # 26122 parameters; 11520/25856 = 44.6 % of the MACs; 4 × 11786 bytes = 46.0 KB; p50 at three significant digits
    assert rows[0].split() == ["net", "original", "26.1k", "100", "102", "0.0079", "0.0366", "96.88"]
    assert rows[1].split() == ["net", "svd-0.5", "11.8k", "45", "46", "0.0079", "0.0345", "96.66"]


def test_a_sequence_case_gets_its_own_table_with_short_cell_names() -> None:
    tables = screen_table(_demo_like()).split("\n\n")
    assert len(tables) == 2
    assert tables[1].splitlines()[0].split()[6:10] == ["b1", "s32", "b1", "s64"]  # "p50 ms" is left to the title
    assert "s: seq" in tables[0].splitlines()[0]


@pytest.mark.parametrize("columns", [SCREEN_COLUMNS, 80])
def test_the_table_fits_the_columns(columns: int) -> None:
    lines = screen_table(_demo_like(), columns=columns).splitlines()
    assert max(map(width, lines)) <= columns
    if columns == SCREEN_COLUMNS:  # the labels cut in their middle keep their ends
        assert sum(".int8 " in line for line in lines if line.startswith("ssm-")) == 3


def test_a_demo_like_run_ends_within_one_screen(capsys: pytest.CaptureFixture) -> None:
    from minreal.app.commands._shared import finish_run
    from minreal.app.console import Console
    from minreal.app.digest import SCREEN_LINES
    from minreal.app.run_report import RunReport

    report = RunReport.from_json(_demo_like(), compression=False)
    finish_run(Console(quiet=True, as_json=False), report, "runs/demo", digest=True, columns=SCREEN_COLUMNS)
    out, err = capsys.readouterr()
    lines = out.splitlines() + err.splitlines()
    assert len(lines) + 1 + len(report.cases) <= SCREEN_LINES  # + the progress lines
    assert max(map(width, lines)) <= SCREEN_COLUMNS, max(lines, key=width)
    # one line per (case, kind) with its count: 6 slowdowns in each flat case; 6, and 3 pre-processing failures, in
    # the SSM's
    assert err.splitlines()[0] == "WARNING digits-mlp: INT8 model slower than its fp32 source (6×, at batch 1 and 32)"
    assert "WARNING ssm-sequential-digits: quant_pre_process failed (3×)" in err.splitlines()
    assert len(err.splitlines()) == 6
    # the winner of each case: magnitude is faster, but 47 pp down
    verdicts = [line for line in out.splitlines() if line.startswith(tuple(f"{c.name}:" for c in report.cases))]
    assert len(verdicts) == 5
    # digits-mlp: svd-0.5 at (0.0131, 0.0692) ms against (0.0406, 0.179): 3.1× and 2.6×; INT8 at 1.1× those: 3.4/2.8×
    assert verdicts[0] == "digits-mlp: svd-0.5 won (acc +0.00 pp): 3.1/2.6× fp32, 3.4/2.8× INT8 (b1/b32)"
    assert "all models and warnings in report.md" in out.splitlines()[-1]


def test_an_original_winner_on_a_screen_names_the_rival_and_why_it_lost() -> None:
    from minreal.app.digest import fitted_verdict
    from minreal.app.report import case_verdict

    # svd at (0.0105, 0.042) ms against the original's (0.01, 0.04): 1.05× its latency at both cells, same accuracy
    models = {"original": (100, 100, [0.01, 0.04]), "svd-0.5": (50, 50, [0.0105, 0.042])}
    quality = {"original": {"accuracy": 0.9}, "svd-0.5": {"accuracy": 0.9}}
    assert fitted_verdict(case_verdict(_case("digits-mlp", models, quality)), SCREEN_COLUMNS) == (
        "digits-mlp: original won; svd-0.5 (acc +0.00 pp) is not faster: 1.05× the p50 latency of original")
    longer = _case("digits-mlp-4x256-silu", models, quality)
    assert fitted_verdict(case_verdict(longer), SCREEN_COLUMNS) == (
        "digits-mlp-4x256-silu: original won; svd-0.5 (acc +0.00 pp) is not faster: 1.05× original's p50")


def test_a_rival_faster_at_one_cell_is_said_to_be_slower_on_average() -> None:
    from minreal.app.digest import fitted_verdict
    from minreal.app.report import case_verdict

    # svd at (0.009, 0.048) ms against the original's (0.01, 0.04): 0.90× its latency at b1, 1.20× at b32, mean 1.05×
    models = {"original": (100, 100, [0.01, 0.04]), "svd-0.5": (50, 50, [0.009, 0.048])}
    quality = {"original": {"accuracy": 0.9}, "svd-0.5": {"accuracy": 0.9}}
    verdict = case_verdict(_case("digits-mlp", models, quality))
    assert verdict is not None and verdict.rival_faster_somewhere
    assert fitted_verdict(verdict, SCREEN_COLUMNS) == (
        "digits-mlp: original won; svd-0.5 (acc +0.00 pp) is not faster: mean 1.05× original's p50")


def test_a_latency_is_rounded_to_three_digits_before_its_decimals_are_chosen() -> None:
    from minreal.app.screen import _millis

    # 99.97 is 100 to three significant digits (not "100.0", four); 9.996 is 10.0 (not "10.00"); 0.09996 is 0.100
    assert [_millis(ms) for ms in (99.97, 9.996, 0.09996, 999.7)] == ["100", "10.0", "0.100", "1000"]
