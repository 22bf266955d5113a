"""The checks of `fa_sim.ptx.launch`'s arguments, against what a CUDA launch on SM80 accepts
(the CUDA programming guide's compute-capability 8.0 limits, fa_sim.isa.sm80): each bad argument
is one ValueError line that names it and what is accepted, raised before anything is compiled,
allocated or run.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..isa.arches import SMEM_OPT_IN_MAX_BYTES
from ..isa.sm80 import MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_THREADS_PER_CTA

OBSERVER_HOOKS = ("on_launch", "on_instr", "on_checkpoint", "on_branch", "on_finish")
SOURCE_SUFFIXES = (".cu", ".cuh", ".ptx")


def _whole(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def dim3(x, what: str, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """grid / block: an int or 1 to 3 ints, each 1 .. its SM80 limit; -> (x, y, z)."""
    accepted = (f"1 to 3 positive integers (x <= {limits[0]:,}, y <= {limits[1]:,}, z <= {limits[2]:,})")
    t = (x,) if _whole(x) else tuple(x) if isinstance(x, (tuple, list)) else None
    if t is None or not 1 <= len(t) <= 3 or not all(_whole(v) and v >= 1 for v in t):
        raise ValueError(f"{what} must be {accepted}, got {x!r}")
    t = tuple(int(v) for v in t) + (1,) * (3 - len(t))
    over = [f"{'xyz'[i]} = {v:,} > {lim:,}" for i, (v, lim) in enumerate(zip(t, limits)) if v > lim]
    if over:
        raise ValueError(f"{what} {x!r} is over SM80's limits ({', '.join(over)}); {what} must be {accepted}")
    return t


def grid_and_block(grid, block) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    g, b = dim3(grid, "grid", MAX_GRID_DIM), dim3(block, "block", MAX_BLOCK_DIM)
    if b[0] * b[1] * b[2] > MAX_THREADS_PER_CTA:
        raise ValueError(f"block {block!r} has {b[0] * b[1] * b[2]:,} threads; SM80 allows at most "
                         f"{MAX_THREADS_PER_CTA} per CTA")
    return g, b


def smem_bytes(x, static_bytes: int) -> int:
    """Dynamic shared memory per CTA: 0 .. the largest opt-in limit of the kernel's targets (sm_90's
    227 KB, fa_sim.isa.arches) less the kernel's static shared bytes. The engine runs the PTX the
    same whatever the target; which GPU can launch a config is its backend's check
    (KernelConfig.check_arch: fa_hw, the timing model's cubin)."""
    most = SMEM_OPT_IN_MAX_BYTES - static_bytes
    if not _whole(x) or not 0 <= x <= most:
        raise ValueError(f"smem_bytes must be a whole number of bytes 0 .. {most:,} (sm_90's "
                         f"{SMEM_OPT_IN_MAX_BYTES // 1024} KB of shared memory per CTA, the most of any target, less "
                         f"the kernel's {static_bytes:,} static bytes), got {x!r}")
    return int(x)


def wave_ctas(x) -> int:
    if not _whole(x) or x < 1:
        raise ValueError(f"wave_ctas must be a positive integer (CTAs simulated at once), got {x!r}")
    return int(x)


def observers(x) -> tuple:
    """One observer or a sequence of them; each implements at least one of OBSERVER_HOOKS."""
    items = (x,) if any(hasattr(x, h) for h in OBSERVER_HOOKS) else tuple(x) if isinstance(x, (tuple, list)) else None
    bad = items is None or [o for o in items if not any(callable(getattr(o, h, None)) for h in OBSERVER_HOOKS)]
    if bad:
        what = x if items is None else bad[0]
        raise ValueError(f"observers must be an observer or a list of observers (objects with any of "
                         f"{', '.join(OBSERVER_HOOKS)}), got {type(what).__name__} {what!r:.60}")
    return items


def arguments(args) -> Sequence:
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Sequence):
        raise ValueError(f"args must be a list of the kernel's arguments (numpy arrays and numbers), "
                         f"got {type(args).__name__}")
    return args


def macros(x) -> Mapping:
    if not isinstance(x, Mapping):
        raise ValueError(f"macros must be a mapping of macro names to values, got {type(x).__name__}")
    return x


def source(x) -> None:
    """A path that names no file is an error, not CUDA source: a str of one line without `{` (no
    kernel fits on such a line) or an os.PathLike must name an existing file."""
    if not isinstance(x, (str, os.PathLike)):
        raise ValueError(f"expected CUDA source, PTX text or a path, not {type(x).__name__}")
    if isinstance(x, str) and ("\n" in x or "{" in x):
        return
    try:
        exists = Path(x).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        exists = False
    if not exists:
        what = f"cannot read {x}" if isinstance(x, os.PathLike) else f"source_or_ptx {x!r:.200}"
        raise ValueError(f"{what}: no such file (pass CUDA C++ or PTX text, or the path of an existing "
                         f"{', '.join(SOURCE_SUFFIXES)} file)")
