"""fa_sim: the FlashAttention-2 forward kernel executed on the CPU, instruction by instruction,
for every lane of every warp of every CTA."""

from .config import KernelConfig, SmemLayout, SoftmaxForm
from .kernels import Mutation
from .problem import Problem
from .simulate import SimResult, simulate
from .timing import predict_time

__all__ = ["KernelConfig", "Mutation", "Problem", "SimResult", "SmemLayout", "SoftmaxForm", "predict_time", "simulate"]
