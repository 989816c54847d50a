"""Tests for minreal.compress.core.width.probe: values at a group's state points, before and after a cut."""

from __future__ import annotations

import minreal_width_zoo as zoo  # registered by this folder's conftest.py
import torch

from minreal.compress.core.width import Cut, apply_cuts, capture, channels_last


def test_capture_returns_what_the_consumers_read(analysed) -> None:
    a = analysed("flat_cnn")
    g = a.wg.group("conv2")
    (point,) = g.state_points()
    seen = {}
    handle = a.wg.gm.get_submodule("fc").register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    try:
        found = capture(a.wg.gm, a.x, [point])
    finally:
        handle.remove()
    assert list(found) == [point] and torch.equal(found[point], seen["x"])


def test_capture_on_a_cut_copy_sees_the_narrower_values(analysed) -> None:
    a = analysed("small_cnn")
    g = a.wg.group("3")
    cut = apply_cuts(a.wg, {"3": Cut(zoo.three_quarters(g.size))})
    (point,) = g.state_points()
    before, after = capture(a.wg.gm, a.x, [point])[point], capture(cut, a.x, [point])[point]
    assert before.shape[1] == 16 and after.shape[1] == 12 and after.shape[2:] == before.shape[2:]


def test_channels_last_is_samples_by_channels() -> None:
    value = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    matrix = channels_last(value, 1)
    assert matrix.shape == (2 * 4 * 5, 3)
    assert torch.equal(matrix[1 * 20 + 2 * 5 + 3], value[1, :, 2, 3])  # sample (n=1, h=2, w=3)
    assert torch.equal(channels_last(value, 3), value.reshape(-1, 5))


def test_visit_sees_each_node_once_in_run_order_with_the_value_capture_copies(analysed) -> None:
    from minreal.compress.core.width.probe import visit

    a = analysed("small_cnn")
    points = sorted({p for g in a.wg.cuttable() for p in g.state_points()})
    seen: list[tuple[str, torch.Tensor]] = []
    visit(a.wg.gm, a.x, points, lambda name, value: seen.append((name, value.clone())))
    order = [n.name for n in a.wg.gm.graph.nodes if n.name in points]
    assert [name for name, _ in seen] == order and len(order) == len(points) > 1
    found = capture(a.wg.gm, a.x, points)
    assert all(torch.equal(value, found[name]) for name, value in seen)


def test_wanda_importance_batches_by_the_activations_and_its_scores_do_not_depend_on_them() -> None:
    """A fixed 256 samples a pass (each activation also copied to float64 there) held GBs at high resolutions; the
    pass now takes fewer samples where one batch's largest activation would pass FORWARD_BYTES, and the scores are
    sums over samples, the same in any batches."""
    from torch import nn

    from minreal.compress.core.width import analyse
    from minreal.compress.core.width.importance import wanda_importance
    from minreal.compress.core.width.tracing import FORWARD_BYTES, activation_batch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 8, 3, padding=1)).eval()
    big = analyse(model, torch.rand(2, 3, 256, 256))
    assert activation_batch(big.gm, 256) == FORWARD_BYTES // (32 * 256 * 256 * 4) == 32
    assert activation_batch(big.gm, 256, copy_to=torch.float64) == FORWARD_BYTES // (32 * 256 * 256 * 12) == 10
    wg, x = analyse(model, torch.rand(2, 3, 8, 8)), torch.rand(40, 3, 8, 8)
    assert activation_batch(wg.gm, 256) == 256
    groups = wg.cuttable()
    whole, parts = wanda_importance(wg, groups, x), wanda_importance(wg, groups, x, batch_size=7)
    assert whole.keys() == parts.keys() and all(torch.allclose(whole[k], parts[k], rtol=1e-9) for k in whole)
