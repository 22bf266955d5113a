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
(`predict_launch`: any kernel the PTX engine runs, every CTA of the busiest SM timed).
"""

from .gpus import GPUS, GpuModel
from .launch import predict_launch
from .predict import Prediction, predict


def predict_time(batch: int, heads: int, seqlen_q: int, seqlen_k: int | None = None, head_dim: int = 64,
                 causal: bool = False, config=None, gpu: str = "h200", kernel=None) -> Prediction:
    """The predicted time of one launch of the kernel for q [B, H, Nq, d], k, v [B, H, Nk, d];
    `config` None: the seed config at this head_dim; `kernel`: a variant's path."""
    from ..config import KernelConfig
    from ..problem import Problem

    if gpu not in GPUS:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    config = KernelConfig(head_dim=head_dim) if config is None else config
    if config.head_dim != head_dim and head_dim != 64:
        raise ValueError(f"head_dim {head_dim} disagrees with config.head_dim {config.head_dim}")
    prob = Problem(batch, heads, seqlen_q, seqlen_q if seqlen_k is None else seqlen_k, causal, 1.0, config)
    return predict(prob, gpu, kernel)


__all__ = ["GPUS", "GpuModel", "Prediction", "predict", "predict_launch", "predict_time"]
