"""Errors a simulated kernel raises where the hardware would fault or hang.

`KernelFault` is what a CUDA launch reports as an illegal or misaligned address, a barrier that
not all threads reach, or a warp-collective instruction executed by a diverged warp: the kernel is
wrong, the simulator says where (instruction, CTA, warp, lane, address, source line) and stops.
"""

from __future__ import annotations


class KernelFault(RuntimeError):
    """The simulated kernel did something the hardware faults or hangs on."""
