"""Tests for minreal.export.verify: parity on two batch sizes, loud failures, measured numbers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import minreal.export.verify as verify_module
from minreal.export.errors import ParityError
from minreal.export.onnx_export import ExportResult
from minreal.export.settings import VariantConfig
from minreal.export.verify import DEFAULT_ATOL, DEFAULT_ATOL_SCALE, DEFAULT_RTOL, compare_output, verify_parity


def _assert_clear_top1(model: nn.Module, inputs: list[torch.Tensor]) -> None:
    """Every output's top logit leads by more than twice the parity allowance (atol + atol_scale·max|y| + rtol·|y|),
    so outputs
    that pass parity (ORT vs torch: other kernels, float32 rounding) must agree on top-1 exactly."""
    for x in inputs:
        with torch.no_grad():
            out = model(x)
        for y in out if isinstance(out, tuple) else (out,):
            top2 = y.topk(2, dim=-1).values
            allowance = DEFAULT_ATOL + (DEFAULT_ATOL_SCALE + DEFAULT_RTOL) * y.abs().max()
            assert (top2[..., 0] - top2[..., 1] > 2 * allowance).all()


def test_parity_passes_on_two_batch_sizes(
    convnet: nn.Module, convnet_onnx: ExportResult, make_images: Callable[[int, int], torch.Tensor]
) -> None:
    inputs = [make_images(1, 3), make_images(7, 4)]
    _assert_clear_top1(convnet, inputs)
    result = verify_parity(convnet, convnet_onnx.path, inputs)
    assert (result.rtol, result.atol) == (DEFAULT_RTOL, DEFAULT_ATOL) == (1e-4, 1e-5)
    assert result.passed and result.batch_sizes == [1, 7]
    assert [(c.output, c.batch_size) for c in result.checks] == [("output", 1), ("output", 7)]
    assert result.top1_agreement == {1: 1.0, 7: 1.0}
    assert 0.0 <= result.max_abs_err <= DEFAULT_ATOL
    assert all(c.worst_measured <= c.worst_allowed for c in result.checks)


def test_parity_sessions_run_without_the_memory_arena(
    convnet: nn.Module, convnet_onnx: ExportResult, make_images: Callable[[int, int], torch.Tensor],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parity session returns each batch's memory after the run (no onnxruntime arena kept at the largest batch
    until the session closes): a one-off check holds no more than its largest batch needs."""
    arenas: list[bool] = []
    real = verify_module.create_session
    monkeypatch.setattr(verify_module, "create_session", lambda *a, **k: arenas.append(
        (made := real(*a, **k)).get_session_options().enable_cpu_mem_arena) or made)
    assert verify_parity(convnet, convnet_onnx.path, [make_images(1, 3), make_images(7, 4)]).passed
    assert arenas == [False]


def test_parity_covers_every_output(two_heads: nn.Module, two_heads_onnx: ExportResult) -> None:
    g = torch.Generator().manual_seed(6)
    inputs = [torch.randn(2, 10, generator=g), torch.randn(5, 10, generator=g)]
    _assert_clear_top1(two_heads, inputs)
    result = verify_parity(two_heads, two_heads_onnx.path, inputs)
    assert [(c.output, c.batch_size) for c in result.checks] == [
        ("output_0", 2), ("output_1", 2), ("output_0", 5), ("output_1", 5),
    ]  # fmt: skip
    assert all(c.top1_agreement == 1.0 for c in result.checks)


def test_perturbed_weights_raise_naming_output_and_batch(two_heads: nn.Module, two_heads_onnx: ExportResult) -> None:
    changed = copy.deepcopy(two_heads)
    with torch.no_grad():
        changed.embed.weight.add_(0.05)  # only the second output moves
    with pytest.raises(ParityError, match=r"output 'output_1' at batch size (2|5) .*> allowed") as info:
        verify_parity(changed, two_heads_onnx.path, [torch.randn(2, 10), torch.randn(5, 10)])
    message = str(info.value)
    assert "\n" not in message and "2 of 4 checks failed" in message
    result = info.value.result
    assert not result.passed
    assert {c.output for c in result.checks if not c.passed} == {"output_1"}
    assert result.max_abs_err > 1e-3


def test_needs_two_batch_sizes(convnet: nn.Module, convnet_onnx: ExportResult) -> None:
    with pytest.raises(ValueError, match="two or more batch sizes"):
        verify_parity(convnet, convnet_onnx.path, [torch.randn(3, 3, 12, 12), torch.randn(3, 3, 12, 12)])


def test_output_count_mismatch_raises(two_heads_onnx: ExportResult) -> None:
    one_output = nn.Linear(10, 4).eval()
    with pytest.raises(ParityError, match="has 2 outputs but the module returns 1"):
        verify_parity(one_output, two_heads_onnx.path, [torch.randn(1, 10), torch.randn(2, 10)])


def test_compare_output_measures_with_allclose_rule() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    candidate = reference + np.array([[1e-3, 0.0], [0.0, 1e-4]], dtype=np.float32)
    check = compare_output("y", 2, candidate, reference, rtol=1e-4, atol=1e-5)
    assert not check.passed
    assert check.max_abs_err == pytest.approx(1e-3, rel=1e-3)
    assert check.worst_measured == pytest.approx(1e-3, rel=1e-3)
    assert check.worst_allowed == pytest.approx(1e-5 + 1e-4 * 1.0)
    assert check.max_rel_err == pytest.approx(1e-3, rel=1e-3)
    assert check.top1_agreement == 1.0
    assert compare_output("y", 2, reference, reference, 1e-4, 1e-5).passed


def test_compare_output_over_chunks_finds_the_first_worst_element_and_keeps_a_nan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 4 elements over 3 × 5, checked against the allclose rule by hand: breaks of ratio 10 (chunk 1),
    500 (chunk 2: a 0 reference, allowed atol alone, relative error floored at atol) and 100 twice (chunk 3, the
    largest |diff|); then, the ratio-500 break undone, the first ratio-100 break is the worst; a NaN anywhere fails
    and is the maximum, as over the whole output at once."""
    import minreal.export.verify as verify

    monkeypatch.setattr(verify, "COMPARE_CHUNK", 4)
    reference = np.ones((3, 5), dtype=np.float32)
    reference[0, 4] = 0.0
    candidate = reference.copy()
    allowed = 1e-5 + 1e-4 * 1.0
    candidate[0, 1] += np.float32(10 * allowed)  # chunk 1
    candidate[1, 4] += np.float32(100 * allowed)  # chunk 3 (elements 8..11): the worst
    candidate[2, 1] += np.float32(100 * allowed)  # chunk 3 as well, same ratio: not the first
    candidate[0, 4] = np.float32(5e-3)  # 0 reference: allowed 1e-5, ratio 500, relative error 5e-3 / 1e-5
    check = compare_output("y", 3, candidate, reference, rtol=1e-4, atol=1e-5)
    assert not check.passed
    assert check.worst_measured == pytest.approx(5e-3, rel=1e-6) and check.worst_allowed == pytest.approx(1e-5)
    assert check.max_abs_err == pytest.approx(float(candidate[1, 4]) - 1.0, rel=1e-9)
    assert check.max_rel_err == pytest.approx(5e-3 / 1e-5, rel=1e-6)
    reference[0, 4], candidate[0, 4] = 1.0, 1.0  # now the element of chunk 3 is the worst
    check = compare_output("y", 3, candidate, reference, rtol=1e-4, atol=1e-5)
    assert check.worst_measured == pytest.approx(float(candidate[1, 4] - 1.0), rel=1e-9)
    assert check.worst_allowed == pytest.approx(allowed)
    candidate[2, 3] = np.nan
    check = compare_output("y", 3, candidate, reference, rtol=1e-4, atol=1e-5)
    assert not check.passed and np.isnan(check.max_abs_err) and np.isnan(check.worst_measured)


def test_compare_output_holds_chunk_sized_temporaries_not_copies_of_the_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """lraspp_mobilenet_v3_large's export peaked at 6.5 GB (zoo, issue 44): its batch-16 parity output at 520×520
    (91 M elements) was compared through several whole float64 copies at once. Over an output of 64 chunks, numpy's
    allocations (traced by tracemalloc) stay within a few float64 chunks, far under one float64 copy of the
    output."""
    import tracemalloc

    import minreal.export.verify as verify

    chunk = 1 << 16
    monkeypatch.setattr(verify, "COMPARE_CHUNK", chunk)
    reference = np.random.default_rng(0).standard_normal((64, chunk), dtype=np.float32)
    candidate = reference + np.float32(1e-6)
    tracemalloc.start()
    try:
        check = compare_output("y", 32, candidate, reference, rtol=1e-4, atol=1e-5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert check.passed and check.top1_agreement == 1.0
    assert peak < 16 * 8 * chunk <= 8 * reference.size / 4  # 16 float64 chunks, a quarter of one float64 copy


def test_output_agreement_feeds_a_fixed_batch_file_that_many_rows_at_a_time(tmp_path) -> None:
    """A file whose batch is fixed (``--fixed-shapes batch=4``) is compared on whole pieces of 4 rows: against
    itself, agreement 1 and relative MSE 0 on the 8 rows of 10 that fit; against its dynamic twin, the same."""
    import onnx

    from minreal.export.onnx_export import to_onnx
    from minreal.export.verify import output_agreement

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).eval()
    x = torch.randn(10, 6)
    dynamic = tmp_path / "d.onnx"
    to_onnx(net, x[:2], dynamic)
    model = onnx.load(dynamic)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_value = 4
    fixed = tmp_path / "f.onnx"
    onnx.save(model, fixed)
    assert output_agreement(fixed, fixed, x.numpy()) == (1.0, 0.0)
    agreement, rel = output_agreement(dynamic, fixed, x.numpy())
    assert agreement == 1.0 and rel < 1e-12


def test_atol_scale_holds_near_zero_elements_to_the_output_s_roundoff() -> None:
    # a large output with one element near zero: float32 roundoff of the whole graph (here 1.6e-4, 3e-6 of the
    # output's largest magnitude) breaks allclose's rule at that element and only there
    reference = np.array([[50.0, 1e-3, -20.0]], dtype=np.float32)
    candidate = reference + np.array([[0.0, 1.6e-4, 0.0]], dtype=np.float32)
    strict = compare_output("y", 1, candidate, reference, rtol=1e-3, atol=1e-4)
    assert not strict.passed and strict.worst_allowed == pytest.approx(1e-4 + 1e-3 * 1e-3)
    scaled = compare_output("y", 1, candidate, reference, rtol=1e-3, atol=1e-4, atol_scale=1e-5)
    assert scaled.passed
    assert scaled.worst_allowed == pytest.approx(1e-4 + 1e-5 * 50.0 + 1e-3 * 1e-3, rel=1e-6)
    # a real regression is still caught: 1e-2 is 200 x the output's allowance of 5.1e-4
    moved = reference + np.array([[0.0, 1e-2, 0.0]], dtype=np.float32)
    assert not compare_output("y", 1, moved, reference, rtol=1e-3, atol=1e-4, atol_scale=1e-5).passed


def test_atol_scale_reads_the_largest_finite_magnitude(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = np.array([np.inf, 2.0, np.nan, -4.0, -np.inf], dtype=np.float32)
    assert verify_module.finite_abs_max(reference) == 4.0
    assert verify_module.finite_abs_max(np.array([np.nan], dtype=np.float32)) == 0.0
    monkeypatch.setattr(verify_module, "COMPARE_CHUNK", 2)  # the largest sits in the second of three chunks
    assert verify_module.finite_abs_max(np.array([1.0, -2.0, 7.5, np.nan, 3.0], dtype=np.float32)) == 7.5


def test_parity_defaults_add_the_output_scale_and_say_so(two_heads: nn.Module, two_heads_onnx: ExportResult) -> None:
    assert VariantConfig().atol_scale == DEFAULT_ATOL_SCALE > 0
    changed = copy.deepcopy(two_heads)
    with torch.no_grad():
        changed.embed.weight.add_(0.05)
    with pytest.raises(ParityError, match=r"\+ 0.0001 x max\|output\|") as info:
        verify_parity(changed, two_heads_onnx.path, [torch.randn(2, 10), torch.randn(5, 10)])
    assert info.value.result.atol_scale == DEFAULT_ATOL_SCALE
    result = verify_parity(two_heads, two_heads_onnx.path, [torch.randn(2, 10), torch.randn(5, 10)], atol_scale=0.0)
    assert result.passed and result.atol_scale == 0.0


@pytest.mark.parametrize("option", ["atol_scale", "atol", "rtol"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_tolerances_must_be_finite_and_non_negative(option: str, bad: float, workdir: Path,
                                                    run_cli: Callable) -> None:
    # nan would fail every element ("allowed nan"), inf pass every one, a negative rtol fail an exact runtime: all
    # refused before any export
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=rf"`VariantConfig.{option}`=.*{flag} must be a finite number >= 0"):
        VariantConfig(**{option: bad})
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", flag, str(bad)])
    assert code == 2 and flag in err and "finite number >= 0" in err and not out
    assert len(err.strip().splitlines()) == 1 and sorted(p.name for p in workdir.iterdir()) == ["net.py"]


def test_an_opset_below_the_exporter_s_is_a_usage_error_before_any_work(workdir: Path, run_cli: Callable) -> None:
    with pytest.raises(ValueError, match=r"`VariantConfig.opset`=5: --opset must be 17 or more"):
        VariantConfig(opset=5)
    code, out, err = run_cli(["export", "net.py:bn_net", "--out", "m.onnx", "--input-shape", "3,8,8", "--opset", "5"])
    assert code == 2 and "--opset" in err and "must be 17 or more" in err and not out
    assert len(err.strip().splitlines()) == 1 and sorted(p.name for p in workdir.iterdir()) == ["net.py"]


def test_max_rel_err_keeps_the_given_atol_as_its_floor() -> None:
    reference = np.array([0.0, 50.0], dtype=np.float32)
    candidate = np.array([2e-4, 50.0], dtype=np.float32)
    plain = compare_output("y", 1, candidate, reference, rtol=1e-3, atol=1e-4)
    scaled = compare_output("y", 1, candidate, reference, rtol=1e-3, atol=1e-4, atol_scale=1e-4)
    assert plain.max_rel_err == pytest.approx(2e-4 / 1e-4, rel=1e-6) == scaled.max_rel_err  # |diff| / atol at 0
    assert not plain.passed and scaled.passed  # 2e-4 <= 1e-4 + 1e-4 * 50


class _Runtime:
    """An ONNX Runtime session stand-in with one output ``y``, for :func:`verify_parity`'s rule alone."""

    def get_outputs(self) -> list:
        from types import SimpleNamespace

        return [SimpleNamespace(name="y")]


def _deep_chain() -> nn.Module:
    """Twelve seeded 64-wide Linear layers with tanh: float32 roundoff well above zero at the output."""
    torch.manual_seed(3)
    return nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(64, 64), nn.Tanh())]).eval()


def _runtime_giving(monkeypatch: pytest.MonkeyPatch, outputs: Callable[[np.ndarray], np.ndarray]) -> None:
    monkeypatch.setattr(verify_module, "create_session", lambda *a, **k: _Runtime())
    monkeypatch.setattr(verify_module, "run_ort", lambda session, feeds: [outputs(feeds)])


def _exact(model: nn.Module, feeds: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return copy.deepcopy(model).double()(torch.from_numpy(feeds).double()).numpy()


def test_a_runtime_as_exact_as_float64_passes_by_torch_s_own_roundoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """zoo (issue 44): a seeded ResNet-152's batch-1 output was 2.75e-4 from torch in ONNX Runtime, 1 % beyond the
    rule, while torch's own float32 result was 3.1e-4 from float64. A runtime that returns the exact (float64)
    result is ``|exact - torch32| <= roundoff`` from torch: within 2 x roundoff whatever atol, so it passes even with
    every other tolerance at zero, and the check records the roundoff it measured."""
    model = _deep_chain()
    _runtime_giving(monkeypatch, lambda feeds: _exact(model, feeds))
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 64, generator=g), torch.randn(3, 64, generator=g)]
    with torch.no_grad():
        roundoff = max(float((model(x).double() - copy.deepcopy(model).double()(x.double())).abs().max())
                       for x in inputs)
    assert roundoff > 0  # float32 differs from float64 here: the rule alone (all tolerances 0) fails
    result = verify_parity(model, "unused.onnx", inputs, rtol=0.0, atol=0.0, atol_scale=0.0)
    assert result.passed and all(0 < c.roundoff <= roundoff for c in result.checks)
    assert all(c.worst_measured <= c.worst_allowed == verify_module.ROUNDOFF_FACTOR * c.roundoff
               for c in result.checks)


def test_a_runtime_beyond_twice_the_roundoff_still_fails_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float64 run widens the tolerance by 2 x torch's error, no more: an output 3 x that error from the exact
    result fails, and the line names the part the roundoff added."""
    model = _deep_chain()
    x1, x3 = torch.randn(1, 64), torch.randn(3, 64)
    with torch.no_grad():
        roundoff = {len(x): float((model(x).double() - copy.deepcopy(model).double()(x.double())).abs().max())
                    for x in (x1, x3)}
    _runtime_giving(monkeypatch, lambda feeds: _exact(model, feeds) + 3 * roundoff[len(feeds)])
    with pytest.raises(ParityError, match=r"\+ 2 x torch's float32 error .*2 of 2 checks failed") as info:
        verify_parity(model, "unused.onnx", [x1, x3], rtol=0.0, atol=0.0, atol_scale=0.0)
    assert [c.roundoff for c in info.value.result.checks] == [roundoff[1], roundoff[3]]


class _Float32Only(nn.Module):
    """Casts its input to float32 against a weight that follows the module's dtype: no float64 run."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.weight


def test_a_module_that_does_not_run_in_float64_keeps_the_rule_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No float64 reference (the copy fails in float64): the failure stands as the rule alone measured it."""
    model = _Float32Only().eval()
    _runtime_giving(monkeypatch, lambda feeds: model(torch.from_numpy(feeds)).detach().numpy() + 1.0)
    with pytest.raises(ParityError) as info:
        verify_parity(model, "unused.onnx", [torch.randn(1, 4), torch.randn(2, 4)])
    assert "float32 error" not in str(info.value) and all(c.roundoff == 0 for c in info.value.result.checks)


class _MaskedLogits(nn.Module):
    """Logits of the last two classes set to the dtype's lowest value (a logits processor's mask): a constant of the
    dtype, -3.4e38 in float32 and -1.8e308 in float64."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.lin = nn.Linear(64, 10)
        self.register_buffer("keep", torch.arange(10) < 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y.masked_fill(~self.keep, torch.finfo(y.dtype).min)


def _kept_logits_one_off(model: _MaskedLogits) -> Callable[[np.ndarray], np.ndarray]:
    """A runtime that gives the model's outputs with every kept logit 1.0 off (the mask as it is)."""
    def outputs(feeds: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            y = model(torch.from_numpy(feeds)).numpy().copy()
        y[:, :8] += 1.0
        return y

    return outputs


def test_a_constant_of_the_dtype_is_not_roundoff_and_does_not_open_the_tolerance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A float64 value beyond float32's range (``torch.finfo(dtype).min`` as a mask) is the dtype's constant, not
    torch's float32 error: counted, it made the roundoff 1.8e308 and the tolerance infinite, so a runtime 1.0 off
    on every kept logit passed. The roundoff is the largest error over the kept logits, and that runtime fails."""
    model = _MaskedLogits().eval()
    x1, x2 = torch.randn(1, 64), torch.randn(2, 64)

    _runtime_giving(monkeypatch, _kept_logits_one_off(model))
    with pytest.raises(ParityError, match="2 of 2 checks failed") as info:
        verify_parity(model, "unused.onnx", [x1, x2], atol_scale=0.0)
    with torch.no_grad():
        kept = [float((model.lin(x).double() - copy.deepcopy(model.lin).double()(x.double()))[:, :8].abs().max())
                for x in (x1, x2)]
    assert [c.roundoff for c in info.value.result.checks] == kept


def test_an_exact_mask_constant_does_not_set_the_output_s_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits of about 3 beside a mask of -1e9 that the runtime writes exactly: counted in the scale, the mask made the
    tolerance 1e-4 * 1e9 = 1e5, so a runtime 0.5 off on every kept logit passed. The mask needs no tolerance and
    would cover every differing element's whole magnitude, so it does not count; a runtime within roundoff passes."""
    g = np.random.default_rng(0)
    reference = (3 * g.standard_normal((4, 10))).astype(np.float32)
    reference[:, 8:] = -1e9
    off = reference.copy()
    off[:, :8] += 0.5
    args = dict(rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, atol_scale=DEFAULT_ATOL_SCALE)
    assert not compare_output("y", 4, off, reference, **args).passed
    kept = float(np.abs(reference[:, :8]).max())
    assert verify_module.output_scale(off, reference, DEFAULT_ATOL_SCALE) == kept
    close = reference.copy()
    close[:, :8] *= np.float32(1 + 2e-5)  # within rtol: passes, and the mask's exact elements are not its scale
    assert compare_output("y", 4, close, reference, **args).passed
    # an exact element within the bound (atol_scale x 50 = 5e-4 <= the differing element's 1e-3) still counts, and
    # so does one past it found at one position of the sample; a constant past it at several positions does not,
    # in whichever chunks they lie
    monkeypatch.setattr(verify_module, "COMPARE_CHUNK", 2)
    reference = np.array([[1e-3, 7.0, 50.0, -2e6, 3e5, -2e6]], dtype=np.float32)
    candidate = reference + np.array([[1.6e-4, 0, 0, 0, 0, 0]], dtype=np.float32)
    assert verify_module.output_scale(candidate, reference, 1e-5) == 3e5
    assert verify_module.output_scale(candidate[:, :5], reference[:, :5], 1e-5) == 2e6  # -2e6 once: counted
    assert verify_module.output_scale(candidate, reference, 0.0) == 2e6  # no scale part: nothing to bound
    assert verify_module.output_scale(reference, reference, 1e-5) == 0.0  # nothing differs: no tolerance needed
    # an element that differs always counts, however large
    moved = candidate + np.array([[0, 0, 0, 1, 0, 0]], np.float32)
    assert verify_module.output_scale(moved, reference, 1e-5) == 2e6
    # repeated rows (parity data with fewer samples than its batch): a value at one position of every row is still
    # found at one position, and counts
    rows, near = np.repeat(reference[:, :5], 3, axis=0), np.repeat(candidate[:, :5], 3, axis=0)
    assert verify_module.output_scale(near, rows, 1e-5) == 2e6
    # more distinct exact constants past the bound than masks have (each at two positions): the output's own values,
    # counted as before
    values = np.arange(1, verify_module.MASK_VALUES + 2, dtype=np.float32) * 1e6
    many = np.concatenate([[1e-3], values, values]).astype(np.float32)[None]
    near = many + np.float32(1.6e-4) * (many < 1)
    assert verify_module.output_scale(near, many, 1e-5) == float(values.max())
    assert verify_module.output_scale(near[:, :-1], many[:, :-1], 1e-5) == float(values.max())
    few = np.concatenate([[1e-3], values[:3], values[:3]]).astype(np.float32)[None]
    assert verify_module.output_scale(few + np.float32(1.6e-4) * (few < 1), few, 1e-5) == pytest.approx(1e-3)


def test_the_dtype_s_lowest_value_as_a_mask_no_longer_opens_the_default_tolerance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torch.finfo(dtype).min`` as a mask, exported as the constant it is: with the default ``atol_scale`` the
    tolerance was 1e-4 * 3.4e38 and a runtime 1.0 off on every kept logit passed parity; now it fails."""
    model = _MaskedLogits().eval()

    _runtime_giving(monkeypatch, _kept_logits_one_off(model))
    with pytest.raises(ParityError, match="2 of 2 checks failed"):
        verify_parity(model, "unused.onnx", [torch.randn(1, 64), torch.randn(2, 64)])


class _ClassIds(nn.Module):
    """Class ids (argmax of 10 logits), as deployment wrappers return them. On ``[1, 1e-8]`` logits 0 and 9 tie in
    float32 (``1 + 1e-8`` rounds to 1: class 0) and not in float64 (class 9)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 10, bias=False)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.weight[0, 0] = self.lin.weight[9, 0] = self.lin.weight[9, 1] = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).argmax(-1)


def test_an_integer_output_gets_no_roundoff_from_a_flip_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """An integer output has no float32 error: where float64 flips a near-tie (class 0 → 9), the difference is a
    jump, not a bound on the runtime's error; counted, it widened the tolerance to 18 and a runtime that answers
    class 0 for a row torch puts in class 9 passed."""
    model = _ClassIds().eval()
    tie = torch.tensor([[1.0, 1e-8]])
    x1, x2 = tie, torch.cat([tie, torch.tensor([[0.0, 1.0]])])
    with torch.no_grad():
        assert model(x2).tolist() == [0, 9] and copy.deepcopy(model).double()(x2.double()).tolist() == [9, 9]
    _runtime_giving(monkeypatch, lambda feeds: np.zeros(len(feeds), dtype=np.int64))
    with pytest.raises(ParityError, match="'y' at batch size 2 .*1 of 2 checks failed") as info:
        verify_parity(model, "unused.onnx", [x1, x2])
    assert [(c.max_abs_err, c.roundoff) for c in info.value.result.checks] == [(0.0, 0.0), (9.0, 0.0)]


class _TablePick(_ClassIds):
    """A float per class picked by the argmax (a box coordinate chosen by top-k or NMS): float values, a discrete
    choice."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.linspace(0.0, 500.0, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[super().forward(x)]


def test_a_float_picked_by_a_flipped_choice_is_not_roundoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where float64 flips the near-tie, torch32 and torch64 differ by 500 on an output of magnitude 500: far beyond
    ROUNDOFF_MAX_SHARE of the output (float32 roundoff is 6e-8 of it), so it widens nothing, and a runtime that
    answers 0 for a row torch puts at 500 still fails."""
    model = _TablePick().eval()
    tie = torch.tensor([[1.0, 1e-8]])
    x1, x2 = tie, torch.cat([tie, torch.tensor([[0.0, 1.0]])])
    with torch.no_grad():
        assert model(x2).tolist() == [0.0, 500.0] and copy.deepcopy(model).double()(x2.double()).tolist() == [500.0,
                                                                                                            500.0]
    _runtime_giving(monkeypatch, lambda feeds: np.zeros(len(feeds), dtype=np.float32))
    with pytest.raises(ParityError, match="'y' at batch size 2 .*1 of 2 checks failed") as info:
        verify_parity(model, "unused.onnx", [x1, x2])
    assert [(c.max_abs_err, c.roundoff) for c in info.value.result.checks] == [(0.0, 0.0), (500.0, 0.0)]


def test_the_float64_copy_is_made_once_for_every_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both batch sizes miss the rule (all tolerances 0), and each gets its float64 roundoff from the same copy:
    the model is deep-copied once, not once per batch size."""
    model = _deep_chain()
    exact = copy.deepcopy(model).double()
    _runtime_giving(monkeypatch, lambda feeds: exact(torch.from_numpy(feeds).double()).detach().numpy())
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(verify_module.copy, "deepcopy", lambda obj, *a: copies.append(obj) or real(obj, *a))
    result = verify_parity(model, "unused.onnx", [torch.randn(1, 64), torch.randn(3, 64)], rtol=0.0, atol=0.0,
                           atol_scale=0.0)
    assert result.passed and all(c.roundoff > 0 for c in result.checks)
    assert copies == [model]


def test_a_program_that_guards_its_exported_length_says_how_to_make_it_dynamic(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """A .pt2 saved at one length, checked at another for a dynamic axis: torch's "Guard failed" alone named no way
    out."""
    model = nn.Sequential(nn.Linear(8, 4)).eval()
    program = torch.export.export(model, (torch.randn(2, 6, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},)).module()
    for switch in ("train", "eval"):  # as the CLI loads a .pt2: the flag cannot change the graph
        program.__dict__.pop(switch, None)
    _runtime_giving(monkeypatch, lambda feeds: np.zeros((len(feeds), feeds.shape[1], 4), np.float32))
    with pytest.raises(ParityError, match=r"the torch module fails on the parity inputs .*Guard failed.*; a "
                                          r"torch.export program \(.pt2\) runs only at the sizes it was saved for "
                                          r"\(input axis 1: 6 -> 3\): make it again with that axis dynamic "
                                          r"\(minreal compress --dynamic-axes\)"):
        verify_parity(program, "unused.onnx", [torch.randn(1, 6, 8), torch.randn(2, 3, 8)])
