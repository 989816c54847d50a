"""Short import path for the SSM tools: ``from compress.ssm import hankel_regulariser``; the same names as
:mod:`compress.methods.ssm` (the ``ssm`` method's package), which stays the canonical home."""

from .methods.ssm import *  # noqa: F401,F403
from .methods.ssm import __all__  # noqa: F401
