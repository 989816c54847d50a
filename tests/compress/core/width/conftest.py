"""Fixtures of the width-core tests: the model zoo (``zoo.py``, loaded by path as ``minreal_width_zoo``) and
each model built and analysed once per test module."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress.core.width import WidthGraph, analyse

if "minreal_width_zoo" not in sys.modules:  # the tests folder is not a package: load the zoo by path, once
    _spec = importlib.util.spec_from_file_location("minreal_width_zoo", Path(__file__).with_name("zoo.py"))
    sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_spec.name])

import minreal_width_zoo as zoo


@dataclass
class Analysed:
    """A zoo model, its example input (batch 2) and its width analysis."""

    model: nn.Module
    x: torch.Tensor
    wg: WidthGraph


@pytest.fixture(scope="module")
def analysed() -> Iterator[Callable[[str], Analysed]]:
    """``analysed(name)``: the zoo model ``name`` built and analysed once per test module (shared: never
    change it; apply_cuts and the helpers work on copies)."""
    cache: dict[str, Analysed] = {}

    def get(name: str) -> Analysed:
        if name not in cache:
            model, x = zoo.build(name), zoo.example(name)
            cache[name] = Analysed(model, x, analyse(model, x))
        return cache[name]

    yield get
    cache.clear()
