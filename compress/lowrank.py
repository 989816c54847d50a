"""Old location of :mod:`compress.core.lowrank`, kept so existing imports work; import from there."""

from .core.lowrank import *  # noqa: F401,F403
from .core.lowrank import __all__  # noqa: F401
