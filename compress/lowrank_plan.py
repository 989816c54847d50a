"""Old location of :mod:`compress.core.lowrank_plan`, kept so existing imports work; import from there."""

from .core.lowrank_plan import *  # noqa: F401,F403
from .core.lowrank_plan import __all__  # noqa: F401
