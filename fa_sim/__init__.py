"""fa_sim: the FlashAttention-2 forward kernel executed on the CPU, instruction by instruction,
for every lane of every warp of every CTA."""

from .config import KernelConfig, SmemLayout

__all__ = ["KernelConfig", "SmemLayout"]
