"""export/serialize.py: the output container types of a saved program that only their own package can rebuild
(a Hugging Face ModelOutput), found from the program's output spec and said when the program is saved."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

from minreal.export.serialize import foreign_output_types, save_program


class _Pair:
    """An output container registered with torch's pytree by its own code, as transformers registers ModelOutput."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b


class _Nested(nn.Module):
    def __init__(self, pair: bool) -> None:
        super().__init__()
        self.pair = pair

    def forward(self, x: torch.Tensor) -> object:
        inner = _Pair(x + 1, x * 2) if self.pair else (x + 1, [x * 2])
        return {"out": x, "more": inner}


@pytest.fixture
def registered() -> object:
    pytree.register_pytree_node(_Pair, lambda p: ([p.a, p.b], None), lambda v, _: _Pair(*v),
                                serialized_type_name="minreal_test.Pair")
    yield
    pytree._deregister_pytree_node(_Pair)


def test_only_types_torch_does_not_know_by_itself_are_foreign(registered: object) -> None:
    x = torch.randn(2, 3)
    assert foreign_output_types(torch.export.export(_Nested(pair=False), (x,))) == []
    assert foreign_output_types(torch.export.export(_Nested(pair=True), (x,))) == [f"{__name__}._Pair"]
    # a torch.fx graph returning a dict (a width cut of a Hugging Face encoder) returns torch's own immutable_dict,
    # which torch registers itself: a loader has it (the warning said the program could not be loaded; it loads)
    traced = torch.fx.symbolic_trace(_Nested(pair=False))
    program = torch.export.export(traced, (x,))
    assert "immutable" in repr(program.call_spec.out_spec) and foreign_output_types(program) == []


def test_saving_a_program_with_a_foreign_output_type_says_export_cannot_load_it(
        registered: object, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="minreal.export.serialize"):
        save_program(_Nested(pair=True), torch.randn(4, 3), tmp_path / "m.pt2")
    assert (tmp_path / "m.pt2").is_file()
    assert [r.getMessage() for r in caplog.records] == [
        f"m.pt2 returns {__name__}._Pair, an output type its package registers with torch on import: `minreal "
        "export` (which imports no code from a program) cannot load it; return tensors in tuples, lists or dicts "
        "(e.g. wrap a Hugging Face model to return dict(outputs), as hf:FAMILY does)"]
