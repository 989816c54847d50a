"""Old location of :mod:`compress.core.allocate`, kept so existing imports work; import from there."""

from .core.allocate import *  # noqa: F401,F403
from .core.allocate import __all__  # noqa: F401
