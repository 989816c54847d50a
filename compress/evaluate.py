"""Old location of :mod:`compress.core.evaluate`, kept so existing imports work; import from there."""

from .core.evaluate import *  # noqa: F401,F403
from .core.evaluate import __all__  # noqa: F401
