"""A small BERT-style text classifier in plain torch, and a synthetic task it learns in seconds.

This file knows nothing about minreal (it imports only torch and numpy); minreal loads it as user code. The model
takes two inputs, ``forward(input_ids, attention_mask)``, so its data files hold one array per input, keyed by the
``forward`` parameter's name, and the labels as ``y``:

    .venv/bin/python examples/bert_encoder.py --out runs/bert      # trains (under 2 minutes on 2 cores), writes
                                                                   # bert.pt, train.npz and heldout.npz
    minreal run examples/bert_encoder.py:build --weights runs/bert/bert.pt \\
        --data runs/bert/train.npz --eval-data runs/bert/heldout.npz -m factorize --mac-ratio 0.5 \\
        --dynamic-axes input_ids:batch,seq --dynamic-axes attention_mask:batch,seq --axis-values seq=32,128 \\
        --batch 1,8

``--small`` trains :func:`small` (2 layers, width 64, sequences of 32) instead, in a few seconds (then give
``examples/bert_encoder.py:small`` and ``--axis-values seq=16,32`` to minreal).

The task (:func:`keyword_task`): every sequence starts with ``[CLS]``, holds ``classes`` keyword tokens (some of
them several times) among random filler tokens, and is padded on the right to a fixed length (``attention_mask`` is
1 on real tokens, 0 on padding); its label is the keyword that occurs most often (there is never a tie). It is
deterministic for a seed and needs no download. Chance is ``1 / classes``; both encoders reach about 98 % on
held-out sequences.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

PAD, CLS = 0, 1
"""Token ids of the padding and of ``[CLS]``; the keywords follow (2, 3, ...), then the filler tokens."""
VOCAB, CLASSES, MAX_LEN = 128, 4, 128


# ------------------------------------------------------------------------------------------------------- model
class EncoderLayer(nn.Module):
    """Self-attention and a 4x GELU MLP, each in a residual branch, with LayerNorm before each branch (pre-LN) or
    after each residual sum (post-LN, as the original BERT)."""

    def __init__(self, d: int, heads: int, norm_first: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def _attend(self, h: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0]

    def forward(self, h: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """``h`` (batch, seq, d); ``padding`` (batch, seq), True where a token is padding."""
        if self.norm_first:
            h = h + self._attend(self.norm1(h), padding)
            return h + self.mlp(self.norm2(h))
        h = self.norm1(h + self._attend(h, padding))
        return self.norm2(h + self.mlp(h))


class BertEncoder(nn.Module):
    """Token and learned position embeddings, ``layers`` encoder layers, and a classification head on the
    ``[CLS]`` token (``pool="cls"``) or on the mean of the real tokens (``pool="mean"``)."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_len: int, classes: int,
                 norm_first: bool = True, pool: str = "mean") -> None:
        super().__init__()
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {pool!r}")
        self.pool = pool
        self.tokens = nn.Embedding(vocab, d, padding_idx=PAD)
        self.positions = nn.Embedding(max_len, d)
        self.embed_norm = nn.LayerNorm(d)
        self.layers = nn.ModuleList(EncoderLayer(d, heads, norm_first) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d) if norm_first else nn.Identity()
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, classes))  # BERT's pooler, classifier
        self.apply(_bert_init)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits (batch, classes) of ``input_ids`` (batch, seq) whose ``attention_mask`` is 1 on real tokens."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.embed_norm(self.tokens(input_ids) + self.positions(positions))
        padding = attention_mask == 0
        for layer in self.layers:
            h = layer(h, padding)
        h = self.final_norm(h)
        if self.pool == "cls":
            return self.head(h[:, 0])
        keep = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp_min(1.0))


def _bert_init(module: nn.Module) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases (positions never trained stay small)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        nn.init.zeros_(module.weight[module.padding_idx])


def build(layers: int = 4, d: int = 256, heads: int = 4, vocab: int = VOCAB, max_len: int = MAX_LEN,
          classes: int = CLASSES, norm_first: bool = True, pool: str = "mean") -> BertEncoder:
    """The encoder, seeded (``examples/bert_encoder.py:build`` to minreal; load trained weights with
    ``--weights``)."""
    torch.manual_seed(0)
    return BertEncoder(vocab, d, heads, layers, max_len, classes, norm_first, pool)


def small() -> BertEncoder:
    """A 2-layer, width-64 encoder for sequences of up to 32 tokens (``examples/bert_encoder.py:small``)."""
    return build(layers=2, d=64, heads=2, max_len=32)


# -------------------------------------------------------------------------------------------------------- data
def keyword_task(samples: int, seq_len: int, classes: int = CLASSES, vocab: int = VOCAB, min_len: int = 10,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """Sequences whose label is the keyword token that occurs most often in them.

    Each sequence is ``[CLS]``, then keywords shuffled among random filler tokens, ``min_len`` to ``seq_len``
    tokens long in all (uniformly), then padding. Keywords are counted in units of one per 16 tokens (at least
    one): every other keyword occurs 0, 1 or 2 units, the winner one unit more than the most frequent of them.

    Returns:
        ``input_ids`` and ``attention_mask`` (samples, seq_len) and labels ``y`` (samples,), all int64: the
        arrays of an ``.npz`` that minreal reads (:func:`save_npz`).
    """
    if not 2 <= classes <= 7 or vocab <= CLS + 1 + classes:
        raise ValueError(f"give 2 to 7 classes and a vocabulary with filler tokens (> {CLS + 1 + classes})")
    if not 2 * classes + 2 <= min_len <= seq_len:
        raise ValueError(f"need {2 * classes + 2} <= min_len <= seq_len, got min_len {min_len}, seq_len {seq_len}")
    rng = np.random.default_rng(seed)
    ids = np.full((samples, seq_len), PAD, dtype=np.int64)
    y = rng.integers(0, classes, samples)
    for row, label in enumerate(y):
        length = rng.integers(min_len, seq_len + 1)
        unit = max(1, (length - 1) // 16)  # keywords are counted in units of 1 per 16 tokens
        counts = unit * rng.integers(0, 3, classes)
        counts[label] = 0
        counts[label] = counts.max() + unit  # the winner, by one unit or more
        keywords = np.repeat(np.arange(classes) + CLS + 1, counts)
        fillers = rng.integers(CLS + 1 + classes, vocab, length - 1 - len(keywords))
        ids[row, 0] = CLS
        ids[row, 1:length] = rng.permutation(np.concatenate([keywords, fillers]))
    return {"input_ids": ids, "attention_mask": (ids != PAD).astype(np.int64), "y": y.astype(np.int64)}


def save_npz(path: str | Path, task: dict[str, np.ndarray]) -> Path:
    """Write ``task`` as an ``.npz`` keyed by input name (``input_ids``, ``attention_mask``) and ``y``."""
    np.savez(path, **task)
    return Path(path)


def _tensors(task: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.from_numpy(task["input_ids"]), torch.from_numpy(task["attention_mask"]), torch.from_numpy(task["y"])


# ---------------------------------------------------------------------------------------------------- training
@torch.no_grad()
def accuracy(model: nn.Module, task: dict[str, np.ndarray], batch_size: int = 256) -> float:
    """Share of ``task``'s sequences whose label ``model`` predicts (eval mode)."""
    model.eval()
    ids, mask, y = _tensors(task)
    hits = sum(int((model(ids[i:i + batch_size], mask[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum())
               for i in range(0, len(y), batch_size))
    return hits / len(y)


def train(model: nn.Module, task: dict[str, np.ndarray], epochs: int = 2, lr: float = 1e-3, batch_size: int = 16,
          seed: int = 0) -> nn.Module:
    """Cross-entropy training with AdamW and a one-cycle schedule (warm-up, then cosine decay); returns ``model``
    in eval mode. Batches hold sequences of similar length, cut to the longest of them (the padding is on the
    right, so the cut changes nothing but the time a step takes)."""
    torch.manual_seed(seed)
    ids, mask, y = _tensors(task)
    lengths = mask.sum(1)
    steps_per_epoch = math.ceil(len(y) / batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * steps_per_epoch, pct_start=0.1)
    model.train()
    for _ in range(epochs):
        for batch in _similar_length_batches(lengths, batch_size):
            length = int(lengths[batch].max())
            loss = F.cross_entropy(model(ids[batch, :length], mask[batch, :length]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    return model.eval()


def _similar_length_batches(lengths: torch.Tensor, batch_size: int, pool: int = 16) -> list[torch.Tensor]:
    """Random batches of similar length: a shuffle, sorted by length within pools of ``pool`` batches, split into
    batches, which are shuffled again."""
    order = torch.randperm(len(lengths))
    batches = [b for p in order.split(pool * batch_size) for b in p[lengths[p].argsort()].split(batch_size)]
    return [batches[i] for i in torch.randperm(len(batches))]


# -------------------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bert"), help="Folder for bert.pt, train.npz, heldout.npz.")
    ap.add_argument("--small", action="store_true", help="Train small() on sequences of 32 instead of build().")
    ap.add_argument("--samples", type=int, default=1024, help="Training sequences.")
    ap.add_argument("--epochs", type=int, help="Training epochs (default 3 with --small, else 2).")
    args = ap.parse_args()
    seq_len = 32 if args.small else MAX_LEN
    model = small() if args.small else build()
    fit, held_out = keyword_task(args.samples, seq_len, seed=0), keyword_task(512, seq_len, seed=1)
    train(model, fit, epochs=args.epochs or (3 if args.small else 2))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "bert.pt")
    save_npz(args.out / "train.npz", fit)
    save_npz(args.out / "heldout.npz", held_out)
    print(f"wrote {args.out}/bert.pt, train.npz, heldout.npz: held-out accuracy {100 * accuracy(model, held_out):.1f} %"
          f" (chance {100 / CLASSES:.0f} %)")


if __name__ == "__main__":
    main()
