"""Split-KV decoding ("flash-decoding", issue 38 item 6): a few query rows against a KV cache with
per-sequence lengths, the keys split over CTAs, then a combine launch (docs/features.md).

    res = fa_sim.simulate(q, k_cache, v_cache, splits=3, cache_seqlens=np.array([300, 170], np.int32))

q [B, H, Nq, d] (decoding: Nq of 1-16, but any Nq runs); k, v [B, H_k, Nk, d] the cache, Nk its
allocated length, of which sequence b holds the first cache_seqlens[b] keys (int32 [B], each
1 .. Nk; None: all Nk). `splits` is the number of CTAs the keys of a (batch, head, Q block) are
split over: an integer from 1 to the cache's K/V tiles ceil(Nk / block_n), or "auto"
(`num_splits_heuristic`). The two launches (`splitkv_launches`), modelled on FlashAttention-2's
flash_fwd_splitkv_kernel and flash_fwd_splitkv_combine_kernel (csrc/flash_attn/src/flash_fwd_kernel.h,
flash_api.cpp's set_params_splitkv):

  1. fa2_fwd_kernel built with FA_SPLITKV   grid (ceil(Nq / block_m), B*H, splits) (FA2: splits in y,
       B*H in z; here the plain kernel's x and y are kept and the splits added as z)
       split s runs K/V blocks s * per .. min(ceil(len_b / block_n), (s + 1) * per) - 1 with
       per = ceil(ceil(Nk / block_n) / splits) (FA2's n_blocks_per_split: from the cache's length,
       so a short sequence leaves its last splits empty: they store O = 0, LSE = -inf) and stores its
       normalised fp32 O and its LSE in the workspace o_accum [splits, B*H, Nq, d], lse_accum
       [splits, B*H, Nq]. With one split the kernel stores O and LSE itself and there is no launch 2
       (FA2 likewise runs its plain path when num_splits == 1).
  2. fa2_combine_kernel (fa_hw/kernels/fa2_combine.cu)   grid ceil(B*H*Nq*d / 4 / 128), 128 threads
       per row: m = max_s lse_s, w_s = exp(lse_s - m), l = sum w_s, LSE = m + log l,
       O = sum w_s O_s / l (with the kernel's ex2.approx, logf and rcp.rn: the engine runs their PTX).

GQA packed (`pack_gqa`, FlashAttention-2's seqlenq_ngroups_swapped of flash_api.cpp): with g = H / H_k
Q heads per K/V head and no mask, the g heads of a K/V head are one head of g * Nq query rows:
q [B, H, Nq, d] is read as [B, H_k, g * Nq, d] (the same memory: Q head h = h_k g + j, its row i
becomes row j Nq + i of head h_k), and O, LSE likewise. A decoding CTA then fills g * Nq of its
block_m rows and reads its K/V tiles once for the whole group instead of once per Q head. Each row's
arithmetic is unchanged (rows do not mix), so a packed run gives the unpacked run's bits for the same
number of splits; "auto" sees the packed grid's fewer CTAs. pack_gqa None (default): packed when
g > 1 and Nq < block_m (the group's rows fill tiles the unpacked launch leaves mostly empty); True
or False force it.

Features: GQA (heads_k), softcap, bf16 and the config's schedule options combine with splits; a
causal mask and a sliding window do not (this kernel's masks are top-left aligned, which for a few
queries against a long cache hides the cache: FlashAttention-2 decodes with bottom-right alignment).
The split kernel's debug build (`splitkv_launches(..., checkpoint_ctas=)`, `checkpoint_layout`)
records the checkpoints of split CTAs for `fa compare --splits` (fa_sim.crosscheck.compare_splitkv). Bad input is one ValueError line before any work (`check_splitkv`).

The engine runs both launches on the PTX (fa_sim.ptx.launch), every lane; observers see launch 1
(the one with shared memory, barriers and the tensor core; a HazardChecker starts a new report at
each launch). fa_hw.forward(..., splits=, cache_seqlens=) runs the same two launches on the GPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from .contract import KernelBuild, KernelLaunch
from .contract.occupancy import min_blocks_per_sm
from .contract.source import KERNEL_NAME, SEED_PATH
from .problem import Problem

COMBINE_PATH = SEED_PATH.parent / "fa2_combine.cu"
COMBINE_KERNEL = "fa2_combine_kernel"
COMBINE_THREADS = 128  # fa2_combine.cu's block
COMBINE_COLS = 4  # columns of one row per combine thread
DEFAULT_SMS = 132  # H100 SXM and H200: the SM count "auto" assumes when no GPU says otherwise
MAX_SPLITS = 128  # FlashAttention-2's cap on num_splits


@dataclass(frozen=True)
class SplitPlan:
    """A checked split-KV launch: the problem (seqlen_k = the cache's allocated length), the splits,
    each sequence's length (int32 [B]) and what 'auto' chose from (None when splits was given)."""

    problem: Problem  # what the launches run: GQA packed, H_k heads of g * Nq rows (`packed_gqa`)
    splits: int
    cache_seqlens: np.ndarray
    auto_from: tuple[int, int, int] | None = None  # (CTAs without splits, SM slots, K/V tiles)
    unpacked: Problem | None = None  # the caller's problem when GQA is packed, else None

    @property
    def caller(self) -> Problem:
        """The problem as the caller gave it (its shapes are O's and LSE's)."""
        return self.unpacked or self.problem

    @property
    def n_ctas(self) -> int:
        """CTAs of the split launch (its grid's product)."""
        x, y, z = self.grid
        return x * y * z

    @property
    def kv_tiles(self) -> int:
        return self.problem.n_rounds

    @property
    def blocks_per_split(self) -> int:
        return -(-self.kv_tiles // self.splits)

    @property
    def grid(self) -> tuple[int, int, int]:
        p = self.problem
        return p.n_m_blocks, p.batch * p.heads, self.splits

    @property
    def combine_grid(self) -> tuple[int, int, int]:
        p = self.problem
        threads = p.batch * p.heads * p.seqlen_q * p.head_dim // COMBINE_COLS
        return -(-threads // COMBINE_THREADS), 1, 1

    def split_rounds(self) -> np.ndarray:
        """[B, splits] the K/V rounds each split of each sequence runs (0: an empty split)."""
        bn, per = self.problem.config.block_n, self.blocks_per_split
        tiles = -(-self.cache_seqlens.astype(np.int64) // bn)  # [B]
        s = np.arange(self.splits, dtype=np.int64)
        return np.clip(np.minimum(tiles[:, None], (s + 1) * per) - s * per, 0, None)

    def cta(self, cta: int) -> tuple[int, int, int, int, int]:
        """(Q block, batch-head, split, first K/V block, K/V blocks it runs) of a linear CTA id of the
        split launch, blockIdx.x + n_m_blocks (blockIdx.y + B H blockIdx.z) (GQA packed: the packed
        problem's Q blocks and batch-heads, B H_k of them); an empty split runs 0 blocks."""
        p = self.problem
        m_block, rest = divmod(int(cta), p.n_m_blocks)[::-1]
        bh, split = rest % (p.batch * p.heads), rest // (p.batch * p.heads)
        first = split * self.blocks_per_split
        return m_block, bh, split, first, int(self.split_rounds()[bh // p.heads, split])

    def describe_cta(self, cta: int) -> str:
        """Which (Q block, batch and head, split) a CTA of the split launch computes, its queries and
        the K/V tiles (keys of the cache) its split covers, in words (`fa trace --splits`'s header)."""
        p, cfg = self.problem, self.problem.config
        m_block, bh, split, first, n = self.cta(cta)
        b, h = divmod(bh, p.heads)
        rows = f"{m_block * cfg.block_m}..{min((m_block + 1) * cfg.block_m, p.seqlen_q) - 1}"
        if self.unpacked is not None:  # rows of the group's Q heads, one after the other (module docstring)
            g, nq = self.unpacked.kv_group, self.unpacked.seqlen_q
            who = (f"batch {b}, K/V head {h} (GQA packed: Q heads {h * g}..{h * g + g - 1} as rows of {nq} "
                   f"quer{'y' if nq == 1 else 'ies'} each), Q block {m_block}: rows {rows}")
        else:
            who = f"batch {b}, head {h}, Q block {m_block}: queries {rows}"
        length, per = int(self.cache_seqlens[b]), f"{self.blocks_per_split} K/V tiles per split, block_n {cfg.block_n}"
        if not n:
            return (f"CTA {cta}: split {split} of {self.splits}, {who}; the split covers no K/V block of the "
                    f"sequence's {length} cached keys: it starts at block {first}, past their "
                    f"{-(-length // cfg.block_n)}, and stores O = 0, LSE = -inf ({per})")
        return (f"CTA {cta}: split {split} of {self.splits}, {who}; the split covers K/V blocks {first}..{first + n - 1} "
                f"(keys {first * cfg.block_n}..{min((first + n) * cfg.block_n, length) - 1}) of the sequence's {length} "
                f"cached keys ({per}; round t runs block {first} + t)")

    def describe(self) -> str:
        how = (f"auto: {self.auto_from[0]} CTAs, {self.auto_from[1]} SM slots, {self.auto_from[2]} K/V tiles"
               if self.auto_from else "given")
        packed = (f", GQA packed: {self.unpacked.kv_group} Q heads x {self.unpacked.seqlen_q} rows per K/V head"
                  if self.unpacked else "")
        return f"splits={self.splits} ({how}), {self.blocks_per_split} K/V tiles per split{packed}"


def num_splits_heuristic(ctas: int, sm_slots: int, kv_tiles: int, max_splits: int = MAX_SPLITS) -> int:
    """FlashAttention-2's num_splits_heuristic (csrc/flash_attn/flash_api.cpp), with its numbers: `ctas`
    the CTAs without splits (B H ceil(Nq / block_m)), `sm_slots` the CTAs the GPU runs at once (FA2
    passes 2 x the SM count; here SMs x the kernel's CTAs per SM), `kv_tiles` the K/V blocks of the
    cache. 1 when the CTAs already fill 80% of the slots; else, over the splits up to
    min(max_splits, sm_slots, kv_tiles) that change the tiles per split (11 and 12 splits of 64 tiles
    are both 6 per split: only the first counts), the wave efficiency e = w / ceil(w) of
    w = ctas * splits / sm_slots, and the fewest splits within 85% of the best e."""
    if ctas >= 0.8 * sm_slots:
        return 1
    top = min(max_splits, sm_slots, kv_tiles)

    def eligible(n: int) -> bool:
        return n == 1 or -(-kv_tiles // n) != -(-kv_tiles // (n - 1))

    eff = {}
    for n in range(1, top + 1):
        if eligible(n):
            waves = ctas * n / sm_slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(n for n, e in eff.items() if e >= 0.85 * best)


def packed_gqa(prob: Problem) -> Problem:
    """The problem of a GQA-packed launch (module docstring): H_k heads of g * Nq query rows, one
    K/V head each."""
    return replace(prob, heads=prob.heads_k, seqlen_q=prob.kv_group * prob.seqlen_q)


def packs_gqa(prob: Problem, pack_gqa: bool | None = None) -> bool:
    """Whether split-KV decoding of `prob` runs GQA packed for this pack_gqa (None: decide; module
    docstring): g = H / H_k > 1, and Nq < block_m unless forced."""
    return prob.kv_group > 1 and (prob.seqlen_q < prob.config.block_m if pack_gqa is None else bool(pack_gqa))


def check_splitkv(prob: Problem, splits, cache_seqlens, num_sms: int | None = None,
                  pack_gqa: bool | None = None) -> SplitPlan:
    """The split-KV launch of `prob` (k, v's Nk = the cache's allocated length), or one ValueError line:
    splits an integer >= 1 and at most the cache's K/V tiles, or "auto"; cache_seqlens None or int32
    [B] with values 1 .. Nk (numpy, or anything numpy reads: torch tensors are read on the host); no
    causal mask or window; pack_gqa None, True or False (module docstring)."""
    if prob.causal or prob.has_window:
        raise ValueError("split-KV decoding (splits= / cache_seqlens=) takes no causal mask or window: this "
                         "kernel's masks are top-left aligned (docs/features.md); drop causal / window")
    if pack_gqa is not None and not isinstance(pack_gqa, (bool, np.bool_)):
        raise ValueError(f"pack_gqa must be None (decide), True or False, got {pack_gqa!r:.40}")
    pack = packs_gqa(prob, pack_gqa)
    plan = _check_splits(packed_gqa(prob) if pack else prob, splits, cache_seqlens, num_sms)
    return replace(plan, unpacked=prob) if pack else plan


def _check_splits(prob: Problem, splits, cache_seqlens, num_sms: int | None) -> SplitPlan:
    tiles, b = prob.n_rounds, prob.batch
    if cache_seqlens is None:
        seqlens = np.full(b, prob.seqlen_k, np.int32)
    else:
        if hasattr(cache_seqlens, "detach"):  # torch: read on the host
            cache_seqlens = cache_seqlens.detach().cpu().numpy()
        seqlens = np.asarray(cache_seqlens)
        if seqlens.dtype != np.int32:
            raise ValueError(f"cache_seqlens must be int32 (one length per batch entry, as FlashAttention-2's "
                             f"flash_attn_with_kvcache), got dtype {seqlens.dtype}")
        if seqlens.shape != (b,):
            raise ValueError(f"cache_seqlens must have shape ({b},) (one length per batch entry), got {seqlens.shape}")
        bad = np.flatnonzero((seqlens < 1) | (seqlens > prob.seqlen_k))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"cache_seqlens[{i}] = {int(seqlens[i])} is outside 1..{prob.seqlen_k} (the cache's "
                             f"allocated length, k.shape[2])")
        seqlens = np.ascontiguousarray(seqlens)
    if isinstance(splits, str):
        if splits != "auto":
            raise ValueError(f"splits must be an integer from 1 to {tiles} (the cache's K/V tiles of "
                             f"{prob.config.block_n} keys) or 'auto', got {splits!r:.40}")
        sms = DEFAULT_SMS if num_sms is None else int(num_sms)
        ctas, slots = prob.n_ctas, sms * min_blocks_per_sm(prob.config)
        return SplitPlan(prob, num_splits_heuristic(ctas, slots, tiles), seqlens, (ctas, slots, tiles))
    if isinstance(splits, (bool, np.bool_)) or not isinstance(splits, (int, np.integer)) or not 1 <= splits <= tiles:
        raise ValueError(f"splits must be an integer from 1 to {tiles} (the cache's K/V tiles: ceil(Nk={prob.seqlen_k}"
                         f" / block_n={prob.config.block_n})) or 'auto', got {splits!r:.40}")
    if splits > 65535:
        raise ValueError(f"splits = {splits} is over 65,535, the grid's z limit")
    return SplitPlan(prob, int(splits), seqlens)


def split_build(prob: Problem, arch: str) -> KernelBuild:
    """fa2_fwd.cu's build for the split launch: the problem's, with FA_SPLITKV."""
    return replace(KernelBuild.of(prob, arch), splitkv=True)


def combine_macros(head_dim: int, dtype: str) -> dict:
    return {"FA_HEAD_DIM": int(head_dim), "FA_BF16": int(dtype == "bf16")}


def workspace_shapes(plan: SplitPlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """o_accum [splits, B*H, Nq, d] and lse_accum [splits, B*H, Nq] (fp32), FA2's layout."""
    p = plan.problem
    return (plan.splits, p.batch * p.heads, p.seqlen_q, p.head_dim), (plan.splits, p.batch * p.heads, p.seqlen_q)


def splitkv_launches(plan: SplitPlan, q16: np.ndarray, k16: np.ndarray, v16: np.ndarray,
                     arch: str = "sm_80", checkpoint_ctas=None, sources=None) -> tuple[list[KernelLaunch], dict]:
    """(the launches in order: the split kernel, and the combine when splits > 1; the arrays
    {o, lse, o_accum, lse_accum}) of the checked plan on the host inputs (16-bit: float16, or bf16
    as uint16 patterns). `checkpoint_ctas` (linear ids of the split grid, `SplitPlan.cta`): the split
    kernel's debug build records them, in the array "checkpoints" (`checkpoint_layout`). `sources`:
    the paths of the fa2_fwd.cu and fa2_combine.cu to run (default the shipped ones; a saved GPU
    run's replay passes the sources it recorded)."""
    fwd_path, combine_path = (SEED_PATH, COMBINE_PATH) if sources is None else sources
    p = plan.problem
    b, h, nq, d = p.batch, p.heads, p.seqlen_q, p.head_dim
    q16 = q16.reshape(b, h, nq, d)  # GQA packed: the same memory read as H_k heads of g * Nq rows
    o = np.zeros((b, h, nq, d), np.uint16)
    lse = np.zeros((b, h, nq), np.float32)
    oa_shape, la_shape = workspace_shapes(plan)
    o_accum, lse_accum = np.zeros(oa_shape, np.float32), np.zeros(la_shape, np.float32)
    build = split_build(p, arch)
    args = [q16, k16, v16, o, lse, np.int32(nq), np.int32(p.seqlen_k), np.float32(p.scale), plan.cache_seqlens,
            np.int32(h), o_accum, lse_accum]
    arrays = {"o": o, "lse": lse, "o_accum": o_accum, "lse_accum": lse_accum}
    if checkpoint_ctas is not None:
        from .checkpoints import selection_map

        build = replace(build, checkpoints=True)
        layout = checkpoint_layout(plan)
        arrays["checkpoints"] = layout.empty(len(checkpoint_ctas))
        args += [arrays["checkpoints"], selection_map(list(checkpoint_ctas), plan.n_ctas), np.int32(layout.n_rounds)]
    launches = [KernelLaunch(KERNEL_NAME, str(fwd_path), plan.grid, (p.config.n_threads, 1, 1), p.config.smem_bytes,
                            args, build.macros(),
                            # grid y is bh: its branches read only cache_seqlens[bh / heads] (the K/V length)
                            (1,) if len(set(np.asarray(plan.cache_seqlens).tolist())) <= 1 else ())]
    if plan.splits > 1:
        launches.append(KernelLaunch(COMBINE_KERNEL, str(combine_path), plan.combine_grid, (COMBINE_THREADS, 1, 1), 0,
                                    [o_accum, lse_accum, o, lse, np.int32(b * h * nq), np.int32(plan.splits)],
                                    combine_macros(d, p.config.dtype)))
    return launches, arrays


def checkpoint_layout(plan: SplitPlan):
    """The split kernel's checkpoint buffer (fa_sim/checkpoints.py): blocks_per_split rounds, round t
    a split's t-th K/V block; a CTA runs `SplitPlan.cta(c)[4]` of them (0: an empty split records
    nothing), and with splits > 1 writes no sO image (it stores its partial O from registers)."""
    from .checkpoints import CheckpointLayout

    return CheckpointLayout(plan.problem.config, plan.blocks_per_split)


def run_splitkv(plan: SplitPlan, inputs, observers: tuple = (), mma_model=None, checkpoint_ctas=None, sources=None):
    """Both launches of a checked plan on the PTX engine: (the arrays of `splitkv_launches`, the warp
    instructions of both launches summed per (class, phase, round): launch 2's in the phase 'combine').
    `sources`: `splitkv_launches`'."""
    from . import ptx  # the engine needs NVRTC (the hw extra): imported when used
    from .validate import check_bf16_range

    prob = plan.caller
    q16, k16, v16 = (i.host_half(prob.config.dtype) for i in inputs)
    if prob.config.dtype == "bf16":  # uint16 patterns: the values are the high halves of float32
        check_bf16_range([float(np.max(np.abs((x.astype(np.uint32) << np.uint32(16)).view(np.float32))))
                          for x in (q16, k16, v16)], prob.scale, prob.head_dim, prob.seqlen_k)
    launches, out = splitkv_launches(plan, q16, k16, v16, checkpoint_ctas=checkpoint_ctas, sources=sources)
    counts: dict = {}
    for launch in launches:
        main = launch.kernel == KERNEL_NAME
        run = ptx.launch(launch.source, launch.grid, launch.block, launch.smem_bytes, launch.args,
                         kernel=launch.kernel, macros=launch.macros,
                         **({"observers": observers, "mma_model": mma_model, "problem": plan} if main else {}))
        for (op, phase, rnd), n in run.counts.items():
            key = (op, phase if main else "combine", rnd)
            counts[key] = counts.get(key, 0) + n
    return out, counts


def simulate_splitkv(inputs, prob: Problem, splits, cache_seqlens, observers: tuple, mma_model,
                     num_sms: int | None = None, pack_gqa: bool | None = None
                     ) -> tuple[np.ndarray, np.ndarray, dict, SplitPlan]:
    """fa_sim.simulate's split-KV path (its inputs checked, its problem made): both launches on the
    PTX engine. -> (O's 16-bit patterns [B, H, Nq, d] uint16 (fp16 or bf16), LSE [B, H, Nq] float32,
    the warp instructions of both launches summed per (class, phase, round): launch 2's in the phase
    'combine', the plan)."""
    plan = check_splitkv(prob, splits, cache_seqlens, num_sms, pack_gqa)
    out, counts = run_splitkv(plan, inputs, observers, mma_model)
    shape = (prob.batch, prob.heads, prob.seqlen_q)  # GQA packed: back to the caller's heads and rows
    return out["o"].reshape(*shape, prob.head_dim), out["lse"].reshape(shape), counts, plan


def measure_splitkv(res, q, k, v, cache_seqlens=None, softcap: float = 0.0):
    """fa_sim.accuracy.measure of a split-KV run, one sequence at a time against float64 on its own
    keys (k, v [b, :, :cache_seqlens[b]]): the worst sequence's numbers and every sequence's
    failures, as one fa_sim.accuracy.Accuracy (the documented bounds of the unsplit kernel)."""
    from .accuracy import Accuracy, measure

    b = np.shape(q)[0]
    lens = np.full(b, np.shape(k)[2]) if cache_seqlens is None else np.asarray(cache_seqlens)
    accs = [measure(np.asarray(res.o)[i:i + 1], np.asarray(res.lse)[i:i + 1], q[i:i + 1], k[i:i + 1, :, :lens[i]],
                    v[i:i + 1, :, :lens[i]], res.causal, res.scale, res.config, softcap=softcap) for i in range(b)]

    def worst(name):
        vals = [getattr(a, name) for a in accs]
        return None if any(x is None for x in vals) else max(vals)

    return Accuracy(worst("rel_err_o"), worst("max_abs_err_lse"), worst("max_rel_err_lse"),
                    tuple(f for a in accs for f in a.nonfinite), tuple(f for a in accs for f in a.above_bound))
