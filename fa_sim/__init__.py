"""fa_sim: the FlashAttention-2 forward kernel executed on the CPU, instruction by instruction,
for every lane of every warp of every CTA."""

from .config import KernelConfig, SmemLayout
from .kernels import Mutation
from .simulate import SimResult, simulate

__all__ = ["KernelConfig", "Mutation", "SimResult", "SmemLayout", "simulate"]
