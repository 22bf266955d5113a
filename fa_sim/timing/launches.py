"""The predicted time of the forward launches that are not the probe model's (fa_sim.timing.predict):
packed variable-length batches (fa_sim.varlen), split-KV decoding (fa_sim.splitkv) and a dense
launch whose build the probes cannot follow, each launch timed by `predict_launch` like the
backward's (fa_sim/timing/backward.py).

    pred = fa_sim.timing.predict_splitkv(plan)          # a fa_sim.splitkv.SplitPlan
    pred = fa_sim.timing.predict_varlen(problem)         # a packed fa_sim.Problem (make_varlen_problem)
    pred.kernel_ms, pred.kernels["fa2_combine_kernel"].limiter
    pred = predict_dense(problem, "h200", kernel, why)   # fa_sim.timing.predict's way past a StreamMismatch

`predict_dense`: fa_sim.timing.predict times a dense launch from probes of a few rounds
(fa_sim.timing.stream), which assume the kernel's shape: one K/V loop whose rounds repeat, masked
rounds that branch like the probe's, a window build that compiles like its wide twin. Where a build
breaks one of those (a StreamMismatch: an edit that rolls a loop or repeats work in a way the probes
cannot count, a window with a side of 0), predict times the same launch as any launch instead: the
build with the problem's features, grid (Q blocks, B x H), one representative CTA per Q block on
the PTX engine (grid y, the batch-head, changes no path: the mask and the rounds depend on the Q
block alone), every warp's own path walked through the build's SASS, the busiest SM timed. Slower
cold than the probes on long sequences (every Q block's whole loop runs once on the engine), and
nothing in it assumes the kernel's shape.

The launches are the simulator's: split-KV's are fa_sim.splitkv.splitkv_launches (fa2_fwd.cu built
with FA_SPLITKV on grid (Q blocks, B*H, splits), then fa2_combine.cu when splits > 1); a packed batch
is one launch of the FA_VARLEN build on the grid (Q blocks of the longest sequence, H, B), whose CTAs
past a sequence's own Q blocks exit at once (walked and timed as the short paths they are). Each
launch runs functionally on the PTX engine on seeded standard-normal inputs (the values do not
change the paths), every warp's path is walked through the launch's SASS and the busiest SM is timed
cycle by cycle (predict_launch); the prediction is the sum of the launches' times.

One CTA per path class runs on the engine (KernelLaunch.uniform_axes: grid y, the heads, where the
sequences share a length) and the busiest SM is timed in memoized chunks (predict_launch), yet the
cost still grows with the problem: `check_size` refuses, before any work, a launch whose busiest SM is estimated past
predict_launch's MAX_SM_INSTRUCTIONS warp instructions or whose engine run is estimated past
cost.MAX_SECONDS, in one line naming the limit in K/V rounds.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np

from .cost import MAX_SECONDS
from .gpus import GpuModel, gpu_model
from .launch import MAX_SM_INSTRUCTIONS, predict_launch
from .predict import Prediction, predict_probed
from .stream import StreamMismatch

# Warp instructions of one CTA-round (one K/V tile of one CTA) of fa2_fwd.cu, per 64 x 64 tile:
# ROUND_BASE + ROUND_PER_D * head_dim (fitted on the seed tiles at head_dim 32-256 with predict_launch:
# 1448, 1720, 2392, 3700), scaled by block_m * block_n / 4096; a CTA's setup and epilogue about
# SETUP_ROUNDS rounds' worth. An estimate for the up-front refusal only: predict_launch counts exactly.
ROUND_BASE, ROUND_PER_D, SETUP_ROUNDS = 1100, 10.5, 1.3


@dataclass(frozen=True)
class LaunchesPrediction:
    """The launches of one forward feature, in order, and their summed time."""

    kernel_ms: float  # the launches one after the other
    kernels: dict = field(default_factory=dict)  # kernel name -> Prediction, in launch order
    feature: str = ""  # "split-KV" or "packed"
    notes: dict = field(default_factory=dict)  # the feature's numbers (splits, working CTAs, ...)

    def to_json(self) -> dict:
        return {"kernel_ms": self.kernel_ms, "feature": self.feature, **self.notes,
                "kernels": {name: p.to_json() for name, p in self.kernels.items()}}


def round_instructions(config) -> float:
    """Estimated warp instructions of one CTA-round of fa2_fwd.cu with this config."""
    return (ROUND_BASE + ROUND_PER_D * config.head_dim) * config.block_m * config.block_n / 4096


def check_size(config, cta_rounds: np.ndarray, gpu: GpuModel, what: str, fix: str) -> None:
    """ValueError (one line) when the CTAs' K/V rounds (`cta_rounds`, in launch order, CTA i on SM
    i mod the SM count as predict_launch dispatches them) put the busiest SM past MAX_SM_INSTRUCTIONS
    estimated warp instructions, or the engine's run of them all past MAX_SECONDS (fa_sim.estimate's
    rate per CTA-round)."""
    from ..estimate import estimate
    from ..problem import Problem

    per = round_instructions(config)
    rounds = np.asarray(cta_rounds, np.int64) + SETUP_ROUNDS
    sms = min(gpu.sms, len(rounds))
    pad = -len(rounds) % sms
    busiest = float(np.concatenate([rounds, np.zeros(pad)]).reshape(-1, sms).sum(axis=0).max())
    limit = int(MAX_SM_INSTRUCTIONS / per)
    if busiest * per > MAX_SM_INSTRUCTIONS:
        raise ValueError(f"{what}: its busiest SM of the {gpu.name} runs about {busiest:,.0f} CTA K/V rounds (about "
                         f"{busiest * per:,.0f} warp instructions), past the {limit:,} rounds ({MAX_SM_INSTRUCTIONS:,} "
                         f"warp instructions) the cycle-by-cycle SM model takes; {fix}")
    seconds = estimate(Problem(1, 1, config.block_m, config.block_n, False, 1.0, config)).sim_seconds
    total = float(rounds.sum())
    if total * seconds > MAX_SECONDS:
        raise ValueError(f"{what}: its {total:,.0f} CTA K/V rounds would run on the PTX engine for about "
                         f"{total * seconds / 60:,.0f} min, past the {MAX_SECONDS / 60:.0f} min the timing model "
                         f"allows (at most about {int(MAX_SECONDS / seconds):,} CTA K/V rounds); {fix}")


def _host_inputs(shapes, dtype: str, seed: int):
    """Seeded standard-normal q, k, v of these shapes as the kernel's 16-bit host arrays."""
    from ..validate import check_input, round_to_bf16

    rng = np.random.default_rng(seed)
    draw = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    if dtype == "bf16":
        draw = [round_to_bf16(x) for x in draw]
    return [check_input(x, n).host_half(dtype) for x, n in zip(draw, ("q", "k", "v"))]


def predict(prob, gpu: GpuModel | str = "h200", kernel=None, exact: bool = False, ctas_per_sm: int | None = None,
            progress: bool | None = None) -> Prediction:
    """The kernel time of the dense launch `prob` on `gpu` (fa_sim.timing.predict): from the probes
    (predict.predict_probed, whose docstring says what each argument takes and what is refused), or,
    where they cannot follow the build (a StreamMismatch), as any launch (predict_dense, the module
    docstring), with a line on stderr unless `progress` is False. `exact` and `ctas_per_sm` need the
    probes: with them a StreamMismatch stays an error."""
    try:
        return predict_probed(prob, gpu, kernel, exact, ctas_per_sm, progress)
    except StreamMismatch as why:
        if exact or ctas_per_sm is not None:
            raise StreamMismatch(f"{why}; exact= and ctas_per_sm= need the probe model (without them the launch is "
                                 "timed as any launch)") from None
        if progress is not False:
            print(f"fa_sim.timing: {why}; timed as any launch instead (fa_sim.timing.predict_launch)", file=sys.stderr,
                  flush=True)
        return predict_dense(prob, gpu, kernel, str(why))


def _seeded_first(shape, dtype: str, rng) -> np.ndarray:
    """A 16-bit host array of `shape` ([B, H, N, d]) whose first batch-head holds SEED_TILE seeded
    standard-normal draws, repeated, and the rest zeros (backward.first_head, the backward's rule)."""
    from ..isa.convert import f32_to_bf16_rn
    from .backward import SEED_TILE, first_head

    x = rng.standard_normal(SEED_TILE).astype(np.float32)
    return first_head(shape, f32_to_bf16_rn(x) if dtype == "bf16" else x.astype(np.float16))


def predict_dense(prob, gpu: GpuModel | str = "h200", kernel=None, why: str = "", seed: int = 0) -> Prediction:
    """The predicted time of the dense launch of `prob` (not packed) timed as any launch (the module
    docstring): the build KernelBuild.of(prob) of fa2_fwd.cu or the variant `kernel`, on seeded inputs.
    `why`: what made the probe model give way (kept in the notes and printed by `fa time`)."""
    from ..contract import KernelBuild, kernel_source
    from ..contract.source import KERNEL_NAME

    if prob.varlen:
        raise ValueError("predict_dense takes a dense problem; a packed one: predict_varlen")
    gpu = gpu_model(gpu)
    cfg = prob.config
    # launch order (heavy_first reverses it); predict_launch checks the engine's cost from these estimates before
    # any work and the SM model's from the walks (its steady state skips a loop's repeats, which check_size's
    # count of every instruction cannot see)
    rounds = prob.rounds_per_cta(np.arange(prob.n_ctas))
    rng = np.random.default_rng(seed)
    b, h, hk, d = prob.batch, prob.heads, prob.heads_k, prob.head_dim
    q = _seeded_first((b, h, prob.seqlen_q, d), cfg.dtype, rng)
    k, v = (_seeded_first((b, hk, prob.seqlen_k, d), cfg.dtype, rng) for _ in range(2))
    o, lse = np.zeros(q.shape, np.uint16), np.zeros((b, h, prob.seqlen_q), np.float32)
    args = [q, k, v, o, lse, np.int32(prob.seqlen_q), np.int32(prob.seqlen_k), np.float32(prob.scale)]
    src = kernel_source(kernel)
    per_cta = (rounds + SETUP_ROUNDS) * round_instructions(cfg)
    pred = predict_launch(src.text, prob.launch_grid, (cfg.n_threads, 1, 1), args, cfg.smem_bytes, gpu,
                          kernel=KERNEL_NAME, macros=KernelBuild.of(prob, gpu.arch).macros(), name=str(src.origin),
                          uniform_axes=(1,), args_key=f"predict_dense:v1:{seed}:{cfg.dtype}:{q.shape}:{k.shape}",
                          copy_args=False, cta_instructions=per_cta)
    ms = pred.kernel_ms
    launch = (f"{prob.n_ctas:,} CTAs, {pred.occupancy} per SM, timed as any launch (fa_sim.timing.predict_launch: "
              "the busiest SM, one engine run per Q block)")
    return dataclasses.replace(pred, tflops=prob.flops / (ms * 1e-3) / 1e12,
                               notes={**pred.notes, "launch": launch, "timed_as": "launch", "why": why})


def splitkv_cta_rounds(plan) -> np.ndarray:
    """K/V rounds of each CTA of the split launch, in launch order (x Q block, y B*H, z split)."""
    p = plan.problem
    per_seq = plan.split_rounds()  # [B, splits]
    r = np.repeat(per_seq, p.heads, axis=0)  # [B*H, splits]
    return np.broadcast_to(r.T[:, :, None], (plan.splits, p.batch * p.heads, p.n_m_blocks)).reshape(-1)


def varlen_cta_rounds(prob) -> np.ndarray:
    """K/V rounds of each CTA of a packed launch, in launch order (x Q block, y head, z sequence):
    0 for the CTAs past a sequence's own Q blocks (they exit at once)."""
    out = np.zeros((prob.batch, prob.heads, prob.n_m_blocks), np.int64)
    for b in range(prob.batch):
        if prob.seqlens_q[b]:
            seq = prob.sequence(b)
            out[b, :, :seq.n_m_blocks] = seq.n_rounds_of(np.arange(seq.n_m_blocks))
    return out.reshape(-1)


def predict_splitkv(plan, gpu: GpuModel | str = "h200", seed: int = 0) -> LaunchesPrediction:
    """The predicted time of split-KV decoding (a checked fa_sim.splitkv.SplitPlan): the split launch
    and, with more than one split, the combine launch."""
    from ..splitkv import splitkv_launches

    gpu = gpu_model(gpu)
    p = plan.problem
    check_size(p.config, splitkv_cta_rounds(plan), gpu, f"split-KV decoding of (B, H, Nq, Nk) = ({p.batch}, "
               f"{p.heads}, {p.seqlen_q}, {p.seqlen_k}) with {plan.splits} splits", "lower the batch, the heads or the cache length")
    q, k, v = _host_inputs([(p.batch, p.heads, p.seqlen_q, p.head_dim)] + 2 * [(p.batch, p.heads_k, p.seqlen_k,
                                                                               p.head_dim)], p.config.dtype, seed)
    kernels = {}
    for launch in splitkv_launches(plan, q, k, v)[0]:
        kernels[launch.kernel] = predict_launch(launch.source, launch.grid, launch.block, launch.args,
                                                launch.smem_bytes, gpu, kernel=launch.kernel, macros=launch.macros,
                                                uniform_axes=launch.uniform_axes,
                                                cta_instructions=launch.cta_instructions)
    notes = {"splits": plan.splits, "splits_auto": plan.auto_from is not None, "split_grid": list(plan.grid),
             "kv_tiles_per_split": plan.blocks_per_split, "cache_seqlens": [int(x) for x in plan.cache_seqlens],
             "pack_gqa": plan.unpacked is not None}  # the Q heads of a K/V head ran as one (fa_sim.splitkv)
    return LaunchesPrediction(float(sum(x.kernel_ms for x in kernels.values())), kernels, "split-KV", notes)


def predict_varlen(prob, gpu: GpuModel | str = "h200", seed: int = 0) -> LaunchesPrediction:
    """The predicted time of a packed batch (a fa_sim.Problem with cu_seqlens: varlen.make_varlen_problem):
    one launch of the FA_VARLEN build on its grid (Q blocks of the longest sequence, H, B)."""
    from ..contract import KernelBuild
    from ..contract.source import KERNEL_NAME, SEED_PATH

    if not prob.varlen:
        raise ValueError("predict_varlen takes a packed problem (cu_seqlens: fa_sim.varlen.make_varlen_problem)")
    gpu = gpu_model(gpu)
    rounds = varlen_cta_rounds(prob)
    lens = ",".join(str(int(n)) for n in prob.seqlens_q)
    check_size(prob.config, rounds, gpu, f"the packed batch of query lengths {lens:.60} and {prob.heads} heads",
               "lower the lengths or the heads")
    cfg, h, d = prob.config, prob.heads, prob.head_dim
    q, k, v = (x[0] for x in _host_inputs([(1, h, prob.total_q, d)] + 2 * [(1, prob.heads_k, prob.total_k, d)],
                                          cfg.dtype, seed))  # head-major [H, total, d] (fa_sim.varlen)
    o, lse = np.zeros((h, prob.total_q, d), np.uint16), np.zeros((h, prob.total_q), np.float32)
    cu_q, cu_k = (np.array(cu, np.int32) for cu in prob.cu_seqlens)
    args = [q, k, v, o, lse, np.int32(prob.total_q), np.int32(prob.total_k), np.float32(prob.scale), cu_q, cu_k]
    pred = predict_launch(str(SEED_PATH), prob.launch_grid, (cfg.n_threads, 1, 1), args, cfg.smem_bytes, gpu,
                          kernel=KERNEL_NAME, macros=KernelBuild.of(prob, "sm_80").macros(),
                          uniform_axes=(1,))  # grid y is the head: a sequence's heads take the same branches
    working = int(sum(-(-int(n) // cfg.block_m) for n in prob.seqlens_q)) * h
    notes = {"seqlens_q": [int(n) for n in prob.seqlens_q], "seqlens_k": [int(n) for n in prob.seqlens_k],
             "grid_ctas": prob.n_ctas, "working_ctas": working, "cta_rounds": int(rounds.sum())}
    return LaunchesPrediction(pred.kernel_ms, {KERNEL_NAME: pred}, "packed", notes)
