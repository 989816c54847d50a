"""`minreal tune`: constraint semantics, the budget bisection, the front and the choice, and a small tune end to end
(the chosen model meets the constraint on held-out data in ONNX Runtime; a repeated tune comes from the cache)."""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from minreal.app.cli import cli, run
from minreal.app.tune import (
    Constraint,
    InlineExecutor,
    Point,
    Protocol,
    Quality,
    TuneConfig,
    TuneError,
    choose,
    pareto_front,
    parse_duration,
    tune,
)
from minreal.app.tune.output import format_tune
from minreal.app.tune.search import BudgetSearch
from minreal.compress.core.smoke import digits_mlp, digits_subset
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.export.settings import VariantConfig
from minreal.runtime_bench import BenchConfig

FAST = Protocol(min_seconds=0.02, repeats=1, min_runs=5, warmup=1)
FAST_BENCH = BenchConfig(**dataclasses.asdict(FAST))  # FAST confirms too; the cells: minreal bench's defaults
GRID = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)


def test_constraint_units_follow_check() -> None:
    ref = Quality(accuracy=0.95, agreement=1.0)
    drop = Constraint(max_accuracy_drop=0.5)  # percentage points
    assert drop.holds(Quality(accuracy=0.9451), ref) and not drop.holds(Quality(accuracy=0.9449), ref)
    assert drop.loss(Quality(accuracy=0.94), ref) == pytest.approx(1.0)
    agree = Constraint(min_agreement=0.98)
    assert agree.holds(Quality(agreement=0.98), ref) and not agree.holds(Quality(agreement=0.9799), ref)
    mse = Constraint(max_mse_increase=0.1)
    assert mse.holds(Quality(mse=1.1), Quality(mse=1.0)) and mse.score(Quality(mse=2.0)) == -2.0
    assert not drop.holds(Quality(agreement=1.0), ref)  # a missing metric never meets the constraint
    for bad in ({}, {"max_accuracy_drop": 1, "min_agreement": 0.9}, {"min_agreement": 1.5},
                {"max_accuracy_drop": -1}, {"max_mse_increase": math.nan}):
        with pytest.raises(TuneError):
            Constraint(**bad)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("20m", 1200), ("1.5h", 5400)])
def test_time_budget_parsing(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_time_budget_refuses_nonsense() -> None:
    with pytest.raises(TuneError, match="--time-budget"):
        parse_duration("soon")


@pytest.mark.parametrize("k", range(len(GRID) + 1))
def test_bisection_finds_the_smallest_feasible_budget_in_few_probes(k: int) -> None:
    """The first k budgets (largest) meet the constraint: the search returns GRID[k-1] (or None) after at most
    ceil(log2(9)) + 1 probes, the last one checking monotonicity."""
    s = BudgetSearch(GRID)
    while (b := s.next_budget()) is not None:
        s.record(b, GRID.index(b) < k, None)
    assert s.smallest() == (GRID[k - 1] if k else None)
    assert s.monotone and len(s.probes) <= math.ceil(math.log2(len(GRID) + 1)) + 1


def test_bisection_falls_back_to_the_grid_when_not_monotone() -> None:
    ok = dict(zip(GRID, [True, True, True, False, False, True, False, False]))
    s = BudgetSearch(GRID)
    while (b := s.next_budget()) is not None:
        s.record(b, ok[b], None)
    assert not s.monotone and set(s.probes) == set(GRID)
    assert s.passing() == [0.4, 0.7, 0.8, 0.9] and s.smallest() == 0.4


def test_front_and_choice_never_pick_a_dominated_or_infeasible_point() -> None:
    pts = [Point("base", 1.0, 0.90, 100, True), Point("fast", 0.5, 0.89, 50, True),
           Point("dominated", 0.8, 0.85, 60, True), Point("fastest-but-bad", 0.2, 0.50, 10, False)]
    front = [p.label for p in pareto_front(pts)]
    assert "dominated" not in front and front == ["fastest-but-bad", "fast", "base"]
    assert choose(pts).label == "fast"
    assert choose(pts, "size").label == "fast"
    assert choose([Point("x", 1.0, 0.0, 1, False)]) is None


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One candidate cache for the tunes of this module: later tunes of the same inputs only re-time."""
    return tmp_path_factory.mktemp("tune-cache")


@pytest.fixture(scope="module")
def trained_mlp():
    model = digits_mlp()
    train(model, digits_subset(900), None, TrainConfig(epochs=6))
    tr, te = digits(as_images=False)
    return model.eval(), tr, te


def _ort_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]
    return float((out.argmax(1) == y).mean())


def test_tune_chooses_a_model_that_meets_the_constraint_and_resumes_from_cache(trained_mlp, tmp_path: Path,
                                                                              shared_cache: Path) -> None:
    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=2.0), methods=("svd", "factorize"), grid=(0.8, 0.5, 0.3),
                     recover_epochs=1, screen=FAST, bench=FAST_BENCH)
    report = tune(model, tr, te, cfg, tmp_path / "a", shared_cache, executor=InlineExecutor())
    labels = [c.label for c in report.candidates]
    assert labels[:2] == ["original", "original.int8"]  # the rows to beat are always there
    assert report.chosen is not None and (tmp_path / "a" / "chosen.onnx").is_file()
    x, y = te.x.numpy(), te.y.numpy()
    original = _ort_accuracy(tmp_path / "a" / "models" / "original.onnx", x, y)
    chosen = _ort_accuracy(tmp_path / "a" / "chosen.onnx", x, y)
    assert 100 * (original - chosen) <= 2.0 + 1e-9  # independently re-measured on the held-out data
    win = next(c for c in report.candidates if c.label == report.chosen)
    cell = "cpu/b1"
    rivals = [c for c in report.candidates if c.feasible and cell in c.confirm_ms]
    assert win.confirm_ms[cell] == min(c.confirm_ms[cell] for c in rivals)
    assert all(c.feasible for c in report.candidates if c.confirm_ms and c.kind == "structural")
    assert report.counts["evaluated"] >= 4 and report.counts["cached"] == 0
    from minreal.app.tune.output import plot_tune

    info = plot_tune(report, tmp_path / "front.png")  # what front.png shows: every file that meets the constraint
    legend = {lb.removesuffix(" (chosen)") for lb in info.panels[0].legend}
    assert {c.label for c in report.candidates if c.feasible} <= legend and (tmp_path / "front.png").is_file()
    assert list(info.panels[0].chosen) == [report.chosen]
    again = tune(model, tr, te, cfg, tmp_path / "b", shared_cache, executor=InlineExecutor())
    assert again.counts["cached"] == again.counts["evaluated"] == report.counts["evaluated"]
    assert [s["probes"] for s in again.searches] == [s["probes"] for s in report.searches]


def test_bisection_prepares_each_method_once_and_reuses_zero_shot_models(trained_mlp, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted calls: every probe of a method's bisections realises from one prepared state, and a recovered
    candidate starts from the zero-shot model of its budget instead of realising it again."""
    import minreal.compress.registry as registry
    from minreal.app.tune import candidate

    model, tr, te = trained_mlp
    monkeypatch.setattr(candidate, "_PREPARED", {})
    monkeypatch.setattr(candidate, "_ZERO_SHOT", {})
    prepared, realised, from_disk = collections.Counter(), collections.Counter(), collections.Counter()
    sizes: set[int] = set()
    real_prepare, real_realise = registry.prepare, registry.realise

    def counting_prepare(model, data, method, config=None, cache_dir=None):
        prepared[method] += 1
        sizes.add(len(data))
        result = real_prepare(model, data, method, config, cache_dir=cache_dir)
        from_disk[method] += result.cached
        return result

    def counting_realise(prep, config=None, recovery=None, held_out=None, measure=True):
        realised[(prep.method, config.mac_ratio)] += 1
        return real_realise(prep, config, recovery, held_out, measure)

    monkeypatch.setattr(registry, "prepare", counting_prepare)
    monkeypatch.setattr(registry, "realise", counting_realise)
    cfg = TuneConfig(Constraint(max_accuracy_drop=2.0), methods=("svd", "factorize"), grid=(0.8, 0.5, 0.3),
                     recover_epochs=1, int8=False, screen=FAST, bench=FAST_BENCH, structure_screen=False)
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor())
    probes = [(s["method"], p["budget"]) for s in report.searches if s["recover_epochs"] == 0 for p in s["probes"]]
    raced = [(e["method"], e["budget"]) for rung in report.halving["rungs"] for e in rung]
    assert len(raced) > len(set(raced)) and set(raced) & set(probes)  # budgets met again: reuse was possible
    assert prepared == {"svd": 1, "factorize": 1}
    assert sizes == {cfg.stats_samples} and cfg.stats_samples < len(tr)  # statistics on a seeded subsample
    assert set(realised) == set(probes) | set(raced) and set(realised.values()) == {1}, (realised, probes, raced)
    # a later tune (a fresh worker: nothing in memory) loads the prepared states from the cache folder
    monkeypatch.setattr(candidate, "_PREPARED", {})
    monkeypatch.setattr(candidate, "_ZERO_SHOT", {})
    again = tune(model, tr, te, dataclasses.replace(cfg, grid=(0.8, 0.5, 0.3, 0.25)), tmp_path / "u",
                 tmp_path / "cache", executor=InlineExecutor())
    assert prepared == {"svd": 2, "factorize": 2}
    assert from_disk == {m: int(registry.get_method(m).two_phase) for m in ("svd", "factorize")}  # factorize at least
    assert again.chosen is not None


def test_a_job_past_the_deadline_is_skipped_and_never_cached(trained_mlp, tmp_path: Path) -> None:
    """--time-budget is checked before every job, in the process that runs it: a job that comes up after the
    deadline does no work and leaves no cache entry (so a later tune computes it)."""
    from minreal.app.tune.candidate import CandidateSpec, Job, LoadedSource, evaluate_candidate, fingerprint

    model, tr, te = trained_mlp
    job = Job(CandidateSpec("svd", 0.5), LoadedSource(model, tr, te), fingerprint(model, tr, te), tmp_path / "cache",
              Constraint(max_accuracy_drop=2.0), Quality(0.9), ("cpu",), "cpu-vnni", False, deadline=0.0)
    result = evaluate_candidate(job)
    assert result.skipped and result.error.startswith("skipped") and not result.feasible
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    done = evaluate_candidate(dataclasses.replace(job, deadline=None))
    assert not done.skipped and done.mac_ratio is not None


class _ByLength(nn.Module):
    """Decides on its input's length in Python: torch.fx stops, the width trace carries example values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 8:
            x = x * 0.5
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_candidate_whose_trace_decides_on_a_dynamic_axis_is_refused_once_per_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tune that keeps a dynamic sequence axis refuses a width candidate whose graph decided on the length (12 > 8
    at the data's length, not at half of it), in one line, with no files and before any recovery; the check runs
    once for every budget of the method."""
    from minreal.app.tune import candidate
    from minreal.app.tune.candidate import CandidateSpec, Job, LoadedSource, evaluate_candidate, fingerprint
    from minreal.compress import registry
    from minreal.compress.core.data import Dataset
    from minreal.compress.core.width import tracing

    torch.manual_seed(0)
    model = _ByLength().eval()
    tr, te = Dataset(torch.randn(32, 12, 8)), Dataset(torch.randn(16, 12, 8))
    calls: list[int] = []
    check = tracing.require_decisions_hold
    monkeypatch.setattr(tracing, "require_decisions_hold", lambda *a: calls.append(1) or check(*a))
    monkeypatch.setattr(candidate, "_AXES_CHECKED", {})
    job = Job(CandidateSpec("wanda", 0.8), LoadedSource(model, tr, te), fingerprint(model, tr, te), tmp_path / "cache",
              Constraint(max_accuracy_drop=2.0), Quality(0.9), ("cpu",), "cpu-vnni", False,
              dynamic_axes=(("input", ((0, "batch"), (1, "seq"))),))
    def no_recovery(report: object, model: nn.Module, new: nn.Module, data: Dataset, recovery: object, *a: object,
                    **k: object) -> nn.Module:
        assert recovery is None, "a refused candidate was recovered"
        return new

    monkeypatch.setattr(registry, "apply_recovery", no_recovery)
    for spec in (CandidateSpec("wanda", 0.8), CandidateSpec("wanda", 0.7, 1)):
        result = evaluate_candidate(dataclasses.replace(job, spec=spec))
        assert result.error.startswith("dynamic axes besides the batch: seq: the trace fixed 1 decision(s)"), \
            result.error
        assert "decides otherwise at seq 6: " in result.error
        assert "\n" not in result.error and not result.files and not result.feasible
    assert calls == [1]
    # at a length of 32 the decision rests on the length (32 > 8, 16 > 8) but keeps its outcome: the candidate
    # stands, its result carries the warning the tune's report states
    tr, te = Dataset(torch.randn(32, 32, 8)), Dataset(torch.randn(16, 32, 8))
    job = dataclasses.replace(job, source=LoadedSource(model, tr, te), fingerprint=fingerprint(model, tr, te))
    result = evaluate_candidate(dataclasses.replace(job, spec=CandidateSpec("wanda", 0.8)))
    assert result.error is None and len(result.warnings) == 1, (result.error, result.warnings)
    assert result.warnings[0].startswith("dynamic axes besides the batch, decisions that rest on them: seq: 1 of")


def test_tune_says_a_dynamic_axis_warning_on_the_console_once_per_method(tmp_path: Path) -> None:
    """A candidate whose width trace rests a decision on the kept sequence length (32 > 8 and 16 > 8: the same
    outcome) stands; the tune says so in a progress line of its own, once for the method, and its notes keep it."""
    from minreal.compress.core.data import Dataset

    torch.manual_seed(0)
    model = _ByLength().eval()
    tr = Dataset(torch.randn(64, 32, 8), torch.randn(64, 32, 4))
    te = Dataset(torch.randn(32, 32, 8), torch.randn(32, 32, 4))
    cfg = TuneConfig(Constraint(max_mse_increase=1e9), methods=("wanda",), grid=(0.8,), qat=False, int8=False,
                     accuracy_control=False, screen=FAST, bench=FAST_BENCH,
                     dynamic_axes={"input": {0: "batch", 1: "seq"}})
    said: list[str] = []
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor(),
                  progress=said.append)
    lines = [line for line in said if "WARNING" in line]
    assert len(lines) == 1, said
    assert lines[0].startswith("[tune] WARNING: wanda: dynamic axes besides the batch, decisions that rest on them: "
                               "seq: 1 of"), lines
    assert [n for n in report.notes if n.startswith("WARNING: ")] == [lines[0].removeprefix("[tune] ")]


def test_tune_cli_writes_a_directory_that_check_can_gate(workdir: Path, run_cli: Callable) -> None:
    args = ["tune", "--allow-data-mismatch", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9",
            "-m", "svd", "--grid", "0.8,0.4", "--out", "t", "--cache-dir", "cache", "--screen-seconds", "0.02",
            "--min-seconds", "0.02", "--repeats", "1", "-q"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "verdict:" in result.output and "original.int8" in result.output
    report = json.loads(Path("t/report.json").read_text())
    assert report["kind"] == "tune" and report["chosen"] and Path("t/chosen.onnx").is_file()
    assert Path("t/front.png").is_file() and Path("t/report.md").read_text().startswith("# minreal tune report")
    assert report["candidates"][0]["onnx"] == "models/original.onnx"  # paths relative to the tune directory
    gate = CliRunner().invoke(cli, ["check", "t/report.json", "--min-agreement", "0.9"])
    assert gate.exit_code == 0, gate.output
    strict = CliRunner().invoke(cli, ["check", "t/report.json", "--max-size", "0.001"])  # no file is that small
    assert strict.exit_code == 1, strict.output
    beyond = CliRunner().invoke(cli, ["check", "t/report.json", "--min-agreement", "1.01"])  # not a fraction
    assert beyond.exit_code == 2 and "--min-agreement" in beyond.output
    code, _, err = run_cli(["tune", "net.py:make", "--data", "digits-flat", "--out", "u"])
    assert code == 2 and "exactly one constraint" in err and "Traceback" not in err and not Path("u").exists()
    plan = CliRunner().invoke(cli, ["tune", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9",
                                    "-m", "svd", "-m", "factorize", "--recover-epochs-max", "2", "--out", "v",
                                    "--dry-run", "--format", "onnx,ort", "--max-size", "300", "--json", "-q"])
    assert plan.exit_code == 0, plan.output
    dry = json.loads(plan.output)
    assert dry["dry_run"] and not Path("v").exists()  # a plan writes nothing
    assert any("successive halving of up to 4 candidate(s)" in line for line in dry["plan"]), dry["plan"]
    assert any("chosen.ort" in line and "judges the .ort files too" in line for line in dry["plan"]), dry["plan"]
    assert dry["estimated_total_s"] == pytest.approx(sum(dry["estimated_s"].values()), abs=0.5)


def test_tune_format_ort_converts_the_chosen_file_and_checks_it_against_chosen_onnx(workdir: Path,
                                                                                    run_cli: Callable) -> None:
    """``--format onnx,ort``: chosen.ort and chosen.required_operators.config beside chosen.onnx, the .ort file loads
    in ONNX Runtime and gives chosen.onnx's outputs, and the report, report.md and console name it; with nothing
    chosen nothing is converted and the console says so; an --ort-* option without ort in --format is a usage error."""
    from minreal.export.ort_format import read_operator_config
    from minreal.export.variant import PARITY_BATCH_SIZES

    args = ["tune", "--allow-data-mismatch", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9",
            "-m", "svd", "--grid", "0.5", "--cache-dir", "cache", "--screen-seconds", "0.02", "--min-seconds", "0.02",
            "--repeats", "1", "--no-qat", "--workers", "0"]  # in this process: the spawned workers are tested above
    code, out, err = run_cli([*args, "--out", "t", "--format", "onnx,ort", "--ort-optimization", "basic"])
    assert code == 0, err
    report = json.loads(Path("t/report.json").read_text())
    record = report["chosen_ort"]
    assert record["path"] == "chosen.ort" and record["config_path"] == "chosen.required_operators.config"
    assert record["optimization"] == "basic" and Path("t/chosen.ort").stat().st_size == record["bytes"]
    assert record["parity"]["against"] == "chosen.onnx" and record["parity"]["passed"]
    assert record["parity"]["batch_sizes"] == list(PARITY_BATCH_SIZES) and 0 < record["gzip_bytes"]
    assert read_operator_config("t/chosen.required_operators.config")  # the operators a minimal build needs
    x = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    got, want = (ort.InferenceSession(f"t/chosen.{ext}", providers=["CPUExecutionProvider"]) for ext in ("ort", "onnx"))
    np.testing.assert_allclose(got.run(None, {got.get_inputs()[0].name: x})[0],
                               want.run(None, {want.get_inputs()[0].name: x})[0], rtol=1e-4, atol=1e-5)
    assert "ORT format: wrote chosen.ort" in out
    assert "chosen.ort, chosen.required_operators.config; candidate cache" in out
    assert "--include_ops_by_config chosen.required_operators.config" in Path("t/report.md").read_text()
    code, out, err = run_cli([*args, "--out", "n", "--format", "onnx,ort", "--max-size", "0.01"])
    # nothing meets the limit, not even the original: the report is written and the exit says so (`tune && ship`)
    assert code == 1 and err.strip().splitlines()[-1].startswith("minreal: no model meets ") and \
        err.strip().endswith("not even the original's (the report is in n)"), err
    assert "ORT format: no model was chosen, so nothing was converted" in out
    assert not Path("n/chosen.onnx").exists() and not Path("n/chosen.ort").exists()
    assert json.loads(Path("n/report.json").read_text())["chosen_ort"] is None
    code, _, err = run_cli([*args, "--out", "u", "--ort-platform", "arm"])
    assert code == 2 and "--ort-platform applies to the ORT-format file: add --format onnx,ort" in err
    assert not Path("u").exists()


def test_an_arm64_int8_choice_is_converted_for_the_arm_platform(trained_mlp, tmp_path: Path,
                                                                shared_cache: Path) -> None:
    """An INT8 file in the arm64 format keeps ARM's int8 fusions in chosen.ort (the converter's arm platform), as
    ``run`` and ``export`` convert it, and still matches chosen.onnx."""
    from minreal.export.settings import OrtConfig

    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=100.0), objective="size", methods=("svd",), grid=(0.9,),
                     variant=VariantConfig(quant_target="arm64"), qat=False, screen=FAST, bench=FAST_BENCH,
                     ort=OrtConfig())
    report = tune(model, tr, te, cfg, tmp_path / "a", shared_cache, executor=InlineExecutor())
    chosen = next(c for c in report.candidates if c.label == report.chosen)
    assert chosen.precision == "int8"  # the smallest file that meets a 100-point drop is an INT8 one
    assert report.chosen_ort["target_platform"] == "arm" and report.chosen_ort["parity"]["passed"]
    assert (tmp_path / "a" / "chosen.ort").is_file()
    feasible = [c for c in report.candidates if c.feasible]  # --objective size ranks what ships: the .ort files
    assert all(c.ort_bytes for c in feasible) and chosen.ort_bytes == min(c.ort_bytes for c in feasible)
    assert report.chosen_ort["bytes"] == chosen.ort_bytes


def test_size_objective_picks_the_smallest_feasible_file_of_all(trained_mlp, tmp_path: Path,
                                                               shared_cache: Path) -> None:
    """Size needs no timing: the smallest file that meets the constraint wins even off the latency front."""
    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=2.0), objective="size", methods=("svd", "factorize"),
                     grid=(0.8, 0.5, 0.3), recover_epochs=1, screen=FAST, bench=FAST_BENCH)
    report = tune(model, tr, te, cfg, tmp_path / "s", shared_cache, executor=InlineExecutor())
    feasible = [c for c in report.candidates if c.feasible]
    assert report.chosen == min(feasible, key=lambda c: (c.onnx_bytes, c.screen_ms["cpu/b1"])).label


def test_max_size_is_a_constraint_on_every_file_the_original_s_included(trained_mlp, tmp_path: Path,
                                                                        shared_cache: Path) -> None:
    """--max-size below the original's fp32 file: it cannot be chosen, whatever its speed; every file over the limit
    is infeasible and named in the notes, the chosen one fits and meets the quality constraint too."""
    model, tr, te = trained_mlp
    base = TuneConfig(Constraint(max_accuracy_drop=2.0), methods=("svd",), grid=(0.8, 0.5), screen=FAST,
                      bench=FAST_BENCH)
    free = tune(model, tr, te, base, tmp_path / "free", shared_cache, executor=InlineExecutor())
    original = next(c for c in free.candidates if c.label == "original")
    limit = (original.onnx_bytes - 1) / 1024
    report = tune(model, tr, te, dataclasses.replace(base, max_size_kb=limit), tmp_path / "small", shared_cache,
                  executor=InlineExecutor())
    over = [c for c in report.candidates if c.onnx_bytes > limit * 1024]
    assert over and all(not c.feasible for c in over)
    assert all(0 < c.gzip_bytes for c in report.candidates)  # every file's compressed size is reported
    assert any("exceed --max-size" in n and "original" in n for n in report.notes)
    assert report.chosen != "original" and f"file <= {limit:g} KB" in report.constraint
    if report.chosen is not None:
        chosen = next(c for c in report.candidates if c.label == report.chosen)
        assert chosen.feasible and chosen.onnx_bytes <= limit * 1024
    with pytest.raises(TuneError, match="--max-size"):
        dataclasses.replace(base, max_size_kb=0.0)


def test_max_size_with_format_ort_judges_the_ort_file_of_every_feasible_file(trained_mlp, tmp_path: Path,
                                                                            shared_cache: Path) -> None:
    """--format onnx,ort with --max-size: each feasible file is converted (in a scratch folder, gone after) and its
    .ort size recorded; at a limit of the smallest .ort file, a file whose .onnx file fits but whose .ort file does
    not is infeasible, the notes say why, and the chosen file fits as .onnx and as .ort."""
    from minreal.export.ort_format import convert_to_ort, ort_for_target
    from minreal.export.settings import OrtConfig

    model, tr, te = trained_mlp
    base = TuneConfig(Constraint(max_accuracy_drop=2.0), methods=("svd",), grid=(0.8,), screen=FAST, bench=FAST_BENCH,
                      ort=OrtConfig())
    free = tune(model, tr, te, base, tmp_path / "free", shared_cache, executor=InlineExecutor())
    assert all(c.ort_bytes is None for c in free.candidates)  # no --max-size: only chosen.onnx is converted
    feasible, target = [c for c in free.candidates if c.feasible], free.config["quant_target"]
    ort_bytes = {c.label: convert_to_ort(c.onnx, tmp_path / f"{c.label}.ort",
                                         ort_for_target(base.ort, target)).bytes  # the tune's platform
                 for c in feasible}
    keeper = min(feasible, key=lambda c: ort_bytes[c.label])
    limit = ort_bytes[keeper.label]
    victims = [c.label for c in feasible if c.onnx_bytes <= limit < ort_bytes[c.label]]
    assert victims  # the limit lies between a file's .onnx and .ort sizes
    report = tune(model, tr, te, dataclasses.replace(base, max_size_kb=limit / 1024), tmp_path / "small",
                  shared_cache, executor=InlineExecutor())
    by_label = {c.label: c for c in report.candidates}
    assert all(by_label[v].ort_bytes == ort_bytes[v] and not by_label[v].feasible for v in victims)
    assert any("exceed --max-size" in n and "as .ort" in n and all(v in n for v in victims) for n in report.notes)
    assert report.chosen == keeper.label and report.chosen_ort["bytes"] == by_label[keeper.label].ort_bytes == limit
    assert "(.onnx and .ort)" in report.constraint and ".ort KB" in format_tune(report)
    assert [p.name for p in (tmp_path / "small").glob(".minreal-ort*")] == []  # the scratch folder is gone
    assert "ort_sizes" in report.phases_s and not any("conversion --max-size judged" in n for n in report.notes)


def test_cache_key_follows_weights_data_shapes_and_graph(trained_mlp) -> None:
    import copy

    import torch

    from minreal.app.tune.candidate import CandidateSpec, Job, LoadedSource, cache_key, fingerprint
    from minreal.compress.core.data import Dataset

    model, tr, te = trained_mlp
    base = fingerprint(model, tr, te)
    other = copy.deepcopy(model)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1e-3
    flat = Dataset(tr.x.reshape(len(tr), 8, 8), tr.y)
    assert len({base, fingerprint(other, tr, te), fingerprint(model, flat, te)}) == 3

    def key(**kw: object) -> str:
        job = Job(CandidateSpec("svd", 0.5), LoadedSource(model, tr, te), base, Path("."),
                  Constraint(min_agreement=0.9), Quality(agreement=1.0), ("cpu",), "cpu", True, (), "graph-a")
        return cache_key(dataclasses.replace(job, **kw))

    assert key() == key(constraint=Constraint(max_accuracy_drop=9.0))  # results are re-judged, not recomputed
    assert len({key(), key(graph="graph-b"), key(quant_target="tensorrt"), key(providers=("cuda",)),
                key(extra=(("rank_multiple", 8),)), key(spec=CandidateSpec("svd", 0.5, 1))}) == 6


def test_a_worker_that_loads_other_inputs_stops_the_tune(workdir: Path) -> None:
    from minreal.app.tune.candidate import CandidateSpec, InputsChangedError, Job, SpecSource, evaluate_candidate

    job = Job(CandidateSpec("svd", 0.5), SpecSource("net.py:make", "digits-flat"), "not-what-the-worker-loads",
              workdir / "cache", Constraint(min_agreement=0.5), Quality(agreement=1.0), ("cpu",), "cpu", False)
    with pytest.raises(InputsChangedError, match="--workers 0"):
        evaluate_candidate(job)
    assert not (workdir / "cache").exists() or not any((workdir / "cache").iterdir())


def test_gate_on_a_tune_report_names_the_chosen_model_and_fails_without_one(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    from minreal.app.gate import check_reports

    lat = [{"model": m, "provider": "cpu", "batch_size": 1, "stats": {"p50_ms": ms}, "process_p50_ms": [ms]}
           for m, ms in (("original", 2.0), ("a@0.5", 1.0))]
    confirm = {"schema_version": 1, "models": [{"name": "original"}, {"name": "a@0.5"}], "latency": lat,
               "ratios": [{"model": "a@0.5", "reference": "original", "provider": "cpu", "batch_size": 1,
                           "statistic": "p50_ms", "median": 0.5, "min": 0.5, "max": 0.5, "per_process": [0.5]}],
               "metrics": [{"model": "original", "accuracy": 0.9, "top1_agreement": 1.0},
                           {"model": "a@0.5", "accuracy": 0.895, "top1_agreement": 0.99}]}
    for chosen, ratio in (("a@0.5", 0.5), ("original", 1.0)):
        (tmp_path / "r.json").write_text(json.dumps({"kind": "tune", "chosen": chosen, "confirm": confirm}))
        [(name, res)] = check_reports(tmp_path / "r.json", None, 1.0, 1.0, None, None)
        assert res.passed and {c.model for c in res.criteria} == {"chosen"}
        assert next(c for c in res.criteria if c.name == "latency_ratio").measured == ratio
    (tmp_path / "n.json").write_text(json.dumps({"kind": "tune", "chosen": None, "verdict": "nothing met it"}))
    assert run(["check", str(tmp_path / "n.json"), "--max-accuracy-drop", "1"]) == 1
    assert "nothing met it" in capsys.readouterr().out
    sized = {**confirm, "models": [{"name": "original", "file_size_bytes": 4096},
                                   {"name": "a@0.5", "file_size_bytes": 2048}]}
    (tmp_path / "s.json").write_text(json.dumps({"kind": "tune", "chosen": "a@0.5", "confirm": sized,
                                                 "chosen_ort": {"path": "chosen.ort", "bytes": 3072}}))
    assert run(["check", str(tmp_path / "s.json"), "--max-size", "3"]) == 0  # chosen.onnx 2 KB, chosen.ort 3 KB
    assert run(["check", str(tmp_path / "s.json"), "--max-size", "2.5"]) == 1
    [failed] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("FAILED")]
    assert "size_kb chosen.ort: 3 (allowed 2.5)" in failed and "chosen:" not in failed


def test_tune_refuses_unmeasurable_constraints_and_path_like_plan_labels(trained_mlp, tmp_path: Path) -> None:
    from minreal.compress.core.run_case import VariantSpec
    from minreal.compress.methods.svd import SVDConfig

    model, tr, te = trained_mlp
    with pytest.raises(TuneError, match="--max-mse-increase needs float targets"):
        tune(model, tr, te, TuneConfig(Constraint(max_mse_increase=0.1)), tmp_path / "a", tmp_path / "c")
    bad = TuneConfig(Constraint(min_agreement=0.9), plan=(VariantSpec("../escape", "svd", SVDConfig(mac_ratio=0.5)),))
    with pytest.raises(TuneError, match="path separators"):
        tune(model, tr, te, bad, tmp_path / "b", tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_tune_refuses_a_method_it_cannot_search_naming_why(trained_mlp, tmp_path: Path) -> None:
    """cbalanced meets a MAC budget but has one phase (its Gramians for every budget probed); ssm has no MAC budget."""
    model, tr, te = trained_mlp
    for method, why in (("cbalanced", "it would do all its work again for every budget probed (no budget-free "
                                      "prepare phase)"),
                        ("ssm", "it has no whole-model MAC budget")):
        cfg = TuneConfig(Constraint(min_agreement=0.9), methods=(method,))
        with pytest.raises(TuneError) as err:
            tune(model, tr, te, cfg, tmp_path / method, tmp_path / "c")
        head, choices = str(err.value).split("; choose from ")
        assert head == f"tune cannot search method {method!r}: {why} (a plan file's variant runs it as given)"
        assert set(choices.split(", ")) == {"svd", "factorize", "fde", "magnitude", "wanda", "depth"}
        assert not (tmp_path / method / "models").exists()


def test_halving_pool_takes_the_budgets_just_below_each_zero_shot_boundary() -> None:
    from minreal.app.tune.halving import halving_pool, rung_fractions

    grid = (0.9, 0.8, 0.7, 0.6, 0.5)
    pool = halving_pool(grid, {"a": 0.7, "b": None, "c": 0.5}, per_method=2)
    assert pool == [("a", 0.6), ("a", 0.5), ("b", 0.9), ("b", 0.8)]  # c met the smallest budget: nothing to race
    assert rung_fractions(3, 3) == (1 / 9, 1 / 3, 1.0) and rung_fractions(2, 1) == (1.0,)


def test_halving_pool_races_a_zero_shot_model_once_whatever_budgets_realise_it() -> None:
    """magnitude on an option-A ResNet realised 0.9, 0.8 and 0.7 as one model: the pool keeps the largest of those
    budgets, gives the duplicate's place to no other budget and names it as a twin; different digests, or budgets
    without one (not probed), are different models."""
    from minreal.app.tune.halving import halving_pool, halving_twins
    from minreal.compress.core.cache import model_key

    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    same, other = model_key(net), model_key(nn.Linear(4, 3))
    assert same == model_key(copy.deepcopy(net)) and same != other
    grid = (0.9, 0.8, 0.7, 0.6, 0.5)
    models = {("mag", 0.9): same, ("mag", 0.8): model_key(copy.deepcopy(net)),
              ("wanda", 0.9): same, ("wanda", 0.8): other, ("svd", 0.9): None}
    boundaries = {"mag": None, "wanda": None, "svd": None}
    pool = halving_pool(grid, boundaries, per_method=2, models=models)
    assert pool == [("mag", 0.9), ("wanda", 0.9), ("wanda", 0.8), ("svd", 0.9), ("svd", 0.8)]
    assert halving_twins(grid, boundaries, per_method=2, models=models) == [("mag", 0.8, 0.9)]
    assert halving_pool(grid, {"mag": None}, per_method=2) == [("mag", 0.9), ("mag", 0.8)]


def test_halving_keeps_every_candidate_that_meets_and_promotes_a_third_of_the_rest() -> None:
    """At a rung: a candidate that meets the constraint is done (a real candidate, whatever its MACs) and dominates
    its method's larger budgets; of those that miss, ceil(n / eta) with the smallest losses go on. At the last rung
    what still misses is marked so."""
    from minreal.app.tune.halving import Halving, RungEntry

    h = Halving((1 / 9, 1 / 3, 1.0), 3, [])

    def entry(method: str, budget: float, loss: float | None, meets: bool, outcome: str = "") -> RungEntry:
        return RungEntry(method, budget, 1 / 9, 100, loss, meets, 1.0, outcome)

    rung = [entry("a", 0.6, 0.4, True), entry("a", 0.5, 0.8, True), entry("b", 0.9, 3.0, False),
            entry("b", 0.8, 5.0, False), entry("c", 0.7, None, False, "refused"), entry("d", 0.9, 1.5, False),
            entry("e", 0.4, 2.0, False), entry("f", 0.9, 0.9, True)]
    promoted = h.promote(rung)
    assert [e.outcome for e in rung] == ["dominated", "met", "cut", "cut", "refused", "promoted", "promoted", "met"]
    assert promoted == [("d", 0.9), ("e", 0.4)]  # ceil(4 that miss / 3) = 2, the smallest losses first
    assert [(e.method, e.budget) for e in h.met()] == [("a", 0.5), ("f", 0.9)]  # f stays, though it has more MACs
    second = [RungEntry("d", 0.9, 1 / 3, 300, 0.5, True, 2.0), RungEntry("e", 0.4, 1 / 3, 300, 1.2, False, 2.0)]
    assert h.promote(second) == [("e", 0.4)] and second[0].outcome == "met"
    last = [RungEntry("e", 0.4, 1.0, 900, 1.1, False, 6.0)]
    assert h.promote(last) == [] and last[0].outcome == "missed"
    record = h.record()
    assert [len(r) for r in record["rungs"]] == [8, 2, 1] and record["fractions"] == [1 / 9, 1 / 3, 1.0]


def test_short_rungs_recover_on_a_subsample_and_only_what_meets_is_exported(trained_mlp, tmp_path: Path) -> None:
    """A recovered search races by successive halving: a short rung recovers on a seeded subsample of the
    calibration data; only candidates that meet the constraint (at any rung) become files, and the report says
    which candidate got which share of the recovery."""
    from minreal.app.tune.candidate import CandidateSpec, subsample

    model, tr, te = trained_mlp
    part = subsample(tr, 1 / 9)
    assert len(part) == math.ceil(len(tr) / 9) and torch.equal(part.x, subsample(tr, 1 / 9).x)
    assert CandidateSpec("svd", 0.5, 2, fraction=1 / 3).label == "svd@0.5+r2~0.33"
    assert CandidateSpec("svd", 0.5, 0, fraction=1 / 3).short is False  # nothing to shorten without recovery
    cfg = TuneConfig(Constraint(max_accuracy_drop=4.0), methods=("svd",), grid=(0.9, 0.6, 0.5, 0.4),
                     recover_epochs=1, int8=False, screen=FAST, bench=FAST_BENCH, structure_screen=False)
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor())
    rungs = report.halving["rungs"]
    # the budgets below the zero-shot boundary race once per distinct zero-shot model: a twin (the same model as a
    # larger budget, as 0.5 and 0.4 can be at the CPU's rank multiple) is named instead of racing
    twins = report.halving["twins"]
    assert len(rungs[0]) + len(twins) == cfg.halving_per_method  # every budget below the boundary, once
    for m, b, twin in twins:
        assert twin in [e["budget"] for e in rungs[0]] and twin > b
        assert any(n.startswith(f"{m}@{b:g} realises the same model as {m}@{twin:g} (MAC ratio ") for n in report.notes)
    assert {e["fraction"] for e in rungs[0]} == {1 / 9} and {e["samples"] for e in rungs[0]} == {len(part)}
    met = {f"svd@{e['budget']:g}+r1" + ("" if e["fraction"] == 1 else f"~{e['fraction']:.2g}")
           for r in rungs for e in r if e["outcome"] == "met"}
    structural = {c.label for c in report.candidates if c.kind == "structural"}
    assert met and met <= structural  # every candidate that met the constraint is a file
    assert not {lb for lb in structural if "+r1" in lb} - met  # and no recovered file that did not
    assert {e["outcome"] for r in rungs for e in r} <= {"met", "dominated", "promoted", "cut", "missed"}
    assert {"baselines", "search", "screen", "confirm", "recover"} <= set(report.phases_s)


def test_quantisation_aware_recovery_runs_only_where_plain_int8_misses(trained_mlp, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """QAT changes the ranges, not the structure: where the recovered winner's post-training INT8 meets the
    constraint in ONNX Runtime no QAT candidate is trained (and the report says so); where it misses, one is. The
    original's file runs once on the held-out data in ONNX Runtime, the reference of every file judged there (the
    INT8 check and the final measurement each ran it again), and the recoveries' teacher runs once per batch of
    their splits (each recovered candidate ran it again)."""
    import hashlib

    import minreal.runtime_bench.metrics as metrics_module
    from minreal.app.tune import search as tune_search
    from minreal.compress.core import evaluate

    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=4.0), methods=("svd",), grid=(0.9, 0.6, 0.5, 0.4),
                     recover_epochs=1, screen=FAST, bench=FAST_BENCH, structure_screen=False)
    checked = []
    real = tune_search._int8_meets

    def meets(res, held_out, original, base):
        checked.append(res.spec.label)
        return real(res, held_out, original, base)

    monkeypatch.setattr(tune_search, "_int8_meets", meets)
    opened: list[str] = []
    session = metrics_module.create_session
    monkeypatch.setattr(metrics_module, "create_session",
                        lambda path, *a, **k: opened.append(Path(path).name) or session(path, *a, **k))
    batches: list[str] = []  # the original's torch passes (the recoveries' teacher: a copy of it), by batch
    weights = evaluate._prediction_key(model, te, 1)
    real_call = evaluate.call

    def recorded(m: torch.nn.Module, xb: torch.Tensor) -> object:
        key = evaluate._prediction_key(m, te, 1) if len(xb) > 1 else None
        if key is not None and key[0] == weights[0]:
            batches.append(hashlib.sha1(xb.numpy().tobytes()).hexdigest())
        return real_call(m, xb)

    monkeypatch.setattr(evaluate, "call", recorded)
    report = tune(model, tr, te, cfg, tmp_path / "a", tmp_path / "cache", executor=InlineExecutor())
    assert opened.count("original.onnx") == 1 and len(opened) > 2
    held = {hashlib.sha1(te.x[i : i + 256].numpy().tobytes()).hexdigest() for i in range(0, len(te), 256)}
    taught = [b for b in batches if b not in held]  # held-out: the tune's reference and the candidates' teacher memo
    assert taught and len(taught) == len(set(taught))  # every recovered candidate distils from one teacher pass
    recovered = [s for s in report.searches if s["recover_epochs"] and s["smallest_feasible"] is not None]
    assert recovered, report.searches  # the race found a recovered winner, whose INT8 was checked
    assert len(checked) == 1 and checked[0].startswith(f"svd@{recovered[0]['smallest_feasible']:g}+r1")
    qat = [c for c in report.candidates if c.precision == "int8-qat"]
    skipped = [n for n in report.notes if n.startswith("no quantisation-aware recovery")]
    assert bool(qat) != bool(skipped)  # exactly one of them: trained because INT8 missed, or skipped because it met
    monkeypatch.setattr(tune_search, "_int8_meets", lambda *a: False)
    again = tune(model, tr, te, cfg, tmp_path / "b", tmp_path / "cache", executor=InlineExecutor())
    assert [c.label for c in again.candidates if c.precision == "int8-qat"] == [f"{checked[0]}+qat.int8"]


def test_dry_run_estimate_counts_each_phase_in_the_probe_s_units() -> None:
    """The plan's arithmetic, by hand: statistics as measured passes per method over the statistics samples, every
    rung of the race as its share of the recovery's training steps (an upper bound: as if nothing met early), the
    held-out pass of each probe, the timing protocols."""
    from minreal.app.tune.dryrun import EXPORT_S, PREPARE_PASSES, PROCESS_START_S, Probe, estimate_plan

    probe = Probe(forward_s=0.001, train_s=0.004, samples=64)
    cfg = TuneConfig(Constraint(max_accuracy_drop=1.0), methods=("factorize", "svd"), grid=(0.9, 0.7, 0.5),
                     recover_epochs=3, stats_samples=500, screen=FAST, bench=FAST_BENCH)
    est = estimate_plan(cfg, cfg.methods, calib=1000, held_out=200, probe=probe)
    assert est.seconds["prepare"] == pytest.approx(PREPARE_PASSES["factorize"] * 0.001 * 500)  # svd reads weights
    assert est.seconds["zero-shot"] == pytest.approx(2 * 3 * (0.2 + EXPORT_S / 2))  # ceil(log2(4)) + 1 = 3 probes
    step = 3 * 800 * 0.005  # the full cap: 3 epochs of the 800 training samples (20 % validate), train + teacher
    rungs = [(4, 1 / 9), (2, 1 / 3), (1, 1.0)]  # pool 2 methods x 2 budgets; a third (rounded up) goes on
    assert est.seconds["recovery"] == pytest.approx(sum(n * (f * step + 0.2) for n, f in rungs))
    assert est.seconds["quantisation-aware"] == pytest.approx(3 * 800 * (0.004 * 1.5 + 0.001))
    files = 3 + 2 * 2 * 2
    assert est.seconds["screen"] == pytest.approx(files * 1 * (FAST.min_seconds * FAST.repeats + PROCESS_START_S))
    assert est.total == pytest.approx(sum(est.seconds.values()))


def test_dry_run_plan_names_the_ort_conversions_of_format_ort() -> None:
    """--format onnx,ort: the plan names chosen.ort and its check; with --max-size, also that every feasible file is
    converted to judge its .ort size; without --format ort, no ORT line."""
    from minreal.app.tune.dryrun import Probe, estimate_plan
    from minreal.export.settings import OrtConfig

    probe = Probe(forward_s=0.001, train_s=0.004, samples=64)
    cfg = TuneConfig(Constraint(max_accuracy_drop=1.0), methods=("svd",), grid=(0.5,), screen=FAST, bench=FAST_BENCH)

    def ort_lines(**kw: object) -> list[str]:
        est = estimate_plan(dataclasses.replace(cfg, **kw), cfg.methods, calib=100, held_out=50, probe=probe)
        return [line for line in est.lines if "ORT" in line or ".ort" in line]

    assert ort_lines() == [] and ort_lines(max_size_kb=300.0) == []
    [chosen] = ort_lines(ort=OrtConfig())
    assert "chosen.ort" in chosen and "checked against chosen.onnx" in chosen and "--max-size" not in chosen
    [both] = ort_lines(ort=OrtConfig(), max_size_kb=300.0)
    assert both.startswith(chosen) and "--max-size 300 KB judges the .ort files too" in both
    assert "every file that meets the quality constraint and fits as .onnx is converted" in both
    [ranked] = ort_lines(ort=OrtConfig(), objective="size")
    assert ranked.startswith(chosen) and "--objective size ranks the .ort files" in ranked


def test_a_worker_s_progress_reaches_this_process_s_log(caplog: pytest.LogCaptureFixture) -> None:
    """Candidates run in spawned workers; their library progress (a recovery's epochs) is shown by the tune's own
    process, as if it were its own (logs and terminals see it)."""
    import functools
    import logging

    from minreal.app.tune.executor import ProcessExecutor
    from minreal.compress.core.progress import log_progress
    from minreal.facts import PROGRESS_KEY

    with caplog.at_level(logging.INFO, logger="compress"):
        ex = ProcessExecutor(1)
        try:
            ex.map(functools.partial(log_progress, logging.getLogger("minreal.compress.core.recover"),
                                     "recovery (epochs)", 1, detail="training loss 0.5"), [3])
        finally:
            ex.close()
    found = [r for r in caplog.records if getattr(r, PROGRESS_KEY, None) == ("recovery (epochs)", 1, 3)]
    assert found and "training loss 0.5" in found[0].getMessage()


@pytest.mark.parametrize("saturates", [False, True])
def test_accuracy_control_starts_from_the_original_s_int8_of_its_format(saturates: bool, trained_mlp, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The baselines' INT8 of the original is accuracy control's plain INT8, not quantised again; where it can
    saturate on this (pretended) CPU accuracy control starts from cpu-avx2, another file, which it quantises."""
    import minreal.export.accuracy_control as accuracy_control
    import minreal.runtime_bench.cpu as cpu_facts
    from minreal.app.tune.orchestrate import _baselines

    monkeypatch.setattr(cpu_facts, "kernel_saturates", lambda: saturates)
    given, quantised = [], []
    real_control, real_quantize = accuracy_control.quantize_with_accuracy_control, accuracy_control.quantize_int8
    monkeypatch.setattr(accuracy_control, "quantize_with_accuracy_control",
                        lambda *a, **k: given.append(k["int8"]) or real_control(*a, **k))
    monkeypatch.setattr(accuracy_control, "quantize_int8",
                        lambda *a, **k: quantised.append(a[3].target) or real_quantize(*a, **k))
    model, tr, te = trained_mlp
    models = tmp_path / "models"
    models.mkdir()
    cfg = TuneConfig(Constraint(max_accuracy_drop=100.0), variant=VariantConfig(quant_target="cpu-vnni"))
    notes: list[str] = []
    baselines = _baselines(model, tr, te, cfg, models, Quality(0.9), notes, lambda line: None)
    assert [c.label for c in baselines[:2]] == ["original", "original.int8"]
    (plain,) = given
    if saturates:
        assert plain is None and quantised == ["cpu-avx2"]  # the saturation-free format: quantised afresh
        assert any("cpu-avx2" in note for note in notes)
    else:
        assert quantised == [] and Path(plain.out_path) == models / "original.int8.onnx"
        assert Path(plain.fp32_path) == models / "original.onnx" and plain.target == "cpu-vnni"


def test_an_arm64_tune_keeps_its_format_where_this_cpu_saturates_and_names_it(trained_mlp, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An arm64 file can saturate only in x86's int16 step (ARM's kernels have none): accuracy control starts from
    the original's arm64 INT8 (no switch to cpu-avx2) and a note says the accuracy here can understate ARM's; the
    report names the format of the INT8 files."""
    from types import SimpleNamespace

    import minreal.export.accuracy_control as accuracy_control
    import minreal.runtime_bench.cpu as cpu_facts
    from minreal.app.tune.orchestrate import _baselines
    from minreal.app.tune.output import int8_format_line

    monkeypatch.setattr(cpu_facts, "kernel_saturates", lambda: True)
    given = []
    real_control = accuracy_control.quantize_with_accuracy_control
    monkeypatch.setattr(accuracy_control, "quantize_with_accuracy_control",
                        lambda *a, **k: given.append(k["int8"]) or real_control(*a, **k))
    model, tr, te = trained_mlp
    models = tmp_path / "models"
    models.mkdir()
    notes: list[str] = []
    arm64 = VariantConfig(quant_target="arm64")
    _baselines(model, tr, te, TuneConfig(Constraint(max_accuracy_drop=100.0), variant=arm64), models,
               Quality(0.9), notes, lambda line: None)
    (plain,) = given
    assert plain.target == "arm64" and plain.saturates_here and Path(plain.out_path) == models / "original.int8.onnx"
    assert any("understate ARM's" in note for note in notes) and not any("cpu-avx2" in note for note in notes)
    line = int8_format_line(SimpleNamespace(config={"int8": True, "quant_target": "arm64"}))
    assert line == "INT8 files: arm64 (S8S8: symmetric int8 activations, 8-bit per-channel int8 weights)"


@pytest.fixture(scope="module")
def trained_resnet():
    from minreal.compress.models import CifarResNet

    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=2, in_channels=1)
    tr, te = digits()
    train(model, tr, None, TrainConfig(epochs=1))
    return model.eval(), tr, te


def test_tune_searches_depth_and_the_depth_width_chain_preparing_depth_once(trained_resnet, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Depth and magnitude searched: the chain depth+magnitude joins without being asked; depth's state is prepared
    once for its own search and the chain's (counted), the chain's width step once per depth cut."""
    import minreal.compress.registry as registry
    from minreal.app.tune import candidate

    model, tr, te = trained_resnet
    monkeypatch.setattr(candidate, "_PREPARED", {})
    monkeypatch.setattr(candidate, "_ZERO_SHOT", {})
    prepared: collections.Counter = collections.Counter()
    real_prepare = registry.prepare

    def counting_prepare(model, data, method, config=None, cache_dir=None):
        prepared[method] += 1
        return real_prepare(model, data, method, config, cache_dir=cache_dir)

    monkeypatch.setattr(registry, "prepare", counting_prepare)
    cfg = TuneConfig(Constraint(max_accuracy_drop=50.0), methods=("depth", "magnitude"), grid=(0.8, 0.6),
                     int8=False, screen=FAST, bench=FAST_BENCH)
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor())
    searched = {s["method"] for s in report.searches}
    assert searched == {"depth", "magnitude", "depth+magnitude"}
    chain = [c for c in report.candidates if c.label.startswith("depth+magnitude@")]
    assert chain and all(c.mac_ratio <= float(c.label.split("@")[1]) + 1e-9 for c in chain)
    depth_cuts = {p["budget"] for s in report.searches if s["method"] == "depth+magnitude" for p in s["probes"]}
    assert prepared["depth"] == 1 and 1 <= prepared["magnitude"] <= 1 + len(depth_cuts)


def test_a_chain_s_depth_step_takes_what_it_can_when_its_share_is_out_of_reach() -> None:
    """``_least_mac_ratio``: the MAC ratio with every removable block gone, from the prepared state alone."""
    from minreal.app.tune.candidate import _least_mac_ratio
    from minreal.compress.core.data import Dataset as Data
    from minreal.compress.methods.depth import DepthConfig
    from minreal.compress.models import CifarResNet
    from minreal.compress.registry import prepare, realise

    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=1, in_channels=1).eval()  # one removable block (layer1.0)
    prep = prepare(model, Data(torch.rand(16, 1, 8, 8)), "depth", DepthConfig())
    least = _least_mac_ratio(prep.state)
    assert 0.5 < least < 1.0 and _least_mac_ratio(object()) is None
    _, report = realise(prep, DepthConfig(mac_ratio=least * (1 + 1e-9)))
    assert report.mac_ratio == pytest.approx(least) and report.predicted["removed"] == ["layer1.0"]


def test_halving_extends_a_method_whose_smallest_budget_meets_early() -> None:
    """The pool comes from zero-shot losses, which undersell structures that recover well (depth): when a method's
    smallest raced budget meets the constraint before the full cap, its next grid budget below enters the next
    rung; a method whose smaller budget missed, or one that meets only at the full cap, does not extend."""
    from minreal.app.tune.halving import Halving, RungEntry

    grid = (0.9, 0.8, 0.7, 0.6, 0.5)
    h = Halving((1 / 9, 1 / 3, 1.0), 3, [("depth", 0.9), ("depth", 0.8), ("svd", 0.9), ("svd", 0.8)], grid=grid)

    def entry(method: str, budget: float, fraction: float, loss: float, meets: bool) -> RungEntry:
        return RungEntry(method, budget, fraction, 100, loss, meets, 1.0)

    # rung 1: depth@0.9 meets but depth@0.8 (smaller) is still racing: no extension yet; svd@0.8 meets, and svd@0.9
    # is dominated by it, so svd's smallest raced budget met early: svd@0.7 enters rung 2
    first = [entry("depth", 0.9, 1 / 9, 0.5, True), entry("depth", 0.8, 1 / 9, 3.0, False),
             entry("svd", 0.9, 1 / 9, 0.2, True), entry("svd", 0.8, 1 / 9, 0.8, True)]
    assert h.promote(first) == [("depth", 0.8), ("svd", 0.7)]
    assert h.extended == [("svd", 0.7, 1)]
    # rung 2: depth@0.8 meets (its method's smallest): depth@0.7 enters the last rung; svd@0.7 misses and goes on
    second = [entry("depth", 0.8, 1 / 3, 0.9, True), entry("svd", 0.7, 1 / 3, 2.0, False)]
    assert h.promote(second) == [("svd", 0.7), ("depth", 0.7)]
    assert h.extended == [("svd", 0.7, 1), ("depth", 0.7, 2)]
    # the last rung: whatever meets is done and nothing extends (there is no next rung)
    last = [entry("svd", 0.7, 1.0, 1.5, False), entry("depth", 0.7, 1.0, 0.95, True)]
    assert h.promote(last) == [] and [e.outcome for e in last] == ["missed", "met"]
    # depth@0.9 met at rung 1, before any smaller depth budget had: it stays a candidate (only the timing decides)
    assert [(e.method, e.budget) for e in h.met()] == [("depth", 0.9), ("svd", 0.8), ("depth", 0.8), ("depth", 0.7)]
    assert h.record()["extended"] == [["svd", 0.7, 1], ["depth", 0.7, 2]]
    # no grid (the default): the race never extends
    plain = Halving((1 / 3, 1.0), 3, [("svd", 0.8)])
    assert plain.promote([entry("svd", 0.8, 1 / 3, 0.1, True)]) == [] and plain.extended == []
    # the grid's smallest budget has nothing below it
    edge = Halving((1 / 3, 1.0), 3, [("svd", 0.5)], grid=grid)
    assert edge.promote([entry("svd", 0.5, 1 / 3, 0.1, True)]) == []


def test_a_structure_file_is_the_recovered_candidates_graph_with_other_weights(trained_mlp, tmp_path: Path) -> None:
    """The structure screen times a budget's zero-shot model before recovery: its file must have exactly the graph
    of the recovered candidate's file (node for node, every initializer's shape), the weights being all that
    recovery changes; and a ``files_only`` result is never a candidate (no quality, not feasible, no program)."""
    import onnx

    from minreal.app.tune.candidate import CandidateSpec, Job, LoadedSource, evaluate_candidate, fingerprint

    model, tr, te = trained_mlp
    job = Job(CandidateSpec("svd", 0.5, files_only=True), LoadedSource(model, tr, te), fingerprint(model, tr, te),
              tmp_path / "cache", Constraint(max_accuracy_drop=100.0), Quality(0.9), ("cpu",), "cpu-avx2", True)
    structure = evaluate_candidate(job)
    assert structure.error is None and not structure.feasible and structure.quality == {}
    assert sorted(structure.files) == ["fp32", "int8"] and structure.spec.label == "svd@0.5~structure"
    recovered = evaluate_candidate(dataclasses.replace(job, spec=CandidateSpec("svd", 0.5, 1)))
    assert recovered.feasible and "pt2" in recovered.files  # a loose constraint: every candidate is a file
    for kind in ("fp32", "int8"):
        a, b = (onnx.load(r.files[kind]).graph for r in (structure, recovered))
        assert [(n.op_type, list(n.input), list(n.output)) for n in a.node] == \
            [(n.op_type, list(n.input), list(n.output)) for n in b.node]
        assert {i.name: list(i.dims) for i in a.initializer} == {i.name: list(i.dims) for i in b.initializer}
    first = onnx.load(structure.files["fp32"]).graph.initializer
    second = {i.name: i for i in onnx.load(recovered.files["fp32"]).graph.initializer}
    assert any(onnx.numpy_helper.to_array(i).tolist() != onnx.numpy_helper.to_array(second[i.name]).tolist()
               for i in first)  # the recovery did train
    again = evaluate_candidate(job)  # cached: the files again, still no candidate
    assert again.cached and not again.feasible and sorted(again.files) == ["fp32", "int8"]
    with pytest.raises(ValueError, match="files_only"):
        CandidateSpec("svd", 0.5, 1, files_only=True)


def test_the_race_recovers_only_structures_faster_than_a_baseline_that_meets(trained_mlp, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The structure screen before the race: each method's smallest pool budget (its fastest structure) is timed once
    beside the baselines that meet the constraint; a method whose fastest file there is not faster than the fastest
    of them in any cell races none of its budgets (nor extends), one faster in some cell races them all; the report,
    report.md and the notes say which, with the ratios."""
    from minreal.app.tune import measure, orchestrate

    model, tr, te = trained_mlp
    seen: list[list[str]] = []
    real = measure.structure_screen

    def screen(results, baselines, held_out, cfg, say, run):  # the real timing, with a known verdict on top
        out = real(results, baselines, held_out, cfg, say, run)
        seen.append(sorted(r.spec.label for r in results))
        assert all(set(cells) == {"cpu/b1", "cpu/b32"} and all(v > 0 for v in cells.values())
                   for cells in out.values()) and len(out) == len(results)
        # the measured ratios decide; to know the answer, make svd@0.4 slower than the baseline everywhere and
        # magnitude@0.4 faster at batch 32 only
        out[("svd", 0.4)] = {cell: 1.2 for cell in out[("svd", 0.4)]}
        out[("magnitude", 0.4)] = {"cpu/b1": 1.1, "cpu/b32": 0.8}
        return out

    monkeypatch.setattr(orchestrate, "structure_screen", screen)
    cfg = TuneConfig(Constraint(max_accuracy_drop=4.0), methods=("svd", "magnitude"), grid=(0.9, 0.6, 0.4),
                     recover_epochs=1, int8=False, screen=FAST,
                     bench=dataclasses.replace(FAST_BENCH, batch_sizes=(1, 32)))
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor())
    h = report.halving
    assert seen == [["magnitude@0.4~structure", "svd@0.4~structure"]]  # each method's smallest budget, once
    assert [(e["method"], e["budget"], e["raced"], e["ratio"] is None) for e in h["screened"]] == [
        ("svd", 0.4, False, False), ("magnitude", 0.6, True, True), ("magnitude", 0.4, True, False)]
    assert h["pool"] == [["magnitude", 0.6], ["magnitude", 0.4]]
    assert not any(e["method"] == "svd" for r in h["rungs"] for e in r) and not any(m == "svd" for m, *_ in
                                                                                    h["extended"])
    assert not any("~structure" in c.label for c in report.candidates)  # files to time, never candidates
    assert any("svd@0.4 (1.20x)" in n and n.startswith("1 of 2 methods") for n in report.notes)
    from minreal.app.tune.output import render_tune_markdown

    md = render_tune_markdown(report)
    assert "svd@0.4 cpu/b1 1.20x, cpu/b32 1.20x (not raced)" in md and "magnitude@0.6 not timed" in md
    assert {"structure_files", "structure_screen"} <= set(report.phases_s)
    # the baselines' ONNX Runtime quality was measured before the search, and kept; the timing passes that only
    # rank (the screens) measured agreement on the rows of one batch, the confirmation on all the held-out data
    assert report.candidates[0].quality and report.candidates[0].feasible
    assert "32 rows" in report.screen["metrics_data"] and f"{len(te)} rows, labelled" in report.confirm["metrics_data"]


def test_the_structure_screen_divides_each_structures_fastest_file_by_the_fastest_baseline_that_meets(
        tmp_path: Path) -> None:
    """The ratio arithmetic, against a timing report with known p50s (INT8 on): per cell, a structure's fastest file
    (fp32 or INT8) over the fastest baseline that meets the constraint and fits --max-size; a baseline that misses
    is no reference; the timing pass gets the rows of one batch and no labels."""
    from minreal.app.tune.candidate import CandidateResult, CandidateSpec
    from minreal.app.tune.measure import BenchOutcome, structure_screen
    from minreal.app.tune.model import Candidate
    from minreal.compress.core.data import Dataset

    def file(name: str) -> str:
        (tmp_path / name).write_bytes(b"onnx")
        return str(tmp_path / name)

    p50 = {("original", 1): 2.0, ("original", 32): 40.0, ("original.int8", 1): 1.0, ("original.int8", 32): 10.0,
           ("original.int8-ac", 1): 0.5, ("original.int8-ac", 32): 5.0,  # misses the constraint: no reference
           ("depth@0.8~structure.fp32", 1): 1.6, ("depth@0.8~structure.fp32", 32): 30.0,
           ("depth@0.8~structure.int8", 1): 0.8, ("depth@0.8~structure.int8", 32): 8.5,
           ("svd@0.8~structure.fp32", 1): 0.9, ("svd@0.8~structure.fp32", 32): 45.0,
           ("svd@0.8~structure.int8", 1): 1.3, ("svd@0.8~structure.int8", 32): 16.0}
    seen = {}

    class Run:
        def on_target(self, fn, job):
            seen.update(labels=job.labels, rows=len(job.x), y=job.y, batches=job.config.batch_sizes)
            latency = [{"model": m, "provider": "cpu", "batch_size": b, "stats": {"p50_ms": p50[(m, b)]}}
                       for m in job.labels for b in (1, 32)]
            return BenchOutcome({"models": [{"name": m} for m in job.labels], "latency": latency}, "here", 1)

    baselines = [Candidate("original", "baseline", "fp32", file("a.onnx"), 10, feasible=True),
                 Candidate("original.int8", "baseline", "int8", file("b.onnx"), 5, feasible=True),
                 Candidate("original.int8-ac", "baseline", "int8-ac", file("c.onnx"), 5, feasible=False)]
    results = [CandidateResult(CandidateSpec(m, 0.8, files_only=True), m, files={"fp32": file(f"{m}.onnx"),
                                                                                 "int8": file(f"{m}.int8.onnx")})
               for m in ("depth", "svd")]
    held_out = Dataset(torch.zeros(100, 4), torch.zeros(100, dtype=torch.long))
    cfg = TuneConfig(Constraint(max_accuracy_drop=1.0), screen=FAST,
                     bench=dataclasses.replace(FAST_BENCH, batch_sizes=(1, 32)))
    ratios = structure_screen(results, baselines, held_out, cfg, lambda line: None, Run())
    assert ratios[("depth", 0.8)] == pytest.approx({"cpu/b1": 0.8 / 1.0, "cpu/b32": 8.5 / 10.0})
    assert ratios[("svd", 0.8)] == pytest.approx({"cpu/b1": 0.9 / 1.0, "cpu/b32": 16.0 / 10.0})  # its fp32 at b1
    assert "original.int8-ac" not in seen["labels"] and seen["rows"] == 32 and seen["y"] is None
    tight = dataclasses.replace(cfg, max_size_kb=0.007)  # 7.2 bytes: the 10-byte original does not fit
    assert structure_screen(results, baselines, held_out, tight, lambda line: None, Run())[("depth", 0.8)] == \
        pytest.approx({"cpu/b1": 0.8, "cpu/b32": 0.85})  # the INT8 original (5 bytes) is the only reference left


def test_no_structure_screen_without_a_baseline_that_meets(trained_mlp, tmp_path: Path) -> None:
    """When no baseline meets the constraint (here none fits --max-size), the screen has nothing to compare with:
    no structure is exported, every budget of the pool races, and the notes say why."""
    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=4.0), methods=("svd",), grid=(0.9, 0.6, 0.4), recover_epochs=1,
                     int8=False, screen=FAST, bench=FAST_BENCH, max_size_kb=0.001)
    lines: list[str] = []
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor(),
                  progress=lines.append)
    assert report.halving["screened"] == [] and report.halving["pool"]
    assert not any("~structure" in line for line in lines)
    assert any(n.startswith("no structure screen before the race: no baseline meets the constraint within "
                            "--max-size") for n in report.notes)


def test_an_extension_skips_a_budget_that_realises_the_model_already_raced() -> None:
    """A twin (a budget whose zero-shot model is a larger raced budget's) never enters by extension: the race
    extends to the next budget below it."""
    from minreal.app.tune.halving import Halving, RungEntry

    h = Halving((1 / 3, 1.0), 3, [("svd", 0.9)], twins=[("svd", 0.8, 0.9)], grid=(0.9, 0.8, 0.7, 0.6))
    assert h.promote([RungEntry("svd", 0.9, 1 / 3, 100, 0.1, True, 1.0)]) == [("svd", 0.7)]
    assert h.extended == [("svd", 0.7, 1)]


def test_a_tune_s_candidates_follow_its_variant_and_its_report_says_so(trained_mlp, tmp_path: Path) -> None:
    """A non-default export setting (opset 17, not 18) reaches the candidates' files, not only the baselines', and
    report.json's config names it under ``export``."""
    import onnx

    from minreal.app.tune.orchestrate import _config_json

    model, tr, te = trained_mlp
    cfg = TuneConfig(Constraint(max_accuracy_drop=100.0), methods=("svd",), grid=(0.5,), int8=False, qat=False,
                     accuracy_control=False, variant=VariantConfig(opset=17), screen=FAST, bench=FAST_BENCH)
    report = tune(model, tr, te, cfg, tmp_path / "t", tmp_path / "cache", executor=InlineExecutor())
    assert report.config["export"] == {"opset": 17}  # report.json's config
    assert "export" not in _config_json(dataclasses.replace(cfg, variant=VariantConfig()))  # the default layout
    files = [Path(c.onnx) for c in report.candidates]
    assert len(files) >= 2 and any(c.kind != "baseline" for c in report.candidates)
    for f in files:
        opsets = {o.domain: o.version for o in onnx.load(str(f), load_external_data=False).opset_import}
        assert opsets[""] == 17, f
