"""The one JSON conversion of the whole tool (reports, ``--json``), without torch, onnx or onnxruntime."""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minreal.runtime_bench.atomic import atomic_path

__all__ = ["to_jsonable", "write_json"]


def to_jsonable(obj: Any) -> Any:
    """JSON-safe copy of dataclasses, paths, tuples and numpy scalars; an object with a ``to_json`` method (a
    :class:`~minreal.compress.core.report.CompressionReport`) is written as that method says."""
    if callable(getattr(obj, "to_json", None)) and not isinstance(obj, type):
        return to_jsonable(obj.to_json())
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def write_json(obj: Any, path: Path) -> None:
    """``obj`` as indented JSON (:func:`to_jsonable`), written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(to_jsonable(obj), indent=2))
