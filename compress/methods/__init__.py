"""Compression methods; importing this package registers each of them."""

from . import svd  # noqa: F401
