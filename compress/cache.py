"""Old location of :mod:`compress.core.cache`, kept so existing imports work; import from there."""

from .core.cache import *  # noqa: F401,F403
from .core.cache import __all__  # noqa: F401
