"""Former home of the input loaders; they live in :mod:`export.app.models`, :mod:`export.app.data` and
:mod:`export.app.callables`. This module re-exports their public names so existing imports keep working."""

from export.app.callables import SpecError
from export.app.data import (BUILTIN_DATA, IMAGENET_MEAN, IMAGENET_STD, MIN_EVAL_SAMPLES, LoadedData, load_data,
                             load_dataset)
from export.app.models import check_input_shape, load_model

__all__ = ["BUILTIN_DATA", "IMAGENET_MEAN", "IMAGENET_STD", "LoadedData", "MIN_EVAL_SAMPLES", "SpecError",
           "check_input_shape", "load_data", "load_dataset", "load_model"]
