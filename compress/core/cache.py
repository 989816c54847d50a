"""On-disk cache of per-layer statistics and decompositions, keyed by model, data and layer.

Entries are dicts of tensors written with ``torch.save`` and read with ``torch.load(weights_only=True)``
(no pickled objects). A key hashes everything the entry depends on, so a stale entry is never read.

Under a process group (:mod:`minreal.compress.core.distributed`) keys hash the *whole* calibration data (the statistics
passes shard it themselves), so a distributed and a single-process run share entries; only the writer (rank 0)
writes, and :func:`load_entry` is collective: an entry counts as found only when every rank can read it, so all
ranks take the same path (and meet in the same collectives).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
from torch import nn

from .distributed import all_agree, is_writer
from .inputs import Inputs, NamedInputs

__all__ = ["model_key", "data_key", "entry_key", "load_entry", "save_entry"]

log = logging.getLogger(__name__)


def _hash_tensor(h: "hashlib._Hash", t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def model_key(model: nn.Module) -> str:
    """Hash of the architecture (its repr) and every parameter and buffer."""
    h = hashlib.sha256(repr(model).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        _hash_tensor(h, t)
    return h.hexdigest()[:24]


def data_key(x: Inputs) -> str:
    """Hash of the calibration inputs (every named input, with its name, for several)."""
    h = hashlib.sha256()
    if isinstance(x, NamedInputs):
        for name, t in x.items():
            h.update(name.encode())
            _hash_tensor(h, t)
    else:
        _hash_tensor(h, x)
    return h.hexdigest()[:24]


def entry_key(*parts: object) -> str:
    """Hash of the parts that define one cache entry (model key, data key, layer name, options)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / f"{key}.pt"


def load_entry(cache_dir: str | Path | None, key: str, fields: tuple[str, ...] = ()) -> dict[str, torch.Tensor] | None:
    """The cached dict of tensors (holding every name in ``fields``), or None when absent, unreadable or of
    another shape of entry (on any rank, under a process group: every rank must call this with the same key)."""
    if cache_dir is None:
        return None
    entry = _read(_path(cache_dir, key), fields)
    return entry if all_agree(entry is not None) else None


def _read(path: Path, fields: tuple[str, ...]) -> dict[str, torch.Tensor] | None:
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, weights_only=True)
    except Exception as exc:  # a torn write, or a foreign or forged file (refused unpickling): recompute
        log.warning("ignoring unreadable cache entry %s: %s", path, str(exc).splitlines()[0] if str(exc) else exc)
        return None
    if type(entry) is not dict or not all(isinstance(v, torch.Tensor) for v in entry.values()) \
            or not set(fields) <= entry.keys():
        log.warning("ignoring cache entry %s: not a dict of tensors holding %s", path, ", ".join(fields) or "any")
        return None
    if not all(torch.isfinite(v).all() for v in entry.values() if v.is_floating_point()):
        log.warning("ignoring cache entry %s: it holds NaN/inf values (a damaged file)", path)
        return None
    return entry


def save_entry(cache_dir: str | Path | None, key: str, entry: dict[str, torch.Tensor]) -> None:
    """Write an entry atomically (temporary file, then rename); only the writer rank writes
    (:func:`~minreal.compress.core.distributed.is_writer`), other ranks return without touching the disk."""
    if cache_dir is None or not is_writer():
        return
    path = _path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(entry, tmp)
    tmp.replace(path)
