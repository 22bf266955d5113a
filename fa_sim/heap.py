"""The process heap, set up for the simulator's numpy temporaries (glibc only).

Both front ends make many short-lived arrays of a few hundred KB to a few MB per instruction or
GEMM (operand matrices, register rows of a wave, shared-memory gathers). glibc's malloc serves
blocks above its mmap threshold (128 KB at start, raised on the fly to the largest block freed
so far) with fresh mappings and trims the heap top above its trim threshold: every such array
then pays a page fault per 4 KB page on first touch - as much time as the arithmetic on it, and
more or less of it from run to run depending on which blocks happened to be freed first (the
dynamic threshold). `tune` fixes both thresholds (mallopt), so that blocks up to MMAP_THRESHOLD
come from the heap and freed memory up to TRIM_THRESHOLD stays mapped for the next array: the
same allocations, without the faults. Measured on the (1, 1, 4096, 64) seed run (CPU time):
PTX engine 2.45 -> 2.04 s, program 1.12 -> 1.07 s. Elsewhere (no glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold (64-bit)
TRIM_THRESHOLD = 256 << 20  # free heap kept mapped: well under the run's memory budget

_done = False


def tune() -> bool:
    """Set the thresholds once per process; True when glibc took them."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
