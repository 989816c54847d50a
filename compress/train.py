"""Old location of :mod:`compress.core.train`, kept so existing imports work; import from there."""

from .core.train import *  # noqa: F401,F403
from .core.train import __all__  # noqa: F401
