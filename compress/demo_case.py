"""Old location of :mod:`compress.core.demo_case`, kept so existing imports work; import from there."""

from .core.demo_case import *  # noqa: F401,F403
from .core.demo_case import __all__  # noqa: F401
