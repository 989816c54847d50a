"""Hand memory that Python and torch have freed back to the operating system.

glibc's allocator keeps freed memory for reuse: after its first large free it raises its mmap threshold
(dynamically, up to 32 MiB), so the many same-sized statistics and bases of a model (BERT-base: 73 float64
768 × 768 matrices) come from the heap, and a phase that frees them leaves the process's resident set where its
peak was. The next phase (decompositions, building the factorised copy, the export) then starts from that peak
instead of from what is alive. :func:`release_freed_memory` asks glibc to return free heap pages
(``malloc_trim(0)``) between phases; measured on BERT-base factorize (``benchmarks/zoo_cost.py --goals``), it
keeps the peak near what is alive. Stdlib only; a no-op where the C library has no ``malloc_trim`` (macOS, musl,
Windows).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim():  # -> ctypes function or None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system (glibc ``malloc_trim(0)``); True when it could run.

    Costs a walk over the heap's free lists (milliseconds); call it between phases that free large temporaries,
    never in a loop.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
