"""fa_sim: the FlashAttention-2 forward kernel executed on the CPU, instruction by instruction,
for every lane of every warp of every CTA; its backward pass (fa2_bwd.cu) on the PTX engine
(simulate_backward, docs/backward.md)."""

from .backward import BackwardResult, simulate_backward
from .config import KernelConfig, SmemLayout, SoftmaxForm
from .kernels import Mutation
from .problem import Problem
from .simulate import SimResult, simulate
from .timing import predict_time

__all__ = ["BackwardResult", "KernelConfig", "Mutation", "Problem", "SimResult", "SmemLayout", "SoftmaxForm",
           "predict_time", "simulate", "simulate_backward"]
