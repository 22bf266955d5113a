"""fa_sim: the FlashAttention-2 forward kernel executed on the CPU, instruction by instruction,
for every lane of every warp of every CTA; its backward pass (fa2_bwd.cu) on the PTX engine
(simulate_backward, docs/backward.md)."""

from .backward import BackwardResult, simulate_backward
from .config import KernelConfig, SmemLayout, SoftmaxForm
from .kernels import Mutation
from .problem import Problem
from .simulate import SimResult, simulate
from .timing import predict_time as _predict_time


def predict_time(*args, dtype: str | None = None, **kwargs):
    """fa_sim.timing.predict_time, with `dtype` ("fp16" or "bf16"; issue 38; None: config.dtype, else
    fp16). The timing model walks the fp16 kernel's SASS: a bf16 kernel is refused (ValueError)."""
    from .validate import dtype_name

    config = kwargs.get("config", args[6] if len(args) > 6 else None)
    run = dtype_name(dtype) if dtype is not None else (config.dtype if isinstance(config, KernelConfig) else "fp16")
    if isinstance(config, KernelConfig) and config.dtype != run:
        raise ValueError(f"config.dtype is {config.dtype!r} but dtype={run!r}; pass a config with dtype={run!r}")
    if run != "fp16":
        raise ValueError(f"predict_time does not model dtype {run!r} yet: fa_sim.timing walks the fp16 kernel's SASS "
                         "(issue 38); predict the fp16 kernel, or measure the bf16 one with fa_hw.forward")
    return _predict_time(*args, **kwargs)


__all__ = ["BackwardResult", "KernelConfig", "Mutation", "Problem", "SimResult", "SmemLayout", "SoftmaxForm",
           "predict_time", "simulate", "simulate_backward"]
