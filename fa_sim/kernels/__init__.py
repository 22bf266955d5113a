"""Kernel programs for the simulated machine (fa2_fwd: the FlashAttention-2 forward pass)."""

from ..problem import Problem  # the public type; re-exported for the kernel programs
from .fa2_fwd import NO_MUTATION, Mutation, flash_fwd, wave_order

__all__ = ["Mutation", "NO_MUTATION", "Problem", "flash_fwd", "wave_order"]
