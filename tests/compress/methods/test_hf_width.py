"""Width methods on a Hugging Face encoder: torch.fx cannot trace its embedding and attention layers, which are kept
whole; the MLP widths are cut to the budget, and the result exports with ONNX Runtime parity (needs transformers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.wanda import WandaConfig
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity


class _Encoder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids).last_hidden_state


def test_wanda_cuts_a_bert_encoders_mlp_widths_and_keeps_attention_whole(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=32,
                                     _attn_implementation="eager")
    torch.manual_seed(0)
    model = _Encoder(transformers.BertModel(config, add_pooling_layer=False)).eval()
    data = Dataset(torch.randint(0, 100, (32, 12), generator=torch.Generator().manual_seed(0)))
    new, report = compress(model, data, "wanda", WandaConfig(mac_ratio=0.8, width_multiple=8))
    assert report.mac_ratio <= 0.8 + 1e-9 and not report.predicted.get("budget_missed")
    widths = report.predicted.group_widths
    cut = {name: kept for name, (full, kept) in widths.items() if kept < full}
    assert cut and all(".intermediate.dense" in name for name in cut)  # only the MLP widths shrink
    note = next(n for n in report.notes if n.startswith("kept whole as single layers"))
    assert "BertSelfAttention" in note and "BertEmbeddings" in note
    path = tmp_path / "bert.onnx"
    to_onnx(new, data.x[:2], path)
    parity = verify_parity(new, path, [data.x[:3], data.x[:5]])
    assert parity.passed


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_the_hubs_text_encoders_trace_for_width_methods(family: str) -> None:
    """``hf:bert`` and its kin were refused by every width method: the wrapper's ``attention_mask=None`` was traced
    as a tensor (a branch on it in the mask code), and its dict kept only ``torch.Tensor`` values, which left the
    traced graph returning nothing. Tiny configs of the hub's families: the MLP widths are groups that may shrink,
    and the graph returns what the wrapper does."""
    transformers = pytest.importorskip("transformers")
    from minreal.app.hub import HFTextEncoder
    from minreal.compress.core.width import analyse

    config = transformers.AutoConfig.for_model(family, vocab_size=100, hidden_size=32, dim=32, hidden_dim=64,
                                               num_hidden_layers=2, n_layers=2, num_attention_heads=4, n_heads=4,
                                               intermediate_size=64, max_position_embeddings=40)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = HFTextEncoder(transformers.AutoModel.from_config(config)).eval()
    ids = torch.randint(0, 100, (2, 12))
    wg = analyse(model, ids)
    assert wg.cuttable() and all(g.size == 64 for g in wg.cuttable() if "pooler" not in g.name)
    with torch.no_grad():
        want, got = model(ids), wg.gm(ids)
    assert sorted(got) == sorted(want) and all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
