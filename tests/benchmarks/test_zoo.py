"""benchmarks/zoo.py without running the zoo (hours): it lists every torchvision model under its family, and its
coverage table counts the stages each family passes and groups the refusals by reason; signalled, the driver kills
the running stage, keeps the finished rows and exits non-zero."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "zoo.py"
sys.path.insert(0, str(SCRIPT.parent))

import zoo  # noqa: E402 (benchmarks/ is on sys.path only from the line above)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def test_list_names_every_torchvision_model_once_under_its_family() -> None:
    from torchvision.models import list_models

    done = _run("--list")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:2] for line in done.stdout.splitlines()]
    tv = [name for family, name in rows if family not in ("timm", "hf")]
    assert sorted(tv) == sorted(list_models())
    family = dict((name, fam) for fam, name in rows)
    assert family["deeplabv3_mobilenet_v3_large"] == "segmentation"
    assert family["fasterrcnn_resnet50_fpn"] == "detection" and family["r3d_18"] == "video"
    assert family["resnet18"] == "classification"


def _stage(outcome: str, reason: str = "") -> dict[str, str]:
    return {"outcome": outcome, "reason": reason} if reason else {"outcome": outcome}


def test_table_counts_passes_per_family_and_groups_refusals(tmp_path: Path) -> None:
    ok = {s: _stage("ok") for s in ("compress", "export", "parity", "int8", "bench")}
    refused = {"compress": _stage("refused", "depth: no removable residual block"),
               **{s: _stage("skipped", "compress did not pass") for s in ("export", "parity", "int8", "bench")}}
    doc = {"header": {"commit": "0123456789", "models_listed": 4, "partial": True, "models_not_reached": ["c"]},
           "mac_ratio": 0.7,
           "load": "busy", "rows": [
               {"model": "a", "family": "classification", "method": "wanda", "stages": ok},
               {"model": "b", "family": "classification", "method": "wanda", "stages": ok},
               {"model": "a", "family": "classification", "method": "depth", "stages": refused},
               {"model": "b", "family": "classification", "method": "depth", "stages": refused},
               {"model": "hf:bert", "family": "hf", "method": None,
                "stages": {s: _stage("skipped", "transformers is not installed") for s in ok}}]}
    path = tmp_path / "zoo.json"
    path.write_text(json.dumps(doc))
    done = _run("--table", "--out", str(path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "| classification | wanda | 2 | 2 | 2 | 2 | 2 | 2 |" in lines
    assert "| classification | depth | 2 | 0 | 0 | 0 | 0 | 0 |" in lines
    assert "| refused | compress | depth: no removable residual block | 2 | a/depth, b/depth |" in lines
    assert "- hf: 1 model(s) not run: transformers is not installed" in lines
    assert "2 of 4 models run (partial; not reached: c)" in lines[0]


def _bench(original: float, compressed: float) -> dict[str, Any]:
    return {"outcome": "ok", "wall_s": 30.0, "p50_ms": {"original": 2 * original, "original.int8": original,
                                                      "compressed": 2 * compressed, "compressed.int8": compressed}}


def test_summary_counts_rows_through_int8_ratios_budgets_cost_and_failures(tmp_path: Path) -> None:
    """The README's findings come from the JSON: the counts, the INT8 ratios (median and range, the slower rows), the
    fastest method per model, the budgets left, the stages' time and the failures, each checked by hand here."""
    ok = {s: {"outcome": "ok", "wall_s": 60.0} for s in ("compress", "export", "int8")} | {"parity": _stage("ok")}
    refused = {"compress": {**_stage("refused", "depth: no removable residual block"), "wall_s": 6.0},
               **{s: _stage("skipped", "compress did not pass") for s in ("export", "parity", "int8", "bench")}}
    failed = {**ok, "int8": {**_stage("failed", "MemoryError: x"), "wall_s": 12.0},
              "bench": _stage("skipped", "int8 did not pass")}

    def row(model: str, method: str, stages: dict[str, Any], family: str = "classification") -> dict[str, Any]:
        return {"model": model, "family": family, "method": method, "stages": stages, "commit": "0123456789ab"}

    over = {**ok, "compress": {**ok["compress"], "mac_ratio_reached": 0.6, "budget_overshot": "0.6 for 0.7"}}
    doc = {"header": {"commit": "0123456789ab", "models_listed": 5}, "mac_ratio": 0.7, "load": "alone",
           "models": {"a": {"wall_s": 1800.0}, "b": {"wall_s": 1800.0}, "c": {"wall_s": 0.0}},
           "rows": [row("a", "factorize", {**ok, "bench": _bench(10, 8)}),
                    row("a", "wanda", {**ok, "bench": _bench(10, 7)}),
                    row("a", "depth", {**over, "bench": _bench(10, 5)}),
                    row("b", "factorize", {**ok, "bench": _bench(10, 12)}),
                    row("b", "wanda", {**ok, "bench": _bench(10, 9)}),
                    row("b", "depth", refused),
                    row("timm:c", "factorize", {**ok, "bench": _bench(10, 9)}, family="timm"),
                    row("timm:c", "wanda", failed, family="timm")]}
    lines = zoo.summary_markdown(doc).splitlines()
    assert lines[0] == "- **Rows**: 3 of 5 models, 8 rows, every row from commit 0123456.", lines
    assert "- **factorize**: 3 of the 3 models it ran go through compress, export, parity, INT8 and bench." in lines
    assert "- **wanda**: 2 of the 3 models it ran go through compress, export, parity, INT8 and bench." in lines
    assert "- **depth**: 1 of the 2 models it ran go through compress, export, parity, INT8 and bench." in lines
    assert "- **torchvision through with factorize and with wanda: 2** of the 2 run (issue 44's goal: 77)." in lines
    assert "- Left their budget of 0.7, as their report says: a/depth 0.6 (overshot)." in lines
    assert "  - factorize: faster in 2 of 3, median 0.90× (0.80–1.20); not faster: b 1.20×" in lines
    assert "  - wanda: faster in 2 of 2, median 0.80× (0.70–0.90)" in lines
    assert "  - depth: faster in 1 of 1, median 0.50× (0.50–0.50)" in lines
    assert "  - fastest INT8 among the methods, of the models benched with more than one: depth 1, wanda 1" in lines
    # stages: 7 rows that passed compress, export and int8 (3 × 60 s) and benched (30 s) but a failed and a refused:
    # 6 × 210 + (120 + 12) + 6 = 1398 s, plus 3600 s of baselines
    assert any(line.startswith("- **The run's own time**: 1.4 h of stages (1.0 h of baselines)") for line in lines)
    assert lines[-1] == ("- **Failed (an error that is not the product's own refusal): 1** (timm:c/wanda int8); the "
                         "JSON holds no traceback.")
    done = tmp_path / "zoo.json"
    done.write_text(json.dumps(doc))
    assert _run("--summary", "--out", str(done)).stdout.splitlines() == lines


def test_export_stages_record_the_static_tensorrt_check_and_the_table_counts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export report's static TensorRT check reaches the row (its issues where not ready; the zoo found the
    simplifier writing com.microsoft Attention into hf:distilbert cut by wanda), and the table counts the rows that
    record it, naming the ones that are not ready."""
    issue = "com.microsoft:Attention on 6 nodes (e.g. Attention_0): outside the standard ONNX domain"
    report = {"tensorrt_readiness": {"ready": False, "issues": [issue]}, "timings_s": {"export": 1.0}}
    monkeypatch.setattr(zoo, "_cli", lambda argv: {"outcome": "ok", "result": report})
    out = zoo.stage_export({"pt2": "m.pt2", "calib": "c.npz", "onnx": "m.onnx"})
    assert out == {"outcome": "ok", "phases_s": {"export": 1.0}, "tensorrt_ready": False, "tensorrt_issues": [issue]}
    ok = {s: _stage("ok") for s in ("compress", "parity", "int8", "bench")}
    doc = {"header": {"commit": "0123456789", "models_listed": 3}, "mac_ratio": 0.7, "load": "quiet",
           "models": {"a": {"outcome": "ok", "tensorrt_ready": True}, "b": {"outcome": "ok"}},
           "rows": [{"model": "a", "family": "hf", "method": "wanda", "stages": {**ok, "export": out}},
                    {"model": "a", "family": "hf", "method": "factorize",
                     "stages": {**ok, "export": {"outcome": "ok", "tensorrt_ready": True}}},
                    {"model": "b", "family": "hf", "method": "wanda", "stages": {**ok, "export": _stage("ok")}}]}
    lines = zoo.table_markdown(doc).splitlines()
    assert "- TensorRT-ready exports (static check): 2 of the 3 that record it" in lines
    assert f"  - not ready: a/wanda: {issue}" in lines


def test_the_baseline_records_the_originals_static_tensorrt_check(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's export stage asks for the export report and keeps its TensorRT check beside the INT8 outcome
    and the model's facts."""
    argv: list[str] = []
    report = {"tensorrt_readiness": {"ready": True, "issues": []}}
    monkeypatch.setattr(zoo, "_seeded", lambda name: torch.nn.Linear(4, 2))
    np.savez(tmp_path / "calib.npz", x=np.ones((6, 4), np.float32))
    monkeypatch.setattr(zoo, "_calib_file", lambda work, model: tmp_path / "calib.npz")
    monkeypatch.setattr(zoo, "_cli", lambda a: argv.extend(a) or {"outcome": "ok", "result": report})
    monkeypatch.setattr(zoo, "stage_int8", lambda spec: {"outcome": "ok"})
    (tmp_path / "m").mkdir()
    out = zoo.stage_baseline({"work": str(tmp_path / "m"), "name": "m", "shape": [4], "inputs": "features"})
    assert "--json" in argv
    assert out == {"outcome": "ok", "tensorrt_ready": True, "params": 10, "macs": 8}


def test_only_runs_models_in_the_order_named_and_refuses_an_unknown_name() -> None:
    """A run cut short (a deadline, a shared machine) has done the models named first; a family brings its models
    in the listed order, each model once."""
    models = [zoo.Model("a", "x"), zoo.Model("b", "y"), zoo.Model("c", "x")]
    assert [m.name for m in zoo.select(models, "b,x")] == ["b", "a", "c"]
    assert [m.name for m in zoo.select(models, "c,x,c")] == ["c", "a"]
    assert zoo.select(models, None) == models
    with pytest.raises(SystemExit, match="unknown model or family 'd'"):
        zoo.select(models, "a,d")


_DRIVER = """\
import argparse, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
import zoo
from _common import run_measured

STAGE = ("import os, subprocess, sys, time\\n"
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\\n"
         "open({pids!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\\n"
         "time.sleep(300)\\n")

def run(doc, model, args, say):
    if model.name == "running":  # a stage that runs (with a child of its own) until it is killed
        run_measured([sys.executable, "-c", STAGE], timeout=300)
    doc["rows"].append({{"model": model.name, "family": "x", "method": "wanda", "stages": {{}}}})
    zoo.save(doc, args.out)

doc = {{"header": {{"models_listed": 3}}, "models": {{}}, "rows": []}}
zoo.run_all(doc, [zoo.Model(n, "x") for n in ("done", "running", "never")],
            argparse.Namespace(out=Path({out!r})), print, run=run)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_kills_the_running_stage_saves_the_finished_rows_and_exits_nonzero(
        tmp_path: Path, sig: signal.Signals, process_gone: Callable[[int], bool]) -> None:
    """The driver, signalled while a stage (started by ``run_measured``, with a child of its own) runs: the stage
    and its child are gone, the JSON holds the row finished before (written atomically: no temporary file is left)
    and the driver exits with 128 + the signal after one line naming it."""
    out, pids = tmp_path / "zoo.json", tmp_path / "pids"
    code = _DRIVER.format(bench=str(SCRIPT.parent), pids=str(pids), out=str(out))
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    try:
        for _ in range(600):  # the stage writes its pids once it runs (a few seconds on a loaded machine)
            if pids.is_file() and len(pids.read_text().split()) == 2 or driver.poll() is not None:
                break
            time.sleep(0.1)
        assert driver.poll() is None, driver.communicate()
        driver.send_signal(sig)
        _, err = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 128 + sig
    assert err.strip().splitlines()[-1].startswith(f"zoo: stopped by {sig.name} during running: its running stage")
    stage, child = (int(p) for p in pids.read_text().split())
    assert process_gone(stage) and process_gone(child)
    assert [r["model"] for r in json.loads(out.read_text())["rows"]] == ["done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pids", "zoo.json"]


def test_a_stage_killed_near_the_machines_memory_is_said_to_be_out_of_memory() -> None:
    """zoo (issue 44): s3d's bench stage died by SIGKILL at a peak of 23358 MiB on a machine of 23 GiB, recorded as
    "killed by signal 9" alone; a SIGKILL at 80 % of the machine's memory or more says out of memory."""
    from _common import Measured

    machine = 23 * 1024
    assert zoo._death(Measured(-9, "", "", 23358.4), memory_mib=machine) == \
        "killed by signal 9 at a peak of 23358 MiB of the machine's 23552 MiB: out of memory"
    assert zoo._death(Measured(-9, "", "", 900.0), memory_mib=machine) == "killed by signal 9 at a peak of 900 MiB"
    assert zoo._death(Measured(-9, "", "", None), memory_mib=machine) == "killed by signal 9"
    assert zoo._death(Measured(-15, "", "", 900.0)) == "killed by signal 15"
    assert zoo._death(Measured(3, "", "", 900.0)) == "exit status 3"


def test_resume_builds_again_a_baseline_whose_files_are_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """zoo (issue 44): a resumed run kept quantized_resnet18's baseline from an earlier run whose work folder was
    gone, and recorded every method as skipped ("the model was not built: no weights"). Its baseline runs again;
    a kept baseline whose files are there does not."""
    import argparse

    stages: list[str] = []

    def fake_stage(stage: str, spec: dict, timeout: float) -> dict:
        stages.append(stage)
        folder = Path(spec["work"])
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("weights.pt", "original.onnx", "original.int8.onnx"):
            (folder / name).write_bytes(b"")
        return {"outcome": "ok", "wall_s": 0.0}

    monkeypatch.setattr(zoo, "run_stage", fake_stage)
    monkeypatch.setattr(zoo, "method_row", lambda *a: {s: {"outcome": "ok"} for s in zoo.STAGES})
    monkeypatch.setattr(zoo, "save", lambda doc, path: None)
    kept = {"family": "x", "input": [3, 8, 8], "outcome": "ok", "wall_s": 1.0}
    doc = {"header": {"commit": "0123456789ab"}, "models": {"m": dict(kept)}, "rows": []}
    args = argparse.Namespace(methods=("wanda",), resume=True, work=tmp_path, timeout=60, out=tmp_path / "zoo.json")
    zoo.run_model(doc, zoo.Model("m", "x", (3, 8, 8)), args, lambda line: None)
    assert stages == ["baseline"] and [r["method"] for r in doc["rows"]] == ["wanda"]
    doc["rows"].clear()
    zoo.run_model(doc, zoo.Model("m", "x", (3, 8, 8)), args, lambda line: None)
    assert stages == ["baseline"] and [r["method"] for r in doc["rows"]] == ["wanda"]


def _fake_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers as far as ``hf_config`` reads it: each family's config with a small vocabulary, ViT's image size
    and Whisper's mel bins and source positions."""
    from types import ModuleType, SimpleNamespace

    configs = {"bert": {"vocab_size": 50}, "gpt2": {"vocab_size": 7}, "vit": {"num_channels": 3, "image_size": 224},
               "whisper": {"num_mel_bins": 80, "max_source_positions": 1500}}
    fake = ModuleType("transformers")
    fake.AutoConfig = SimpleNamespace(  # type: ignore[attr-defined]
        for_model=lambda model_type, **kw: SimpleNamespace(**configs.get(model_type, {}), **kw))
    monkeypatch.setitem(sys.modules, "transformers", fake)


def test_hf_rows_take_token_ids_images_or_whisper_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """zoo (issue 44): every hf row had the shape (SEQ,) and image calibration; ViT takes 224x224 images and
    Whisper's encoder 80 mel bins of 2 x 1500 frames (its convolution halves them to its 1500 positions)."""
    _fake_transformers(monkeypatch)
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: object())
    rows = {m.name: m for m in zoo.optional_models() if m.family == "hf"}
    assert [rows[f"hf:{f}"].inputs for f in zoo.HF] == ["tokens"] * 4 + ["images", "features"]
    assert rows["hf:bert"].shape == (zoo.SEQ,) and rows["hf:vit"].shape == (3, 224, 224)
    assert rows["hf:whisper_encoder"].shape == (80, 3000) and all(m.skip is None for m in rows.values())


def test_token_ids_are_seeded_int64_in_the_vocabulary_and_load_as_one_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.app.data import load_dataset

    _fake_transformers(monkeypatch)
    bert, gpt2 = zoo.Model("hf:bert", "hf", (16,), inputs="tokens"), zoo.Model("hf:gpt2", "hf", (16,), inputs="tokens")
    path = zoo._calib_file(tmp_path, bert)
    x = np.load(path)["x"]
    assert x.dtype == np.int64 and x.shape == (zoo.CALIB, 16) and x.min() >= 0 and x.max() <= 49
    assert len(np.unique(x)) > 40  # spread over the 50 ids, not a constant
    assert np.array_equal(np.load(zoo._calib_file(tmp_path / "again", bert))["x"], x)  # seeded
    small = np.load(zoo._calib_file(tmp_path, gpt2))["x"]  # one file per model: vocabularies differ
    assert small.max() <= 6 and zoo._calib_file(tmp_path, gpt2) != path
    data = load_dataset(str(path))
    assert isinstance(data.x, torch.Tensor) and data.x.dtype == torch.int64 and tuple(data.x.shape) == x.shape


def test_whisper_features_are_seeded_float32(tmp_path: Path) -> None:
    model = zoo.Model("hf:whisper_encoder", "hf", (4, 6), inputs="features")
    x = np.load(zoo._calib_file(tmp_path, model))["x"]
    assert x.dtype == np.float32 and x.shape == (zoo.CALIB, 4, 6) and abs(float(x.std()) - 1) < 0.2
    assert np.array_equal(np.load(zoo._calib_file(tmp_path / "again", model))["x"], x)


def test_a_refusal_reads_as_the_command_line_prints_it_and_a_foreign_error_is_a_failure() -> None:
    """The stages run `minreal` commands: a library error that names its field reads with the flag in its place
    (as the command line shows it), another library's error is ``failed`` with its type."""
    from minreal.facts import FieldError

    exc = FieldError("`mac_ratio` (--mac-ratio 0.7) cannot be reached by width cuts", fields=("mac_ratio",))
    assert zoo._child_outcome(exc) == {"outcome": "refused",
                                       "reason": "--mac-ratio 0.7 cannot be reached by width cuts"}
    out = zoo._child_outcome(KeyError("x"))
    assert out["outcome"] == "failed" and out["reason"].startswith("KeyError")


def test_merge_takes_each_shards_new_and_rerun_rows_over_the_base_and_refuses_a_conflict(tmp_path: Path) -> None:
    """Shards that resumed from one base JSON at once make one JSON: rows every file shares stay once; a shard's new
    row is added and its rerun of a base pair (a row that differs from the base's) replaces it, whatever the order of
    the shards; two shards that reran one pair differently are refused in one line naming both files."""
    def row(model: str, method: str, by: str) -> dict:
        return {"model": model, "family": "x", "method": method, "stages": {}, "by": by}

    def doc(commit: str, rows: list[dict], models: dict) -> dict:
        return {"header": {"commit": commit, "started": commit, "models_listed": 4}, "mac_ratio": 0.7,
                "methods": ["factorize", "wanda"], "models": models, "rows": rows}

    base_rows = [row("m1", "factorize", "base"), row("m2", "factorize", "base")]
    base = doc("base", base_rows, {"m1": {"by": "base"}, "m2": {"by": "base"}})
    a = doc("a", [*base_rows, row("m3", "factorize", "a")], {**base["models"], "m3": {"by": "a"}})
    b = doc("b", [base_rows[0], row("m2", "factorize", "b"), row("m2", "wanda", "b")],
            {"m1": {"by": "base"}, "m2": {"by": "b"}})
    paths = [tmp_path / f"{n}.json" for n in ("base", "a", "b")]
    for p, d in zip(paths, (base, a, b)):
        p.write_text(json.dumps(d))
    for order in (paths, [paths[0], paths[2], paths[1]]):
        out = tmp_path / "zoo.json"
        done = _run("--merge", *map(str, order), "--out", str(out), "--load", "two shards at once")
        assert done.returncode == 0, done.stderr
        got = json.loads(out.read_text())
        assert sorted((r["model"], r["method"], r["by"]) for r in got["rows"]) == [
            ("m1", "factorize", "base"), ("m2", "factorize", "b"), ("m2", "wanda", "b"), ("m3", "factorize", "a")]
        assert {m: v["by"] for m, v in got["models"].items()} == {"m1": "base", "m2": "b", "m3": "a"}
        assert sorted(h["commit"] for h in got["header"]["earlier_runs"]) == ["a", "b"]
        assert got["header"]["models_ran"] == 3 and got["header"]["partial"] and got["load"] == "two shards at once"
    assert paths[0].read_text() == json.dumps(base)  # inputs are never overwritten

    a["rows"].append(row("m2", "factorize", "a"))
    paths[1].write_text(json.dumps(a))
    clash = _run("--merge", *map(str, paths), "--out", str(tmp_path / "z2.json"))
    assert clash.returncode != 0 and "Traceback" not in clash.stderr
    assert f"m2/factorize was run in both {paths[1]} and {paths[2]}" in clash.stderr
    assert not (tmp_path / "z2.json").exists()


@pytest.mark.parametrize(("text", "says"), [
    ("{not json", "cannot read {path}: JSONDecodeError"), ("[1, 2]", "{path} has no 'header' (not a zoo JSON)"),
    ('{"header": {}, "models": {}, "rows": []}', "{path} has no 'mac_ratio' (not a zoo JSON)"),
    ('{"header": {}, "models": {}, "rows": [], "mac_ratio": 0.5}', "{path} is at MAC ratio 0.5, {base} at 0.7")])
def test_merge_refuses_a_file_that_is_not_a_zoo_json_of_the_same_ratio_in_one_line(tmp_path: Path, text: str,
                                                                                 says: str) -> None:
    base, bad = tmp_path / "base.json", tmp_path / "bad.json"
    base.write_text(json.dumps({"header": {"models_listed": 1}, "models": {}, "rows": [], "mac_ratio": 0.7}))
    bad.write_text(text)
    done = _run("--merge", str(base), str(bad), "--out", str(tmp_path / "z.json"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zoo: --merge: {says.format(path=bad, base=base)}")
    assert not (tmp_path / "z.json").exists()


def test_batch_norm_is_estimated_only_where_seeded_outputs_explode() -> None:
    """Inception v3's seeded outputs reach about 2e7 and fail parity in float32 (the original's too): a model whose
    outputs exceed EXPLODING gets the BatchNorm statistics training would leave (the first BN's running mean is the
    mean of its input over every image, exactly, as a cumulative average over equal batches); a tame model is left
    as it was."""
    torch.manual_seed(0)
    x = torch.randn(32, 3, 8, 8)
    wild = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(6, 3))
    with torch.no_grad():
        wild[0].weight.mul_(1e6)
    assert zoo._estimate_batch_norm(wild, x) > zoo.EXPLODING
    with torch.no_grad():
        h = wild[0](x)
        torch.testing.assert_close(wild[1].running_mean, h.mean((0, 2, 3)), rtol=1e-5, atol=0)
        # the cumulative average of the batches' unbiased variances: (1/4) Σ_b var_b, each over 8 × 6 × 6 values
        var = torch.stack([c.var((0, 2, 3), unbiased=True) for c in h.split(8)]).mean(0)
        torch.testing.assert_close(wild[1].running_var, var, rtol=1e-4, atol=0)
        assert float(wild(x).abs().max()) < zoo.EXPLODING
    assert not wild.training and wild[1].momentum == 0.1

    class Fails(torch.nn.Module):  # a forward that breaks in training (a detection model wants targets there)
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.body[1].training:
                raise RuntimeError("targets should be passed in training mode")
            return self.body(x) * 1e6

    failing = Fails()
    with pytest.raises(RuntimeError, match="targets"):
        zoo._estimate_batch_norm(failing, x)
    assert not any(m.training for m in failing.modules()) and failing.body[1].momentum == 0.1

    tame = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    before = {k: v.clone() for k, v in tame.state_dict().items()}
    assert zoo._estimate_batch_norm(tame, x) is None
    assert all(torch.equal(before[k], v) for k, v in tame.state_dict().items())


def test_the_header_records_the_cpus_int8_instruction_sets_as_the_script_sees_them(tmp_path: Path) -> None:
    """Run as the script runs (only ``benchmarks/`` on the path, from another folder): the header's ``isa`` is this
    CPU's int8 flags and ``int8_target`` the INT8 format they pick (an import that works only from the repository
    root broke the zoo once)."""
    from minreal.runtime_bench.cpu import cpu_int8_target, cpu_isa

    code = (f"import sys, json; sys.path[0] = {str(SCRIPT.parent)!r}; import zoo; "
            "print(json.dumps(zoo.header(3)['machine']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    machine = json.loads(done.stdout)
    assert machine["isa"] == list(cpu_isa().flags) and machine["int8_target"] == cpu_int8_target()


def test_the_header_names_the_timm_and_transformers_versions_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def version(package: str) -> str:
        if package == "timm":
            return "9.9.9"
        raise importlib.metadata.PackageNotFoundError(package)

    monkeypatch.setattr(importlib.metadata, "version", version)
    head = zoo.header(3)
    assert head["timm"] == "9.9.9" and head["transformers"] is None


def test_a_stage_runs_with_the_users_python_path_behind_the_tree(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver lists timm and Hugging Face rows when their packages import; the stage processes must import them
    from the same place (a PYTHONPATH the user set), or every such row is refused as "not installed"."""
    import _common

    seen: dict[str, str] = {}

    def fake(argv: list[str], timeout: float, env: dict[str, str]) -> _common.Measured:
        seen.update(env)
        return _common.Measured(0, "", "", 1.0, False)

    monkeypatch.setenv("PYTHONPATH", "/user/site")
    monkeypatch.setattr(_common, "run_measured", fake)
    zoo.run_stage("baseline", {"work": str(tmp_path / "w")}, 10.0)
    assert seen["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/user/site"]


def test_the_bench_stage_gives_its_measuring_process_most_of_the_stages_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's one measuring process may run :data:`zoo.WORKER_SHARE` of the stage's ``--timeout`` (the bench
    command's 600 s default stopped mvit_v2_s's four files under load), less than the stage's, so that the bench's own
    words end an overlong run, not the stage's kill."""
    seen: dict[str, dict] = {}
    monkeypatch.setattr(zoo, "run_stage", lambda stage, spec, timeout: seen.update({stage: spec}) or {"outcome": "ok"})
    monkeypatch.setattr(zoo, "_calib_file", lambda work, model: work / "calib.npz")
    model = zoo.Model("resnet18", "classification", (3, 224, 224))
    (tmp_path / "resnet18").mkdir()
    (tmp_path / "resnet18" / "weights.pt").write_bytes(b"")
    zoo.method_row(model, "factorize", {"outcome": "ok"}, tmp_path, 1000.0)
    assert seen["bench"]["worker_timeout"] == zoo.WORKER_SHARE * 1000.0 < 1000.0
    argv: list[str] = []
    monkeypatch.setattr(zoo, "_cli", lambda a: argv.extend(a) or {"outcome": "refused", "reason": "stub"})
    np.savez(tmp_path / "calib.npz", x=np.zeros((6, 3, 4, 4), np.float32))
    zoo.stage_bench({**seen["bench"], "work": str(tmp_path), "calib": str(tmp_path / "calib.npz")})
    assert argv[argv.index("--worker-timeout") + 1] == str(zoo.WORKER_SHARE * 1000.0)


def test_the_header_names_the_models_not_reached_and_keeps_no_earlier_runs_lists(tmp_path: Path) -> None:
    """``save`` counts the models with rows and names the listed ones with none (a model refused before any stage
    has its row, so it is reached); the earlier runs' headers keep their counts but not their lists, each of which
    was the whole file's at its time (the rows name their models)."""
    rows = [{"model": "a", "method": "wanda"}, {"model": "b", "method": None}]
    old_header = {"commit": "old", "models_ran": 1, "models_run": ["a"], "models_not_reached": ["b", "c"],
                  "earlier_runs": [{"commit": "older", "models_run": ["a"], "models_ran": 1}]}
    doc = {"header": {"commit": "new", "earlier_runs": zoo.earlier_runs(old_header), "models_run": ["a"]},
           "rows": rows}
    zoo.save(doc, tmp_path / "zoo.json", listed=["a", "b", "c"])
    head = json.loads((tmp_path / "zoo.json").read_text())["header"]
    assert head["models_ran"] == 1 and head["models_not_reached"] == ["c"] and head["partial"]
    assert "models_run" not in head
    assert head["earlier_runs"] == [{"commit": "older", "models_ran": 1}, {"commit": "old", "models_ran": 1}]
    zoo.save(doc, tmp_path / "zoo.json", listed=["a", "b"])
    head = json.loads((tmp_path / "zoo.json").read_text())["header"]
    assert head["models_not_reached"] == [] and not head["partial"]


def test_optical_flow_models_take_two_images_and_every_stage_reads_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RAFT's forward takes two images; the zoo gave it one and every row was refused with RAFT's "missing argument"
    (the harness's fault, not the tool's). Optical flow rows now calibrate on image pairs (each image and its
    successor), saved as image1/image2, loaded as named inputs by the command line, and the torch stages and the
    bench stage read both."""
    from minreal.app.data import load_dataset
    from minreal.compress.core.inputs import NamedInputs

    family = {m.name: m for m in zoo.torchvision_models()}
    assert family["raft_small"].inputs == family["raft_large"].inputs == "pairs"
    assert family["resnet18"].inputs == "images"
    images = np.arange(zoo.CALIB * 3 * 4 * 4, dtype=np.float32).reshape(zoo.CALIB, 3, 4, 4)
    monkeypatch.setattr(zoo, "_images", lambda model: images)  # no ../shared/data in the tests
    raft = zoo.Model("raft_small", "optical_flow", (3, 4, 4), inputs="pairs")
    path = zoo._calib_file(tmp_path, raft)
    x = zoo.load_calib(path)
    assert sorted(x) == ["image1", "image2"] and np.array_equal(x["image1"], images)
    assert np.array_equal(x["image2"][:-1], images[1:]) and np.array_equal(x["image2"][-1], images[0])
    data = load_dataset(str(path))
    assert isinstance(data.x, NamedInputs) and len(data.x) == zoo.CALIB
    two = zoo.torch_inputs(zoo.first_rows(x, 2))
    assert isinstance(two, NamedInputs) and len(two) == 2
    argv: list[str] = []
    monkeypatch.setattr(zoo, "_cli", lambda a: argv.extend(a) or {"outcome": "refused", "reason": "stub"})
    zoo.stage_bench({"work": str(tmp_path), "calib": str(path), "method": "factorize", "files": ["a.onnx"],
                     "worker_timeout": 60.0})
    bench = np.load(argv[argv.index("--data") + 1])
    assert sorted(bench.files) == ["image1", "image2"] and len(bench["image1"]) == zoo.BENCH_ROWS


@pytest.mark.parametrize("keep", [False, True])
def test_a_models_folder_goes_once_its_rows_are_written_unless_kept(tmp_path: Path, keep: bool) -> None:
    """The whole zoo wrote 64 GB of weights, programs, ONNX and INT8 files under --work and filled the disk: a model's
    folder is removed once its rows are written (after its run, before the next model), unless --keep-files."""
    import argparse

    args = argparse.Namespace(work=tmp_path / "work", out=tmp_path / "zoo.json", keep_files=keep)
    seen: list[bool] = []

    def run(doc: dict, model: zoo.Model, args: argparse.Namespace, say: Callable) -> None:
        seen.append((args.work / "a").exists())  # the previous model's folder, when b runs
        (args.work / model.name).mkdir(parents=True)
        (args.work / model.name / "original.onnx").write_bytes(b"onnx")
        doc["rows"].append({"model": model.name, "method": "wanda", "stages": {}})

    doc = {"header": {"commit": "c"}, "rows": [], "models": {}}
    zoo.run_all(doc, [zoo.Model("a", "x"), zoo.Model("b", "x")], args, print, run)
    assert seen == [False, keep]
    assert (args.work / "b").exists() is keep and json.loads(args.out.read_text())["header"]["models_ran"] == 2


def test_rows_name_their_machine_and_stamp_names_it_in_an_older_files_rows(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A run resumed on another CPU (issue 44's one run moved from an Intel to an AMD machine between sessions): the
    new rows and baselines name the machine they ran on; ``--stamp`` names the header's machine in the rows of a file
    an older zoo.py wrote (only where they name none, and leaves a file with nothing to stamp untouched), and the
    summary counts the rows per machine."""
    monkeypatch.setattr(zoo, "run_stage", lambda stage, spec, timeout: {"outcome": "ok", "wall_s": 0.0})
    monkeypatch.setattr(zoo, "method_row", lambda *a: {s: {"outcome": "ok"} for s in zoo.STAGES})
    monkeypatch.setattr(zoo, "save", lambda doc, path: None)
    import argparse

    doc = {"header": {"commit": "0123456789ab", "machine": {"cpu": "AMD EPYC"}}, "models": {}, "rows": []}
    args = argparse.Namespace(methods=("wanda",), resume=True, work=tmp_path, timeout=60, out=tmp_path / "zoo.json")
    zoo.run_model(doc, zoo.Model("m", "x", (3, 8, 8)), args, lambda line: None)
    assert doc["rows"][0]["machine"] == "AMD EPYC" and doc["models"]["m"]["machine"] == "AMD EPYC"

    ok = {s: _stage("ok") for s in zoo.STAGES}
    old = {"header": {"commit": "0123456789ab", "models_listed": 3, "machine": {"cpu": "Intel Xeon"}},
           "mac_ratio": 0.7, "models": {"a": {"wall_s": 1.0}, "b": {"wall_s": 1.0, "machine": "AMD EPYC"}},
           "rows": [{"model": "a", "family": "x", "method": "wanda", "stages": ok, "commit": "0123456789ab"},
                    {"model": "c", "family": "x", "method": "wanda", "stages": ok, "commit": "0123456789ab"},
                    {"model": "b", "family": "x", "method": "wanda", "stages": ok, "commit": "0123456789ab",
                     "machine": "AMD EPYC"}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    done = _run("--stamp", "--out", str(path))
    assert done.returncode == 0 and "3 row(s) and baseline(s)" in done.stderr, done.stderr
    got = json.loads(path.read_text())
    assert [r["machine"] for r in got["rows"]] == ["Intel Xeon", "Intel Xeon", "AMD EPYC"]
    assert {k: v["machine"] for k, v in got["models"].items()} == {"a": "Intel Xeon", "b": "AMD EPYC"}
    before = path.stat().st_mtime_ns
    assert "0 row(s)" in _run("--stamp", "--out", str(path)).stderr and path.stat().st_mtime_ns == before
    assert zoo.summary_markdown(got).splitlines()[0] == (
        "- **Rows**: 3 of 3 models, 3 rows, every row from commit 0123456 on 2 machines (Intel Xeon: 2 rows, AMD "
        "EPYC: 1 rows; a row's times and INT8 ratios are its own machine's).")
    missing = _run("--stamp", "--out", str(tmp_path / "none.json"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert f"zoo: --stamp: cannot read {tmp_path / 'none.json'}" in missing.stderr


def test_a_vit_built_without_weights_gets_the_image_size_it_takes() -> None:
    """The one run (62df6df) fed vit_h_14 518 x 518, the size its only weights' transforms give, and every method was
    refused ("Wrong image height! Expected 224 but got 518"): built without weights, a torchvision ViT takes 224; the
    other models keep their weights' size (EfficientNet-B7 600, segmentation capped at 520)."""
    assert zoo._tv_shape("vit_h_14", "classification") == (3, 224, 224)  # torchvision's _vision_transformer: 224
    assert zoo._tv_shape("vit_b_16", "classification") == (3, 224, 224)
    assert zoo._tv_shape("efficientnet_b7", "classification") == (3, 600, 600)
    assert zoo._tv_shape("fcn_resnet50", "segmentation") == (3, 520, 520)


def test_merge_keeps_a_shards_unnamed_copy_of_a_base_row_as_the_bases_and_names_its_new_rows(tmp_path: Path) -> None:
    """Review: merge named every file's unnamed rows with its own header's machine before comparing, so a shard's
    copy of a base row (an older zoo.py copies the base's rows unnamed) looked rerun on the shard's machine: it
    replaced the base's row, and two shards on different machines were refused as a conflict. The copy is now the
    base's row; the shard's new rows name its machine; the documents given are left as they were."""
    row = {"model": "resnet18", "family": "x", "method": "wanda", "stages": {}, "commit": "abc"}
    base = {"header": {"machine": {"cpu": "Intel Xeon"}}, "models": {"resnet18": {"wall_s": 1.0}},
            "rows": [dict(row)], "mac_ratio": 0.7}
    shard = {"header": {"machine": {"cpu": "AMD EPYC"}, "started": "s"}, "models": {"resnet18": {"wall_s": 1.0},
                                                                                    "vgg11": {"wall_s": 2.0}},
             "rows": [dict(row), {**row, "model": "vgg11"}], "mac_ratio": 0.7}
    other = {"header": {"machine": {"cpu": "AMD EPYC 2"}, "started": "t"}, "models": {"resnet18": {"wall_s": 1.0}},
             "rows": [dict(row), {**row, "model": "vgg13"}], "mac_ratio": 0.7}
    given = json.dumps([base, shard, other])
    out = zoo.merge([("base", base), ("shard", shard), ("other", other)])
    assert json.dumps([base, shard, other]) == given
    assert sorted((r["model"], r["machine"]) for r in out["rows"]) == [
        ("resnet18", "Intel Xeon"), ("vgg11", "AMD EPYC"), ("vgg13", "AMD EPYC 2")]
    assert {m: e["machine"] for m, e in out["models"].items()} == {"resnet18": "Intel Xeon", "vgg11": "AMD EPYC"}
    unnamed = zoo.merge([("base", {**base, "header": {}}), ("shard", {**shard, "header": {"started": "s"}})])
    # the base naming none leaves its rows unnamed; a shard naming none marks its own "?" (unknown for good: the
    # merged file's header is the base's, and a later --stamp would name them the base's machine)
    assert sorted((r["model"], r.get("machine")) for r in unnamed["rows"]) == [("resnet18", None), ("vgg11", "?")]


@pytest.mark.parametrize(("text", "says"), [
    ("[1]", "{path} is not a zoo JSON (a header naming a machine, rows and baselines)"),
    ('{"header": {"machine": {"cpu": "X"}}, "rows": [], "models": []}',
     "{path} is not a zoo JSON (a header naming a machine, rows and baselines)"),
    ('{"header": {"machine": "Intel"}, "rows": [], "models": {}}',
     "{path} is not a zoo JSON (a header naming a machine, rows and baselines)"),
    ('{"header": {"machine": {"cpu": "X"}}, "rows": ["r"], "models": {}}',
     "{path} is not a zoo JSON (a header naming a machine, rows and baselines)"),
    ('{"header": {"machine": null}, "rows": [], "models": {}}', "{path}'s header names no machine; nothing stamped"),
    ('{"header": {}, "rows": []}', "{path}'s header names no machine; nothing stamped")])
def test_stamp_refuses_a_file_it_cannot_name_machines_in_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "z.json"
    path.write_text(text)
    done = _run("--stamp", "--out", str(path))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"zoo: --stamp: {says.format(path=path)}" in done.stderr and path.read_text() == text
