"""How the C allocator treats freed memory: kept for the next allocation, not handed back to the kernel.

A planning call or a training step allocates and frees the same megabyte-sized tensors thousands of times.
With glibc's defaults the freed top of the heap is returned to the kernel once it passes a small threshold,
so the next allocation of the same size takes a fresh page fault per 4 KiB page: on a 2-core AMD EPYC that
was 12% of a TD-MPC planning call of 50 envs (docs/tdmpc.md). `keep_freed_memory` raises the two thresholds
involved, as `MALLOC_TRIM_THRESHOLD_` and `MALLOC_MMAP_THRESHOLD_` would, which PyTorch's CPU tuning guide
achieves by preloading another allocator. The cost is up to `TRIM_THRESHOLD` bytes of freed memory a
process keeps mapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Allocations below this come from the heap, whose freed chunks are reused; above it, from mmap (released on
# free). 32 MiB is the ceiling glibc's own adaptive threshold reaches on 64-bit systems.
MMAP_THRESHOLD = 32 << 20
# Freed memory at the top of the heap is returned to the kernel only beyond this.
TRIM_THRESHOLD = 128 << 20


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds (`TRIM_THRESHOLD`, `MMAP_THRESHOLD`) for this process.

    Returns whether they were set: False off Linux or where the C library is not glibc (nothing changes). What
    the program computes is unchanged; only how often freed memory is handed back to the kernel.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Setting either threshold turns off glibc's adaptive one, so both are set (mallopt returns 1 on success).
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
