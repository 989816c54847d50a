"""What the benchmark scripts' tests share: whether a process has ended (``process_gone``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (no such process, or a zombie awaiting its reaper) within a few seconds."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def process_gone() -> Callable[[int], bool]:
    """Whether a process id has ended within a few seconds (read from ``/proc``: Linux)."""
    return _gone
