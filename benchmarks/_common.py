"""Shared output of the benchmark scripts: JSON documents and figures rendered off-screen (Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from matplotlib.figure import Figure

from runtime_bench import atomic_write_text

__all__ = ["pyplot", "save_figure", "write_json"]


def write_json(path: str | Path, document: Any, indent: int = 1) -> None:
    """Write ``document`` to ``path`` as indented JSON, atomically."""
    atomic_write_text(Path(path), json.dumps(document, indent=indent))


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the off-screen Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> None:
    """Lay ``fig`` out tightly and save it to ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
