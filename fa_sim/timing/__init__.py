"""Time: how long the kernel runs on a GPU, predicted without one, and why.

    fa_sim.predict_time(4, 16, 2048, head_dim=64)            # -> Prediction (kernel_ms, limiter, stalls)
    fa time --batch 4 --heads 16 --seqlen 2048              # the same from the command line

Modules, bottom to top: `sass` (the cubin's SASS with the scheduling control information ptxas
writes into every instruction), `paths` (basic blocks, the K/V loop, every path through a
region), `stream` (the path each region takes, from the functional run on the PTX engine; `oracle`
keeps the config-derived choice for the tests), `program` (an instruction as the SM model sees it), `sm` (one SM cycle by cycle), `gpus` (the
parameters per GPU), `cost` (what a prediction costs this machine: checked up front, progress
while it runs), `predict` (occupancy, representative CTAs, dispatch over the SMs); `walk` (each
warp's SASS stream from its path in the functional run: any control flow) and `launch`
(`predict_launch`: any kernel the PTX engine runs, every CTA of the busiest SM timed), `backward`
(`predict_backward`: the backward pass's three launches, each through predict_launch).
"""

from .gpus import GPUS, GpuModel, gpu_model
from .backward import BackwardPrediction, predict_backward
from .launch import predict_launch
from .predict import Prediction, predict


def predict_time(batch: int, heads: int, seqlen_q: int, seqlen_k: int | None = None, head_dim: int | None = None,
                 causal: bool = False, config=None, gpu: str = "h200", kernel=None, *, heads_k: int | None = None,
                 window: tuple[int, int] | None = None, softcap: float | None = None) -> Prediction:
    """The predicted time of one launch of the kernel for q [B, H, Nq, d], k, v [B, H_k, Nk, d].

    batch, heads, seqlen_q, seqlen_k (None: seqlen_q), head_dim: integers >= 1 (Python or numpy,
    never bool); head_dim one of config.HEAD_DIMS, None: the config's (64 without a config).
    causal: True or False. config: None (the seed config at head_dim), a KernelConfig or a config
    tag ('m128n64d64w4-swizzled-s2'); 'auto' is fa_hw's (it needs the GPU). gpu: a key of GPUS
    or a GpuModel.
    kernel: None or a variant's path (a .cu, or a .patch against fa2_fwd.cu). heads_k (None: heads),
    window=(left, right), softcap: issue 38's features as fa_sim.Problem takes them (docs/features.md);
    a bf16 kernel is config.dtype (fa_sim.predict_time's dtype=). Every argument is
    checked as fa_sim.simulate checks its own (fa_sim.validate), before any compile: one ValueError
    naming it and what is accepted."""
    from .. import validate
    from ..contract import kernel_source
    from ..problem import Problem

    b, h, nq = (validate.check_count(v, n) for v, n in ((batch, "batch"), (heads, "heads"), (seqlen_q, "seqlen_q")))
    nk = nq if seqlen_k is None else validate.check_count(seqlen_k, "seqlen_k")
    causal = validate.check_causal(causal)
    gpu = gpu_model(gpu)
    config = validate.config_of(config)
    d = (64 if config is None else config.head_dim) if head_dim is None else validate.check_head_dim(head_dim)
    if config is not None and config.head_dim != d:
        raise ValueError(f"head_dim {d} disagrees with config.head_dim {config.head_dim}; give one of them")
    if kernel is not None:
        kernel_source(kernel, option="kernel=")  # the file's checks (it exists, a .cu or a patch that applies)
    prob = validate.check_launch(Problem(b, h, nq, nk, causal, 1.0, validate.check_config(config, d), heads_k=heads_k,
                                         window=window, softcap=softcap))
    return predict(prob, gpu, kernel)


__all__ = ["GPUS", "BackwardPrediction", "GpuModel", "Prediction", "predict", "predict_backward", "predict_launch", "predict_time"]
