"""Old location of :mod:`compress.core.data`, kept so existing imports work; import from there."""

from .core.data import *  # noqa: F401,F403
from .core.data import __all__  # noqa: F401
