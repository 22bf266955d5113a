"""`simulate_backward`: the FlashAttention-2 backward pass (fa_hw/kernels/fa2_bwd.cu) on the PTX engine.

    fwd = fa_sim.simulate(q, k, v, causal=causal)
    res = fa_sim.simulate_backward(q, k, v, fwd.o, fwd.lse, do, causal=causal)
    res.dq, res.dk, res.dv       [B, H, N, d] float16 (bf16 runs: float32 holding the bf16 values exactly)

q: [B, H, Nq, d], k and v: [B, H, Nk, d], o and do: [B, H, Nq, d] (the input policy of
fa_sim.validate: the run's 16-bit type, or values it holds exactly; finite), lse: [B, H, Nq] float32,
the forward's natural-log LSE (finite). causal and scale as the forward's (they must be the forward's).
The run's type (fa2_bwd.cu FA_BF16, BackwardConfig.dtype): the `dtype` keyword ("fp16" or "bf16")
when given; else bf16 when the inputs are bfloat16 arrays (torch.bfloat16, ml_dtypes), else
config.dtype when a config is given, else fp16 - the forward's rule (fa_sim.validate.resolve_dtype)
over the five arrays q, k, v, o, do: float16 and bfloat16 among them mixed is one ValueError line,
and a config whose dtype is not the run's another. numpy has no bf16: pass float32 arrays of bf16
values (fa_sim.simulate(..., dtype="bf16").o is one) with dtype="bf16". bf16 inputs are also held
to fp32's range (`check_bf16_backward_range`).
Three kernels of fa2_bwd.cu (docs/backward.md) run one after the other through fa_sim.ptx.launch,
each on the whole grid, every lane simulated:
  1. fa2_bwd_preprocess_kernel   D = rowsum(dO o O)                  grid (ceil(Nq / block_m), B*H)
  2. fa2_bwd_kernel              dK, dV (atomic mode: and dQ's partials) grid (ceil(Nk / block_n), B*H)
  3. deterministic=True:  fa2_bwd_dq_kernel   dQ over the K/V blocks in order  grid (ceil(Nq / dq_block_m), B*H)
     deterministic=False: fa2_bwd_convert_dq_kernel   dQ = s * dQ_accum as fp16  grid (ceil(Nq / block_m), B*H)
`instructions` of the result: each kernel's warp instructions per class (fa_sim.events.Op).
deterministic=True computes dQ in a kernel of its own, one CTA per dq_block_m queries, that
recomputes S, P, dP and dS and accumulates dS K in registers over the K/V blocks in ascending
order (no atomics, no workspace: extra memory D only); the main kernel skips its dQ GEMM.
False: the main kernel adds its partials by red.global.add.f32 into a [B*H, Nq, d] fp32 buffer
(the engine applies one instruction's atomics in ascending (CTA, thread) order, docs/backward.md).
`observers` (as fa_sim.simulate's) see the main kernel's launch, `dq_observers` the dQ kernel's
(deterministic mode; the two with shared memory, barriers and the tensor core; the preprocess and
convert kernels use registers and global memory only; a HazardChecker starts a new report at each
launch); `kernel` a variant of fa2_bwd.cu (a path), `macros` extra FA_* macros (the mutation builds
of the hazard tests); `mma_model` the tensor core's accumulation, as fa_sim.simulate's ("h200": the
GPU's bits, for the comparison with fa_hw); `wave_ctas` the CTAs the engine runs at once
(fa_sim.ptx.launch; the deterministic mode's results do not depend on it).
`checkpoint_ctas` (linear CTA ids n_block + n_kv_blocks * bh of the main kernel's grid) runs the
main kernel's debug build (FA_BWD_CHECKPOINTS) instead, in either dQ mode: `res.checkpoints` is the
buffer uint32 [cta_sel, checkpoint, round, thread, word] of fa_sim/checkpoints.py
(BackwardCheckpointLayout), written by that build's own stores, the ones
fa_hw.backward(..., checkpoint_ctas=...) runs on the GPU. Bad input raises one ValueError line before
any kernel runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .checkpoints import BackwardCheckpointLayout, checkpoint_selection, selection_map
from .contract import KernelLaunch
from .contract.backward import (CONVERT_KERNEL, DQ_KERNEL, MAIN_KERNEL, PREPROCESS_KERNEL, BackwardBuild,
                                BackwardConfig)
from .events import Op
from .validate import (FP32_MAX, check_bf16_range, check_causal, check_input, check_scale, check_shapes,
                       run_dtype)


@dataclass(frozen=True, eq=False)
class BackwardResult:
    dq: np.ndarray  # [B, H, Nq, d] float16 (bf16: float32 of the bf16 values)
    dk: np.ndarray  # [B, H, Nk, d] float16 (bf16: float32 of the bf16 values)
    dv: np.ndarray  # [B, H, Nk, d] float16 (bf16: float32 of the bf16 values)
    config: BackwardConfig
    causal: bool
    scale: float
    deterministic: bool
    seconds: float
    # warp instructions per class of each kernel (name -> {Op: count}), in launch order
    instructions: Mapping[str, Mapping[Op, int]] = field(default_factory=dict)
    checkpoints: np.ndarray | None = None  # checkpoint_ctas given: uint32 [cta_sel, checkpoint, round, thread, word]
    checkpoint_ctas: tuple[int, ...] = ()

    @property
    def dtype(self) -> str:
        """The run's 16-bit type, "fp16" or "bf16" (config.dtype)."""
        return self.config.dtype


@dataclass(frozen=True)
class BackwardInputs:
    """The checked inputs as contiguous host arrays: q, o, do [B, H, Nq, d], k, v [B, H, Nk, d] in the
    run's type (float16, or bf16 as uint16 bit patterns), lse [B, H, Nq] fp32."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    do: np.ndarray
    causal: bool
    scale: float
    config: BackwardConfig

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        b, h, nq, d = self.q.shape
        return b, h, nq, self.k.shape[2], d


def backward_dtype(inputs, dtype=None, config=None) -> str:
    """The run's 16-bit type from the `dtype` keyword, the five inputs' types and the config (module
    docstring, fa_sim.validate.run_dtype); one ValueError line for float16 and bfloat16 inputs mixed,
    a bad name, or a config whose dtype is not the run's."""
    return run_dtype(inputs, dtype, config if isinstance(config, BackwardConfig) else None, "q, k, v, o, do",
                     "the backward kernel", "a BackwardConfig")


def check_bf16_backward_range(maxima, scale: float, head_dim: int, seqlen_q: int, seqlen_k: int) -> None:
    """bf16 inputs (up to 3.39e38) against the fp32 range of the backward's arithmetic, from max|q|,
    max|k|, max|v|, max|dO|: the forward's bound on the scores and on Nk max|v|
    (fa_sim.validate.check_bf16_range), and |dP|, |D| <= d max|dO| max|v|, |dS| <= 2 d max|dO| max|v|
    (P <= 1), so |dV| <= Nq max|dO|, |dK| <= Nq |dS| max|q|, |dQ| <= Nk |dS| max|k|, each at most
    FP32_MAX / 2: one ValueError line naming the bound, before the run."""
    mq, mk, mv, mdo = (float(m) for m in maxima)
    check_bf16_range((mq, mk, mv), scale, head_dim, seqlen_k)
    ds = 2.0 * head_dim * mdo * mv
    worst = max(seqlen_q * mdo, ds, ds * seqlen_q * mq, ds * seqlen_k * mk)
    if worst > FP32_MAX / 2:
        raise ValueError(f"bf16 inputs too large for the backward's fp32 accumulators: a gradient may reach "
                         f"{worst:.3g} "
                         f"(max|q| = {mq:.3g}, max|k| = {mk:.3g}, max|v| = {mv:.3g}, max|do| = {mdo:.3g}), over "
                         f"{FP32_MAX / 2:.3g}; rescale the inputs")


def check_backward_layout(q, k, v, o, lse, do, causal=False, scale=None, config=None, dtype=None):
    """The checks of the module docstring that read no values (kinds, dtypes, shapes, causal, scale,
    config): -> (the Inputs q, k, v, o, do, causal, scale, config), config.dtype the run's type;
    ValueError (one line) otherwise. lse's values are the caller's to check (in its own library:
    fa_hw reads CUDA tensors in place)."""
    if lse is None:
        raise ValueError("lse is missing: pass the forward's log-sum-exp (fa_sim.simulate(...).lse, [B, H, Nq] float32)")
    ins = [check_input(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do"))]
    qi, ki, vi, oi, doi = ins
    check_shapes(qi.shape, ki.shape, vi.shape)
    if ki.shape[1] != qi.shape[1]:  # the forward's grouped-query attention: not in fa2_bwd.cu
        raise ValueError(f"k and v must have q's {qi.shape[1]} heads: the backward pass has no grouped-query "
                         f"attention (k has {ki.shape[1]})")
    for x in (oi, doi):
        if x.shape != qi.shape:
            raise ValueError(f"{x.name} must have q's shape {qi.shape} [B, H, Nq, d], got {x.shape}")
    if not hasattr(lse, "shape") or not hasattr(lse, "dtype"):  # a list: numpy's view of it (CUDA tensors have both)
        lse = np.asarray(lse)
    lse_shape = tuple(int(n) for n in lse.shape)
    if lse_shape != qi.shape[:3]:
        raise ValueError(f"lse must have shape {qi.shape[:3]} [B, H, Nq] (the forward's res.lse), got {lse_shape}")
    lse_dtype = str(lse.dtype).removeprefix("torch.")
    if lse_dtype != "float32":
        raise ValueError(f"lse must be float32 (the forward's res.lse), got {lse_dtype}")
    d = qi.shape[3]
    causal, scale = check_causal(causal), check_scale(scale, d)
    run = backward_dtype(ins, dtype, config)
    config = BackwardConfig(d, dtype=run) if config is None else config
    if not isinstance(config, BackwardConfig) or config.head_dim != d:
        raise ValueError(f"config must be a BackwardConfig with head_dim {d}, got {config!r}")
    return ins, causal, scale, config


def check_backward_inputs(q, k, v, o, lse, do, causal=False, scale=None, config=None,
                          dtype=None) -> BackwardInputs:
    """Every check of the module docstring, shapes before values; ValueError (one line) otherwise."""
    ins, causal, scale, config = check_backward_layout(q, k, v, o, lse, do, causal, scale, config, dtype)
    lse = np.asarray(lse)
    bad = ~np.isfinite(lse)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"lse contains NaN or Inf, first at lse{list(at)} = {lse[at]}; pass the forward's res.lse")
    q16, k16, v16, o16, do16 = (x.host_half(config.dtype) for x in ins)  # the value checks (NaN in dO: one line)
    if config.dtype == "bf16":
        from .simulate import half_values

        b, h, nq, d = q16.shape
        check_bf16_backward_range([float(np.max(np.abs(half_values(x, "bf16")))) for x in (q16, k16, v16, do16)],
                                  scale, d, nq, k16.shape[2])
    return BackwardInputs(q16, k16, v16, o16, np.ascontiguousarray(lse), do16, causal, scale, config)


#: Warp instructions of one CTA of each kernel per head_dim, (base, per loop iteration): the main
#: kernel (atomic dQ, deterministic) per Q block of block_m rows, the dQ kernel per K/V block,
#: preprocess and convert per CTA; counted by fa_sim.timing.predict_backward_seeded at
#: (1, 1, block_m * k, block_n * k, d), k = 1 and 3 (non-causal, fa2_bwd.cu as shipped). An estimate for the timing
#: model's up-front cost check only (KernelLaunch.cta_instructions): the walks count exactly.
ESTIMATED_INSTRUCTIONS = {  # d: (main atomic, main deterministic, dQ kernel, preprocess, convert)
    32: ((1076, 1806), (830, 1540), (778, 1480), 540, 856),
    64: ((1282, 2716), (1286, 2056), (998, 1968), 1048, 1656),
    96: ((1574, 3340), (1566, 2508), (1306, 2272), 1096, 2548),
    128: ((2231, 2224), (2223, 1628), (1166, 2902), 1080, 1656),
    160: ((2319, 2528), (2315, 1856), (1354, 3206), 848, 2132),
    192: ((2779, 1692), (2775, 1220), (1234, 3733), 584, 1300),
}


def estimated_cta_instructions(cfg: BackwardConfig, nq: int, nk: int, causal: bool, deterministic: bool
                               ) -> dict[str, np.ndarray]:
    """kernel -> the estimated warp instructions of each CTA of one batch-head, in grid-x order
    (ESTIMATED_INSTRUCTIONS; causal: the main kernel's K/V block n iterates the Q blocks from
    n * block_n / block_m on, the dQ kernel's Q block m the K/V blocks up to its last row)."""
    main, det, dq, pre, conv = ESTIMATED_INSTRUCTIONS.get(cfg.head_dim, ESTIMATED_INSTRUCTIONS[128])
    n_q, n_kv, n_dq = cfg.n_q_blocks(nq), cfg.n_kv_blocks(nk), cfg.n_dq_blocks(nq)
    rounds = np.full(n_kv, n_q, np.int64)
    dq_rounds = np.full(n_dq, n_kv, np.int64)
    if causal:
        rounds = n_q - np.minimum(n_q, np.arange(n_kv) * cfg.block_n // cfg.block_m)
        dq_rounds = np.minimum(n_kv, -(-(np.arange(n_dq) + 1) * cfg.dq_block_m // cfg.block_n))
    base, per = det if deterministic else main
    out = {PREPROCESS_KERNEL: np.full(n_q, pre, np.int64), MAIN_KERNEL: base + per * rounds}
    if deterministic:
        out[DQ_KERNEL] = dq[0] + dq[1] * dq_rounds
    else:
        out[CONVERT_KERNEL] = np.full(n_q, conv, np.int64)
    return out


def backward_launches(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                      deterministic: bool = True, *, config: BackwardConfig | None = None, kernel=None,
                      macros: dict | None = None, checkpoint_ctas=None, dtype: str | None = None
                      ) -> tuple[list[KernelLaunch], BackwardInputs, dict]:
    """(the three launches in order, the checked inputs, their output arrays {dq, dk, dv, dq_accum},
    with checkpoint_ctas also {checkpoints, checkpoint_ctas}); dq_accum is None in the deterministic
    mode (the main kernel gets a null pointer it does not use)."""
    x = check_backward_inputs(q, k, v, o, lse, do, causal, scale, config, dtype)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    cfg, (b, h, nq, nk, d) = x.config, x.shape
    n_ctas = cfg.n_kv_blocks(nk) * b * h
    ctas = checkpoint_selection(checkpoint_ctas, n_ctas)
    build = BackwardBuild(x.config, x.causal, bool(deterministic), "sm_80", kernel,
                          tuple(sorted((macros or {}).items())), checkpoints=ctas is not None)
    src, defs = str(build.path), build.macros()
    block, scale32 = (cfg.n_threads, 1, 1), np.float32(x.scale)
    dpsum = np.zeros((b * h, nq), np.float32)
    dq_accum = None if deterministic else np.zeros((b * h, nq, d), np.float32)
    # np.zeros, not zeros_like (which writes every byte): calloc's pages are mapped when first written, so
    # a timing run, whose engine writes only its representative CTAs' rows, never touches the rest
    # (1.5 GB of gradients at (8, 32, 8192, 128))
    dk, dv, dq = (np.zeros(a.shape, a.dtype) for a in (x.k, x.v, x.q))
    acc_arg = np.uint64(0) if dq_accum is None else dq_accum
    main_args = [x.q, x.k, x.v, x.do, x.lse, dpsum, acc_arg, dk, dv, np.int32(nq), np.int32(nk), scale32]
    outputs = {"dq": dq, "dk": dk, "dv": dv, "dq_accum": dq_accum}
    if ctas is not None:  # the debug build's extra parameters: buffer, CTA -> slot map, rounds
        layout = BackwardCheckpointLayout(cfg, cfg.n_q_blocks(nq))
        buf = layout.empty(len(ctas))
        main_args += [buf, selection_map(ctas, n_ctas), np.int32(layout.n_rounds)]
        outputs.update(checkpoints=buf, checkpoint_ctas=tuple(ctas))
    # grid y is batch-head bh: it moves every address and no branch (the kernels' control flow
    # reads blockIdx.x, the lengths and the mask), except the checkpoint build's CTA -> slot map.
    # Grid x (the kernel's Q or K/V block) moves addresses only too when the shipped kernel runs
    # without the mask and that axis has no tail block (a length that is a multiple of the block):
    # every block then loops over the same blocks with the same bounds checks passing, and its
    # addresses move by whole blocks of rows, so one CTA stands for all (a user's variant, `kernel`,
    # may branch on blockIdx.x: it keeps one class per block). tests/test_timing_classes.py.
    bh = () if ctas is not None else (1,)

    def axes(length: int, rows: int) -> tuple:
        whole = kernel is None and not x.causal and length % rows == 0
        return (0, *bh) if bh and whole else bh
    est = {name: np.tile(e, b * h) for name, e in
           estimated_cta_instructions(cfg, nq, nk, x.causal, bool(deterministic)).items()}  # grid order: x fastest
    launches = [
        KernelLaunch(PREPROCESS_KERNEL, src, (cfg.n_q_blocks(nq), b * h), block, 0,
                       [x.o, x.do, dpsum, np.int32(nq)], defs, axes(nq, cfg.block_m), est[PREPROCESS_KERNEL]),
        KernelLaunch(MAIN_KERNEL, src, (cfg.n_kv_blocks(nk), b * h), block, cfg.smem_bytes,
                       main_args, defs, axes(nk, cfg.block_n), est[MAIN_KERNEL]),
        KernelLaunch(DQ_KERNEL, src, (cfg.n_dq_blocks(nq), b * h), block, cfg.dq_smem_bytes,
                       [x.q, x.k, x.v, x.do, x.lse, dpsum, dq, np.int32(nq), np.int32(nk), scale32], defs,
                     axes(nq, cfg.dq_block_m), est[DQ_KERNEL])
        if deterministic else
        KernelLaunch(CONVERT_KERNEL, src, (cfg.n_q_blocks(nq), b * h), block, 0,
                       [dq_accum, dq, np.int32(nq), scale32], defs, axes(nq, cfg.block_m), est[CONVERT_KERNEL]),
    ]
    return launches, x, outputs


def simulate_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                      deterministic: bool = True, observers=(), *, config: BackwardConfig | None = None,
                      kernel=None, macros: dict | None = None, mma_model=None, dq_observers=(),
                      wave_ctas: int | None = None, checkpoint_ctas=None, dtype: str | None = None) -> BackwardResult:
    """The backward pass on the PTX engine; see the module docstring."""
    from . import ptx  # the engine needs NVRTC (the hw extra): imported when used
    from .simulate import _observers, half_values

    start = time.perf_counter()
    launches, x, out = backward_launches(q, k, v, o, lse, do, causal, scale, deterministic, config=config,
                                         kernel=kernel, macros=macros, checkpoint_ctas=checkpoint_ctas, dtype=dtype)
    seen = {MAIN_KERNEL: _observers(observers), DQ_KERNEL: _observers(dq_observers)}
    if seen[DQ_KERNEL] and not deterministic:
        raise ValueError("dq_observers watch fa2_bwd_dq_kernel, which only the deterministic mode runs")
    waves = {} if wave_ctas is None else {"wave_ctas": wave_ctas}
    counts = {}
    for launch in launches:
        extra = {"observers": seen[launch.kernel], "mma_model": mma_model} if launch.kernel in seen else {}
        run = ptx.launch(launch.source, launch.grid, launch.block, launch.smem_bytes, launch.args, kernel=launch.kernel,
                         macros=launch.macros, **extra, **waves)
        counts[launch.kernel] = dict(run.instructions)
    bf16 = x.config.dtype == "bf16"  # the kernel's bf16 outputs are uint16 bit patterns: as float32 values
    grads = (half_values(out[n], "bf16") if bf16 else out[n] for n in ("dq", "dk", "dv"))
    return BackwardResult(*grads, x.config, x.causal, x.scale, bool(deterministic),
                          time.perf_counter() - start, counts, out.get("checkpoints"), out.get("checkpoint_ctas", ()))
