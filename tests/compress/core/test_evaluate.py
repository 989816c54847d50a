"""Tests for minreal.compress.core.evaluate on models that return several outputs (issue 44: torchvision's
segmentation models return an OrderedDict, Hugging Face models a ModelOutput)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.evaluate import compare_outputs, flatten_outputs, output_paths, output_rows, predict


class DictNet(nn.Module):
    """The shape of deeplabv3_mobilenet_v3_large's output in miniature: ``OrderedDict(out=..., aux=...)``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head, self.aux = nn.Conv2d(8, 5, 1), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        f = self.body(x)
        return OrderedDict(out=self.head(f), aux=self.aux(f))


@pytest.fixture
def dict_net() -> nn.Module:
    torch.manual_seed(0)
    return DictNet().eval()


@pytest.fixture
def images() -> Dataset:
    g = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(6, 3, 4, 4, generator=g), None)


def test_output_rows_joins_dict_outputs_per_sample_in_order() -> None:
    out, aux = torch.arange(24.0).reshape(2, 3, 4), torch.arange(4.0).reshape(2, 2)
    rows = output_rows(OrderedDict(out=out, aux=aux))
    assert rows.shape == (2, 12 + 2)
    assert torch.equal(rows[1], torch.cat([out[1].flatten(), aux[1]]))


def test_output_rows_keeps_a_lone_tensor() -> None:
    t = torch.randn(3, 2, 2)
    assert output_rows(t) is t


def test_outputs_without_a_row_per_sample_are_refused_in_one_line() -> None:
    boxes = [{"boxes": torch.zeros(3, 4)}, {"boxes": torch.zeros(5, 4)}]  # a detection model's per-image boxes
    with pytest.raises(CompressionError, match="one row per sample"):
        output_rows(boxes)


def test_output_paths_name_dict_keys_and_positions() -> None:
    t = torch.zeros(1)
    assert output_paths(t) == [("", False)]
    assert output_paths((t, t)) == [("0", False), ("1", False)]
    assert output_paths({"logits": t, "past": (t, [t])}) == [("logits", True), ("past.0", True), ("past.1.0", True)]


def test_predict_and_compare_outputs_take_a_dict_output(dict_net: nn.Module, images: Dataset) -> None:
    ref = predict(dict_net, images, batch_size=4)  # two batches (4 + 2)
    assert ref.shape == (6, 5 * 16 + 2 * 16)
    with torch.no_grad():
        direct = dict_net(images.x)
    assert torch.allclose(ref, torch.cat([direct["out"].flatten(1), direct["aux"].flatten(1)], dim=1))
    same = compare_outputs(dict_net, dict_net, images)
    assert same["relative_output_error"] == 0.0 and same["max_abs_diff"] == 0.0
    assert "top1_agreement" not in same  # an argmax across two joined outputs means nothing


def test_top1_agreement_stays_for_a_classifier(images: Dataset) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 4)).eval()
    assert compare_outputs(net, net, images)["top1_agreement"] == 1.0


def test_flatten_outputs_refuses_or_passes_over_an_object_that_is_not_a_tensor() -> None:
    class Cache:  # a Hugging Face key/value cache returned beside the tensors
        pass

    a, b = torch.ones(2), torch.zeros(3)
    outputs = {"last_hidden_state": a, "past_key_values": Cache(), "more": (b,)}
    with pytest.raises(TypeError, match="module output of type Cache is not a tensor"):
        flatten_outputs(outputs)
    got = flatten_outputs(outputs, skip_other=True)
    assert len(got) == 2 and got[0] is a and got[1] is b


@pytest.mark.parametrize("method", ["factorize", "wanda", "fde"])
def test_a_model_returning_a_cache_is_refused_after_one_samples_forward(method: str) -> None:
    """A model returning an object no comparison can read (a Hugging Face key/value cache) is refused by every
    method before its statistics: one forward of one sample, in one line with the way out."""
    from minreal.compress import compress

    class Cache:
        """A key/value cache stand-in: an object no comparison can read."""

    class WithCache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 4))
            self.rows = 0

        def forward(self, x: torch.Tensor) -> dict:
            self.rows += len(x)
            return {"logits": self.body(x), "past_key_values": Cache()}

    model = WithCache()
    with pytest.raises(CompressionError, match=r"^module output of type Cache is not a tensor .*use_cache=False"):
        compress(model, Dataset(torch.randn(64, 6)), method)
    assert model.rows == 1


def test_the_output_check_passes_tensors_in_containers_named_inputs_and_a_failing_forward() -> None:
    """What the early check lets through: dict and tuple outputs of tensors, named inputs (one sample of each), and
    a forward that fails there, which the method reports in its own words; an empty dataset is not run."""
    from minreal.compress.core.evaluate import require_tensor_outputs
    from minreal.compress.core.inputs import NamedInputs

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rows = []

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict:
            self.rows.append(len(ids))
            return {"logits": ids.float() * mask, "pair": (mask, [mask])}

    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("needs two samples")

    named = Named()
    x = NamedInputs({"ids": torch.ones(4, 3, dtype=torch.long), "mask": torch.ones(4, 3)})
    require_tensor_outputs(named, Dataset(x))
    assert named.rows == [1]
    require_tensor_outputs(Broken(), Dataset(torch.randn(4, 2)))  # left for the method to report
    require_tensor_outputs(Broken(), Dataset(torch.randn(0, 2)))  # nothing to run


class _Counted(nn.Module):
    """A small MLP that counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


def test_kept_predictions_run_a_named_model_once_per_weights_and_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Never compute twice": inside predictions_kept(model), predict of that model on the same data and batch size
    runs once and returns equal copies (changing one leaves the kept outputs as they were); new weights or buffers,
    other data, another batch size or a model not named run again; the budget caps what is held; outside a block
    every call runs."""
    from minreal.compress.core import evaluate

    torch.manual_seed(0)
    model, other = _Counted(), _Counted()
    data = Dataset(torch.randn(40, 6))
    fresh = predict(model, data, 16)
    model.calls = 0
    with evaluate.predictions_kept(model):
        first, again = predict(model, data, 16), predict(model, data, 16)
        assert model.calls == 3  # one pass of 40 rows in batches of 16
        assert torch.equal(first, fresh) and torch.equal(again, fresh) and again is not first
        first.zero_()
        again.zero_()
        assert torch.equal(predict(model, data, 16), fresh) and model.calls == 3
        predict(model, Dataset(data.x[:20]), 16)  # other data
        predict(model, data, 40)  # another batch size
        assert model.calls == 3 + 2 + 1
        with torch.no_grad():
            model.net[1].running_mean += 1.0  # a buffer changed: other outputs
        assert not torch.equal(predict(model, data, 16), fresh) and model.calls == 9
        predict(other, data, 16)
        predict(other, data, 16)
        assert other.calls == 6  # not named: runs each time
        with evaluate.predictions_kept(other):  # an inner block names its model until it ends
            predict(other, data, 16)
            predict(other, data, 16)
        assert other.calls == 9 and not any(m is other for m in evaluate._KEPT.get().models)
        predict(other, data, 16)
        assert other.calls == 12
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(threads + 1)  # another thread count may split a float sum otherwise
            predict(model, data, 16)
        finally:
            torch.set_num_threads(threads)
        assert model.calls == 12
        monkeypatch.setattr(evaluate, "KEPT_PREDICTION_BYTES", 0)
        big = Dataset(torch.randn(8, 6))
        predict(model, big, 16)
        predict(model, big, 16)
        assert model.calls == 14  # over the budget: computed again, not held
    model.calls = 0
    predict(model, data, 16)
    predict(model, data, 16)
    assert model.calls == 6


def test_a_model_judged_against_itself_runs_once() -> None:
    from minreal.compress.core.recover import held_out_metrics

    torch.manual_seed(1)
    model, data = _Counted(), Dataset(torch.randn(30, 6), torch.randint(0, 4, (30,)))
    metrics = held_out_metrics(model, model, data, batch_size=64)
    assert model.calls == 1 and metrics["agreement"] == 1.0 and metrics["kl"] == 0.0


def test_a_quantised_weight_is_not_digested_and_the_model_not_kept() -> None:
    """A quantised tensor has no plain bytes to digest: predict runs as outside a block."""
    from minreal.compress.core import evaluate

    model = _Counted()
    model.register_buffer("q", torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8))
    data = Dataset(torch.randn(5, 6))
    assert evaluate._prediction_key(model, data, 16) is None
    with evaluate.predictions_kept(model):
        predict(model, data, 16)
        predict(model, data, 16)
    assert model.calls == 2


def test_a_frozen_copy_is_kept_like_its_original_only_while_it_is_used() -> None:
    """A recovery's teacher (a deep copy of the original) shares the original's kept outputs while it trains, and is
    no longer named after (the copy is not held for the rest of the run)."""
    import copy

    from minreal.compress.core import evaluate

    torch.manual_seed(2)
    model, data = _Counted(), Dataset(torch.randn(20, 6))
    teacher = copy.deepcopy(model)
    with evaluate.predictions_kept(model):
        predict(model, data, 16)
        with evaluate.kept_like(teacher, model):
            predict(teacher, data, 16)
            assert teacher.calls == 0 and any(m is teacher for m in evaluate._KEPT.get().models)
        assert not any(m is teacher for m in evaluate._KEPT.get().models)
        stranger = copy.deepcopy(model)
        stranger.calls = 0
        with evaluate.kept_like(stranger, teacher):  # teacher is not named now: nothing is
            predict(stranger, data, 16)
        assert stranger.calls == 2


def test_a_lazy_module_is_initialised_by_its_forward_inside_a_block_too() -> None:
    """An uninitialised lazy parameter has no bytes to digest: the model runs (and initialises) as outside."""
    from minreal.compress.core import evaluate

    model = nn.Sequential(nn.LazyLinear(3))
    data = Dataset(torch.randn(4, 5))
    with evaluate.predictions_kept(model):
        assert predict(model, data, 16).shape == (4, 3)
        assert predict(model, data, 16).shape == (4, 3)


def test_the_key_sees_the_architecture_non_persistent_buffers_and_autocast() -> None:
    """What changes the outputs changes the key: a swapped parameterless submodule, a non-persistent buffer; under
    autocast nothing is kept (its dtype would be part of the outputs)."""
    from minreal.compress.core import evaluate

    torch.manual_seed(3)
    model, data = _Counted(), Dataset(torch.randn(6, 6))
    key = evaluate._prediction_key(model, data, 16)
    assert evaluate._prediction_key(model, data, 16) == key
    model.net[2] = nn.Tanh()
    swapped = evaluate._prediction_key(model, data, 16)
    assert swapped != key
    model.register_buffer("offset", torch.zeros(1), persistent=False)
    with_buffer = evaluate._prediction_key(model, data, 16)
    model.offset += 1
    assert with_buffer != swapped and evaluate._prediction_key(model, data, 16) != with_buffer
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert evaluate._prediction_key(model, data, 16) is None
