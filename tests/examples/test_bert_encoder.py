"""The BERT-style encoder example (examples/bert_encoder.py): its synthetic task, its padding mask, and `minreal run`
end to end on a briefly trained small encoder with two named inputs, a dynamic batch and a dynamic sequence."""

from __future__ import annotations

import importlib.util
import json
import re
from itertools import product
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from minreal.app.cli import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bert_encoder.py"
BATCHES, SEQS = (1, 4), (16, 32)
LABELS = ("original", "factorize", "original.int8", "factorize.int8")
ATTENTION_PROJECTION = re.compile(r"^layers\.\d+\.attn\.(q|k|v|out)_proj$")


def _example() -> ModuleType:
    """The example imported by path (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("bert_encoder_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keyword_task_is_deterministic_and_well_formed() -> None:
    bert = _example()
    task = bert.keyword_task(200, 32, seed=3)
    again = bert.keyword_task(200, 32, seed=3)
    assert all(np.array_equal(task[k], again[k]) for k in ("input_ids", "attention_mask", "y"))
    ids, mask, y = task["input_ids"], task["attention_mask"], task["y"]
    assert ids.dtype == mask.dtype == y.dtype == np.int64 and ids.shape == mask.shape == (200, 32)
    assert np.array_equal(mask, (ids != bert.PAD).astype(np.int64)) and (ids[:, 0] == bert.CLS).all()
    lengths = mask.sum(1)
    assert np.array_equal(mask, (np.arange(32) < lengths[:, None]).astype(np.int64))  # padding on the right only
    assert lengths.min() >= 10 and len(set(lengths.tolist())) > 10
    counts = np.stack([(ids == bert.CLS + 1 + k).sum(1) for k in range(bert.CLASSES)], axis=1)
    top_two = np.sort(counts, axis=1)[:, -2:]
    assert np.array_equal(counts.argmax(1), y) and (top_two[:, 1] > top_two[:, 0]).all()  # never a tie
    assert set(y.tolist()) == set(range(bert.CLASSES))


def test_padding_does_not_change_the_logits() -> None:
    bert = _example()
    model = bert.small().eval()
    task = bert.keyword_task(6, 20, seed=1)
    ids, mask = torch.from_numpy(task["input_ids"]), torch.from_numpy(task["attention_mask"])
    longer = torch.nn.functional.pad(ids, (0, 12), value=bert.PAD), torch.nn.functional.pad(mask, (0, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(*longer), model(ids, mask), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``minreal run`` of the small encoder, trained 3 epochs on 1024 sequences of up to 32 tokens (~7 s), with
    factorize at half the MACs, INT8, and latency at batch 1/4 × seq 16/32 (short timing protocol)."""
    bert = _example()
    work = tmp_path_factory.mktemp("bert")
    fit, held_out = bert.keyword_task(1024, max(SEQS), seed=0), bert.keyword_task(256, max(SEQS), seed=1)
    model = bert.train(bert.small(), fit, epochs=3)
    torch.save(model.state_dict(), work / "small.pt")
    bert.save_npz(work / "train.npz", fit)
    bert.save_npz(work / "heldout.npz", held_out)
    code = run(["run", f"{EXAMPLE}:small", "--weights", str(work / "small.pt"), "--data", str(work / "train.npz"),
                "--eval-data", str(work / "heldout.npz"), "-m", "factorize", "--mac-ratio", "0.5",
                "--dynamic-axes", "input_ids:batch,seq", "--dynamic-axes", "attention_mask:batch,seq",
                "--axis-values", f"seq={','.join(map(str, SEQS))}", "--batch", ",".join(map(str, BATCHES)),
                "--min-seconds", "0.05", "--repeats", "1", "--out", str(work / "run"), "-q"])
    assert code == 0
    return json.loads((work / "run" / "report.json").read_text())["cases"][0]


def _variants(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["label"]: v for v in case["variants"]}


def test_run_exports_both_inputs_with_dynamic_batch_and_sequence(report: dict[str, Any]) -> None:
    variants = _variants(report)
    assert tuple(variants) == LABELS
    for label in LABELS[:2]:
        export = variants[label]["export"]
        assert export["input_names"] == ["input_ids", "attention_mask"]
        assert export["dynamic_axes"] == {name: {"0": "batch", "1": "seq"} for name in export["input_names"]}


def test_run_checks_parity_at_two_batch_sizes_and_two_sequence_lengths(report: dict[str, Any]) -> None:
    for label in LABELS[:2]:
        parity = _variants(report)[label]["parity"]
        sizes = parity["batch_sizes"]
        # The largest batch is checked a second time with the sequence cut to half its length.
        assert len(set(sizes)) == 2 and sizes.count(max(sizes)) == 2, sizes
        assert len(parity["checks"]) == 3 and all(c["passed"] for c in parity["checks"]) and parity["passed"]
        assert parity["max_abs_err"] < 1e-3


def test_run_times_every_batch_and_sequence_length(report: dict[str, Any]) -> None:
    cells = sorted((r["model"], r["batch_size"], r["shape"]) for r in report["bench"]["latency"])
    assert cells == sorted(product(LABELS, BATCHES, [f"seq={s}" for s in SEQS]))
    assert all(r["stats"]["p50_ms"] > 0 and len(r["process_p50_ms"]) == 1 for r in report["bench"]["latency"])
    ratios = {(r["model"], r["batch_size"], r["shape"]) for r in report["bench"]["ratios"]}
    assert ratios == set(product(LABELS[1:], BATCHES, [f"seq={s}" for s in SEQS]))


def test_run_quantises_original_and_factorized(report: dict[str, Any]) -> None:
    variants = _variants(report)
    for label in ("original.int8", "factorize.int8"):
        q = variants[label]["quantization"]
        assert q["mode"] == "static" and q["integer_kernels"] > 0
    assert {m["model"] for m in report["bench"]["metrics"]} == set(LABELS)


def test_factorize_reaches_the_budget_through_the_attention_projections(report: dict[str, Any]) -> None:
    compression = _variants(report)["factorize"]["compression"]
    layers = {layer["name"]: layer for layer in compression["layers"]}
    projections = [name for name in layers if ATTENTION_PROJECTION.match(name)]
    assert len(projections) == 2 * 4  # q/k/v/out of both layers are candidates
    assert any(layers[name]["action"] == "factorized" for name in projections)
    assert compression["macs_after"] <= 0.5 * compression["macs_before"] * 1.01
    assert compression["measured"]["held_out"]["top1_agreement"] >= 0.9


def test_original_is_far_above_chance_on_held_out_data(report: dict[str, Any]) -> None:
    accuracy = {m["model"]: m["accuracy"] for m in report["bench"]["metrics"]}
    assert report["data_check"]["verdict"] == "match"
    assert accuracy["original"] >= 0.8 and accuracy["factorize"] >= 0.75  # chance: 0.25


def test_int8_keeps_the_accuracy(report: dict[str, Any]) -> None:
    accuracy = {m["model"]: m["accuracy"] for m in report["bench"]["metrics"]}
    assert accuracy["original.int8"] >= accuracy["original"] - 0.05
    assert accuracy["factorize.int8"] >= accuracy["factorize"] - 0.05
    for variant in report["variants"]:
        if variant["quantization"]:  # the -inf padding mask path is left in float, never quantised
            assert variant["quantization"]["nonfinite_nodes"], variant["label"]
