"""Old location of :mod:`compress.core.progress`, kept so existing imports work; import from there."""

from .core.progress import *  # noqa: F401,F403
from .core.progress import __all__  # noqa: F401
