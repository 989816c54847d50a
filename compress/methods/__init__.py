"""Compression methods; importing this package registers each of them."""

from . import svd  # noqa: F401
from . import ssm  # noqa: F401
from . import cbalanced  # noqa: F401
from . import factorize  # noqa: F401
from . import fde, pruning  # noqa: F401
