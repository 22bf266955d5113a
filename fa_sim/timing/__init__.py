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
(`predict_launch`: any kernel the PTX engine runs, one CTA per declared path class on the engine, the
busiest SM timed), `backward`
(`predict_backward`: the backward pass's three launches, each through predict_launch), `launches`
(`predict`: a dense launch from the probes of `predict`, or as one launch through predict_launch where
they cannot follow the build; `predict_varlen`, `predict_splitkv`: a packed batch's launch and split-KV's
two, likewise);
`pool` (a cold prediction's independent pieces over a few forked worker processes).
"""

from .gpus import GPUS, GpuModel, gpu_model
from .backward import BackwardPrediction, predict_backward, predict_backward_seeded
from .launch import predict_launch
from .launches import LaunchesPrediction, predict, predict_splitkv, predict_varlen
from .predict import Prediction


def predict_time(batch: int | None, heads: int, seqlen_q: int | None, seqlen_k: int | None = None,
                 head_dim: int | None = None, causal: bool = False, config=None, gpu: str = "h200", kernel=None, *,
                 heads_k: int | None = None, window: tuple[int, int] | None = None, softcap: float | None = None,
                 cu_seqlens_q=None, cu_seqlens_k=None, splits: int | str | None = None,
                 cache_seqlens=None, pack_gqa: bool | None = None) -> Prediction | LaunchesPrediction:
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
    naming it and what is accepted.

    The two features that are more than one plain launch return a LaunchesPrediction (kernel_ms the
    launches' sum, each launch's Prediction under kernels; fa_sim/timing/launches.py):
    - cu_seqlens_q, cu_seqlens_k (int32, batch + 1 offsets, as fa_sim.simulate takes them): a packed
      batch, one launch of the FA_VARLEN build; batch and seqlen_q / seqlen_k (FlashAttention-2's
      max_seqlen_q / _k) may be None, else they must be the offsets' batch and longest lengths.
    - splits (1 .. the cache's K/V tiles, or "auto") and cache_seqlens (int32 [batch], each 1 ..
      seqlen_k; None: all): split-KV decoding, the split launch and the combine launch; "auto" is
      the simulator's choice (fa_sim.splitkv.check_splitkv with its num_sms default, 132 SMs);
      pack_gqa (None: decide, True, False) as fa_sim.simulate takes it: the Q heads of a K/V head
      run as one head of g * Nq rows (notes["pack_gqa"] says whether they did).
    Neither takes kernel=; split-KV takes no causal mask or window (as fa_sim.simulate)."""
    from .. import validate
    from ..contract import kernel_source
    from ..problem import Problem

    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    split = splits is not None or cache_seqlens is not None
    if packed and split:
        raise ValueError("split-KV decoding (splits= / cache_seqlens=) takes a padded batch, not a packed one "
                         "(cu_seqlens_q / cu_seqlens_k): both use the kernel's grid z")
    if (packed or split) and kernel is not None:
        raise ValueError(f"{'a packed batch (cu_seqlens)' if packed else 'split-KV decoding (splits=)'} is timed on "
                         "fa2_fwd.cu's own build, as the simulator runs it: pass kernel=None")
    if pack_gqa is not None and not split:
        raise ValueError("pack_gqa applies to split-KV decoding: pass splits= or cache_seqlens= with it")
    if packed:
        return _predict_packed(batch, heads, seqlen_q, seqlen_k, head_dim, causal, config, gpu, heads_k, window,
                               softcap, cu_seqlens_q, cu_seqlens_k)
    for value, name in ((batch, "batch"), (seqlen_q, "seqlen_q")):
        if value is None:
            raise ValueError(f"{name} must be an integer >= 1 (None only with cu_seqlens_q / cu_seqlens_k, whose "
                             "offsets give it)")

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
    if split:
        from ..splitkv import check_splitkv

        prob = validate.check_launch(Problem(b, h, nq, nk, causal, validate.check_scale(None, d),
                                             validate.check_config(config, d), heads_k=heads_k, window=window,
                                             softcap=softcap))
        return predict_splitkv(check_splitkv(prob, 1 if splits is None else splits, cache_seqlens,
                                             pack_gqa=pack_gqa), gpu)
    prob = validate.check_launch(Problem(b, h, nq, nk, causal, 1.0, validate.check_config(config, d), heads_k=heads_k,
                                         window=window, softcap=softcap))
    return predict(prob, gpu, kernel)


def _predict_packed(batch, heads, seqlen_q, seqlen_k, head_dim, causal, config, gpu, heads_k, window, softcap,
                    cu_seqlens_q, cu_seqlens_k) -> LaunchesPrediction:
    """predict_time's packed batch: the problem fa_sim.simulate makes of these offsets, timed."""
    from .. import validate
    from ..varlen import _host_ints, make_varlen_problem

    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k (int32, batch + 1 offsets)")
    h = validate.check_count(heads, "heads")
    hk = h if heads_k is None else validate.check_count(heads_k, "heads_k")
    gpu = gpu_model(gpu)
    config = validate.config_of(config)
    d = (64 if config is None else config.head_dim) if head_dim is None else validate.check_head_dim(head_dim)
    if config is not None and config.head_dim != d:
        raise ValueError(f"head_dim {d} disagrees with config.head_dim {config.head_dim}; give one of them")
    totals = []
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        a = _host_ints(cu, name)
        totals.append(int(a[-1]) if a.ndim == 1 and len(a) and a.dtype.kind in "iu" else 0)
    shapes = [(1, h, totals[0], d), (1, hk, totals[1], d), (1, hk, totals[1], d)]
    prob = make_varlen_problem(*shapes, cu_seqlens_q, cu_seqlens_k, causal, None, config, window, softcap,
                               dtype=None if config is None else config.dtype)
    for given, have, name in ((batch, prob.batch, "batch"), (seqlen_q, prob.seqlen_q, "seqlen_q"),
                              (seqlen_k, prob.seqlen_k, "seqlen_k")):
        if given is not None and given != have:
            raise ValueError(f"{name} = {given!r:.40} disagrees with the offsets, whose {name} is {have} (batch: "
                             "len(cu_seqlens) - 1; seqlen_q / seqlen_k: the longest sequence); pass None or that")
    return predict_varlen(prob, gpu)


__all__ = ["GPUS", "BackwardPrediction", "GpuModel", "LaunchesPrediction", "Prediction", "predict", "predict_backward",
           "predict_backward_seeded", "predict_launch", "predict_splitkv", "predict_time", "predict_varlen"]
