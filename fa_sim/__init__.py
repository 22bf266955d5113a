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
    fp16): the bf16 build's SASS, walked along the paths of probes run with bf16 inputs."""
    import dataclasses

    from .validate import check_head_dim, config_of, dtype_name

    args = list(args)
    config = kwargs.get("config", args[6] if len(args) > 6 else None)
    if dtype is None:
        return _predict_time(*args, **kwargs)
    run = dtype_name(dtype)
    config = config_of(config)  # a tag, a KernelConfig or None (the seed at head_dim)
    if config is not None and config.dtype != run:
        raise ValueError(f"config.dtype is {config.dtype!r} but dtype={run!r}; pass a config with dtype={run!r}")
    if config is None:  # the seed config at head_dim (64 without one), in this dtype
        head_dim = kwargs.get("head_dim", args[4] if len(args) > 4 else None)
        config = KernelConfig(head_dim=64 if head_dim is None else check_head_dim(head_dim), dtype=run)
    config = dataclasses.replace(config, dtype=run)
    if len(args) > 6:
        args[6] = config
    else:
        kwargs["config"] = config
    return _predict_time(*args, **kwargs)


__all__ = ["BackwardResult", "KernelConfig", "Mutation", "Problem", "SimResult", "SmemLayout", "SoftmaxForm",
           "predict_time", "simulate", "simulate_backward"]
