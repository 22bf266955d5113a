"""Simulator against GPU, checkpoint by checkpoint (docs/architecture.md, "Checkpoints").

Both backends fill the buffer of fa_sim/checkpoints.py, uint32 [cta_sel, checkpoint, round,
thread, word], for the same selected CTAs. `compare_checkpoints` walks it and reports, per
checkpoint: how many values were compared, the fraction that is bit-identical, the largest
difference in units in the last place, and the first mismatch as (checkpoint, round, warp, lane,
register, simulator value, GPU value). `BOUNDS` is the documented largest difference each
checkpoint may show; `fa compare` exits 0 only when all are met. `SavedRun` (fa_sim.saved_run) is
the versioned .npz of a GPU run (`fa compare --save`, `--gpu-npz`), so the comparison also runs
without a GPU. The backward pass's buffer (fa_sim.checkpoints.BackwardCheckpointLayout, `fa compare
--backward`) goes through the same `compare_checkpoints`, with `BACKWARD_BOUNDS`: 0 ulps as well,
since fa2_bwd.cu rounds every fp32 operation explicitly and its checkpoints precede the dQ
accumulation (docs/backward.md, section 7).

Why every bound is 0 (measured on the H200; README, "Simulator against GPU"): data movement is
exact; the simulator runs the tensor core's accumulation as the H200 does it (fa_sim.tensorcore,
model 'h200') and its special-function unit bit for bit (fa_sim.isa.mufu: MUFU.EX2 behind
ex2.approx); every other fp32 operation of the kernel is one IEEE-rounded operation in a fixed
order (SCHEDULE.md), and logf is ordinary fp32 arithmetic. So every checkpoint, O and LSE are
bit-identical, and any difference is a real disagreement between the two - a bug, or a GPU whose
units differ from the H200's (the models were fitted to it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .checkpoints import (BACKWARD_CHECKPOINTS, BACKWARD_TILES, CHECKPOINTS, ROUND0_ONLY, BackwardCheckpoint,
                          BackwardCheckpointLayout, Checkpoint, CheckpointLayout)
from .config import KernelConfig
from .events import CheckpointEvent, LaunchInfo
from .isa.sm80 import WARP_SIZE
from .problem import Problem
from .saved_run import SAVED_RUN_FORMAT, SavedRun, config_from_tag  # noqa: F401 (public names of fa_sim.crosscheck)
from .simulate import simulate


class ValueKind(enum.Enum):
    F32 = "f32"
    F16 = "f16"  # words hold two halves (of the kernel's 16-bit type: fp16 or bf16, config.dtype)


KIND = {ck: ValueKind.F16 if ck in (Checkpoint.P_F16, Checkpoint.SQ, Checkpoint.SK, Checkpoint.SV, Checkpoint.SO)
        else ValueKind.F32 for ck in CHECKPOINTS}
BACKWARD_KIND = {ck: ValueKind.F16 if ck in BACKWARD_TILES else ValueKind.F32 for ck in BACKWARD_CHECKPOINTS}

class BoundKind(enum.Enum):
    ULPS = "ulps"  # units in the last place of the checkpoint's own type


#: Largest difference each checkpoint may show (kind, value): none. The H200 recordings in
#: tests/data/h200 and experiments/sim_vs_hw.py's sweep (configs x causal x shapes with tails and
#: Nk != Nq) are bit-identical at every checkpoint (module docstring).
BOUNDS: dict[Checkpoint, tuple[BoundKind, float]] = {ck: (BoundKind.ULPS, 0) for ck in CHECKPOINTS}
#: The backward's checkpoints (fa2_bwd.cu's main kernel): none either, in both dQ modes - no
#: checkpoint depends on the order of dQ's additions (module docstring).
BACKWARD_BOUNDS: dict[BackwardCheckpoint, tuple[BoundKind, float]] = {
    ck: (BoundKind.ULPS, 0) for ck in BACKWARD_CHECKPOINTS}


class CheckpointRecorder:
    """Observer: fills a checkpoint buffer for the selected CTAs of a simulated launch."""

    def __init__(self, ctas) -> None:
        self.ctas = tuple(int(c) for c in ctas)
        self.buffer: np.ndarray | None = None
        self._slot: dict[int, int] = {c: i for i, c in enumerate(self.ctas)}

    def on_launch(self, launch: LaunchInfo) -> None:
        cfg = launch.config
        self.layout = CheckpointLayout(cfg, launch.problem.n_rounds)
        bad = [c for c in self.ctas if not 0 <= c < launch.n_ctas]
        if bad:
            raise ValueError(f"checkpoint CTAs {bad} are outside the grid of {launch.n_ctas} CTAs")
        self.buffer = self.layout.empty(len(self.ctas))
        self._written: set[int] = set()

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        ck_i = CHECKPOINTS.index(event.checkpoint)
        for row, cta in enumerate(event.cta.tolist()):
            slot = self._slot.get(cta)
            if slot is not None:
                vals = event.values[row]  # [T, k] uint32
                self.buffer[slot, ck_i, event.round, :, : vals.shape[-1]] = vals
                self._written.add(slot)

    # -- shards (fa_sim.parallel.merge): each CTA, hence each slot, belongs to one shard ----------
    def fresh(self) -> "CheckpointRecorder":
        return CheckpointRecorder(self.ctas)

    def partial(self) -> tuple[np.ndarray, np.ndarray]:
        slots = np.array(sorted(self._written), dtype=np.int64)
        return slots, self.buffer[slots]

    def merge(self, part: tuple[np.ndarray, np.ndarray]) -> None:
        slots, values = part
        self.buffer[slots] = values
        self._written.update(slots.tolist())


def _ordered(bits: np.ndarray, kind: ValueKind) -> np.ndarray:
    """Map IEEE bit patterns to integers whose difference counts ulps (sign-magnitude -> linear)."""
    signed = np.int32 if kind is ValueKind.F32 else np.int16  # bits: uint32 or uint16
    i = bits.view(signed).astype(np.int64)
    return np.where(i < 0, np.int64(np.iinfo(signed).min) - i, i)


def _values(bits: np.ndarray, kind: ValueKind, dtype: str = "fp16") -> np.ndarray:
    """Bit patterns as values: f32, or halves of the kernel's 16-bit type (bf16 as float32)."""
    if kind is ValueKind.F32:
        return bits.view(np.float32)
    h = bits.view(np.uint16)
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32) if dtype == "bf16" else h.view(np.float16)


@dataclass(frozen=True)
class Mismatch:
    checkpoint: Checkpoint
    cta: int
    round: int
    warp: int
    lane: int
    register: int  # element index in the thread's slot (fp32 word, or half for fp16 data)
    sim: float
    gpu: float

    def __str__(self) -> str:
        return (f"{self.checkpoint.value} cta {self.cta} round {self.round} warp {self.warp} lane {self.lane} "
                f"reg {self.register}: sim {self.sim!r} gpu {self.gpu!r}")


@dataclass(frozen=True)
class CheckpointStats:
    checkpoint: Checkpoint
    values: int
    identical: int
    max_ulps: int
    max_rel: float  # max |sim - gpu| / max |gpu| over the same (CTA, round)
    bound: tuple[BoundKind, float]
    first: Mismatch | None

    @property
    def fraction_identical(self) -> float:
        return self.identical / self.values if self.values else 1.0

    @property
    def ok(self) -> bool:
        return self.max_ulps <= self.bound[1]

    def bound_text(self) -> str:
        return f"{int(self.bound[1])} ulps"


def _valid_mask(layout, ck, rounds_run: np.ndarray) -> np.ndarray:
    """[cta_sel, round, T, words] bool: which words of checkpoint ck hold data."""
    n_sel = rounds_run.shape[0]
    r = np.arange(layout.n_rounds)
    # a CTA that ran no round (packed: its Q block past its sequence, it exits at once) wrote nothing
    live = ((r[None, :] == 0) & (rounds_run[:, None] > 0)) if ck in ROUND0_ONLY else (r[None, :] < rounds_run[:, None])
    live = np.broadcast_to(live, (n_sel, layout.n_rounds))
    used = np.arange(layout.words) < layout.used_words(ck)
    return live[:, :, None, None] & used[None, None, None, :] & np.ones((1, 1, layout.n_threads, 1), bool)


def rounds_per_cta(ctas, config: KernelConfig, seqlen_q: int, seqlen_k: int, causal: bool,
                   window: tuple[int, int] | None = None, problem: Problem | None = None) -> np.ndarray:
    """The K/V rounds of each checkpointed CTA (SCHEDULE.md's n_block_max; with a window,
    Problem.n_rounds_of): the rounds whose checkpoints exist. Checkpoints name a CTA by its Q block
    (Problem.q_block_index). `problem`: the launch itself (a packed batch: each CTA's sequence's
    rounds, 0 where its Q block is past the sequence's end), else one (batch, head) of the sizes."""
    prob = problem or Problem(1, 1, seqlen_q, seqlen_k, bool(causal), 1.0, config, window=window)
    return prob.rounds_per_cta(prob.q_block_index(ctas))


def compare_checkpoints(sim: np.ndarray, gpu: np.ndarray, layout: CheckpointLayout | BackwardCheckpointLayout, ctas,
                        rounds_run: np.ndarray) -> list[CheckpointStats]:
    """Per-checkpoint agreement of two buffers uint32 [cta_sel, checkpoint, round, thread, word]
    of the forward's or the backward's layout (16-bit values in the layout's config.dtype, fp16 for
    the backward: ulps count either type's patterns alike); bounds BOUNDS or BACKWARD_BOUNDS."""
    backward = isinstance(layout, BackwardCheckpointLayout)
    kinds, bounds = (BACKWARD_KIND, BACKWARD_BOUNDS) if backward else (KIND, BOUNDS)
    dtype = getattr(layout.config, "dtype", "fp16")
    if sim.shape != gpu.shape:
        raise ValueError(f"checkpoint buffers differ in shape: simulator {sim.shape}, GPU {gpu.shape}")
    out = []
    for ck_i, ck in enumerate(layout.CHECKPOINTS):
        mask = _valid_mask(layout, ck, np.asarray(rounds_run))
        a, b = sim[:, ck_i], gpu[:, ck_i]
        if kinds[ck] is ValueKind.F16:  # compare halves, not words
            mask = np.repeat(mask, 2, axis=-1)
            a, b = a.view(np.uint16), b.view(np.uint16)
        ulps = np.abs(_ordered(a, kinds[ck]) - _ordered(b, kinds[ck]))
        ulps = np.where(mask, ulps, 0)
        diff = mask & (a != b)
        first = None
        if diff.any():
            sel, rnd, thread, reg = np.argwhere(diff)[0]
            first = Mismatch(ck, int(np.asarray(ctas)[sel]), int(rnd), int(thread) // WARP_SIZE,
                             int(thread) % WARP_SIZE, int(reg), float(_values(a, kinds[ck], dtype)[sel, rnd, thread, reg]),
                             float(_values(b, kinds[ck], dtype)[sel, rnd, thread, reg]))
        n = int(mask.sum())
        out.append(CheckpointStats(ck, n, n - int(diff.sum()), int(ulps.max(initial=0)),
                                   _max_rel(a, b, mask, kinds[ck], dtype), bounds[ck], first))
    return out


def _max_rel(a: np.ndarray, b: np.ndarray, mask: np.ndarray, kind: ValueKind, dtype: str = "fp16") -> float:
    """max |a - b| / max |b| per (CTA, round) slice [sel, round, T, words], over the valid values."""
    va = _values(a, kind, dtype).astype(np.float64)
    vb = _values(b, kind, dtype).astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(mask & np.isfinite(va) & np.isfinite(vb), np.abs(va - vb), 0.0)
    scale = np.where(mask & np.isfinite(vb), np.abs(vb), 0.0).max(axis=(2, 3))
    worst = diff.max(axis=(2, 3), initial=0.0)
    rel = np.where(scale > 0, worst / np.where(scale > 0, scale, 1.0), np.where(worst > 0, np.inf, 0.0))
    return float(rel.max(initial=0.0))


def f16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in fp16 ulps of two float16 arrays."""
    pa = np.ascontiguousarray(a, dtype=np.float16).view(np.uint16)
    pb = np.ascontiguousarray(b, dtype=np.float16).view(np.uint16)
    return np.abs(_ordered(pa, ValueKind.F16) - _ordered(pb, ValueKind.F16))


@dataclass(frozen=True)
class OutputStats:
    """Agreement of the final O (fp16) and LSE (fp32) over the whole grid."""

    o_identical: float  # fraction of bit-identical O elements
    o_max_ulps: int
    lse_identical: float
    lse_max_abs: float
    lse_max_ulps: int


def bf16_bits(o) -> np.ndarray:
    """bf16 values (float32, or a torch.bfloat16 tensor brought to the host) -> their uint16 patterns;
    a float32 value that is not a bf16 is a ValueError (it would be compared wrongly)."""
    a = np.asarray(o.float().cpu().numpy() if hasattr(o, "float") and hasattr(o, "cpu") else o, np.float32)
    bits = np.ascontiguousarray(a).view(np.uint32)
    if (bits & np.uint32(0xFFFF)).any():
        raise ValueError("a bf16 output holds float32 values that are not bf16 values")
    return (bits >> np.uint32(16)).astype(np.uint16)


def output_stats(o_sim, o_gpu, lse_sim, lse_gpu, dtype: str = "fp16") -> OutputStats:
    """O (of the kernel's `dtype`: float16, or bf16 values as float32) and LSE agreement."""
    l_sim, l_gpu = np.asarray(lse_sim, np.float32), np.asarray(lse_gpu, np.float32)
    if dtype == "bf16":
        o_ulps = np.abs(_ordered(bf16_bits(o_sim), ValueKind.F16) - _ordered(bf16_bits(o_gpu), ValueKind.F16))
    else:
        o_ulps = f16_ulps(np.asarray(o_sim, np.float16), np.asarray(o_gpu, np.float16))
    l_ulps = np.abs(_ordered(np.ascontiguousarray(l_sim).view(np.uint32), ValueKind.F32)
                    - _ordered(np.ascontiguousarray(l_gpu).view(np.uint32), ValueKind.F32))
    return OutputStats(float(np.mean(o_ulps == 0)), int(o_ulps.max(initial=0)),
                       float(np.mean(l_ulps == 0)), float(np.max(np.abs(l_sim.astype(np.float64) - l_gpu))),
                       int(l_ulps.max(initial=0)))


@dataclass(frozen=True)
class CompareReport:
    config: KernelConfig
    causal: bool
    shape: tuple[int, int, int, int, int]  # B, H, Nq, Nk, d
    ctas: tuple[int, ...]
    checkpoints: tuple[CheckpointStats, ...]
    outputs: OutputStats
    features: tuple[str, ...] = ()  # the launch's features as Problem.features() names them (heads_k=1, ...)
    workspace: "WorkspaceStats | None" = None  # split-KV with splits > 1: the partial O and LSE of every split

    @property
    def ok(self) -> bool:
        """Every checkpoint within its bound, O and LSE (and a split launch's workspace) bit-identical
        over the whole grid."""
        return (all(s.ok for s in self.checkpoints) and self.outputs.o_max_ulps == 0
                and self.outputs.lse_max_ulps == 0 and (self.workspace is None or self.workspace.ok))

    def to_json(self) -> dict:
        return {
            "config": self.config.tag, "causal": self.causal, "shape": list(self.shape), "ctas": list(self.ctas),
            "features": list(self.features), "ok": self.ok,
            "checkpoints": checkpoints_json(self.checkpoints),
            "o": {"fraction_identical": self.outputs.o_identical, "max_ulps_f16": self.outputs.o_max_ulps,
                  "dtype": self.config.dtype},
            "lse": {"fraction_identical": self.outputs.lse_identical, "max_abs_diff": self.outputs.lse_max_abs,
                    "max_ulps_f32": self.outputs.lse_max_ulps},
            **({} if self.workspace is None else {"workspace": {
                "o_accum": {"fraction_identical": self.workspace.o_identical, "max_ulps_f32": self.workspace.o_max_ulps},
                "lse_accum": {"fraction_identical": self.workspace.lse_identical,
                              "max_ulps_f32": self.workspace.lse_max_ulps}}}),
        }


def checkpoints_json(stats) -> dict:
    """CheckpointStats by checkpoint name, as `fa compare --json` prints them."""
    return {s.checkpoint.value: {
        "values": s.values, "fraction_identical": s.fraction_identical, "max_ulps": s.max_ulps,
        "max_rel": s.max_rel, "bound": {"kind": s.bound[0].value, "value": s.bound[1]}, "ok": s.ok,
        "first_mismatch": None if s.first is None else {
            "round": s.first.round, "cta": s.first.cta, "warp": s.first.warp, "lane": s.first.lane,
            "register": s.first.register, "sim": s.first.sim, "gpu": s.first.gpu}}
        for s in stats}


def format_checkpoint_table(stats) -> list[str]:
    """The per-checkpoint lines of `fa compare` (forward or backward CheckpointStats)."""
    lines = [f"  {'checkpoint':<10}{'values':>10}{'identical':>11}{'max ulps':>10}{'max rel':>10}"
             f"{'bound':>11}  first mismatch"]
    for s in stats:
        mark = "" if s.ok else "  <-- over bound"
        first = "-" if s.first is None else str(s.first)
        lines.append(f"  {s.checkpoint.value:<10}{s.values:>10,}{s.fraction_identical:>10.4%}"
                     f"{s.max_ulps:>10}{s.max_rel:>10.1e}{s.bound_text():>11}  {first}{mark}")
    return lines


def format_report(rep: CompareReport) -> str:
    b, h, nq, nk, d = rep.shape
    lines = [f"fa compare: B={b} H={h} Nq={nq} Nk={nk} d={d} {'causal' if rep.causal else 'non-causal'} "
             + "".join(f"{f} " for f in rep.features) + f"config {rep.config.tag}, checkpoints of CTAs {list(rep.ctas)}",
             *format_checkpoint_table(rep.checkpoints)]
    o, w = rep.outputs, rep.workspace
    if w is not None:
        lines.append(f"  o_accum (fp32, every split): {w.o_identical:.4%} identical, max {w.o_max_ulps} ulps")
        lines.append(f"  lse_accum (fp32, every split): {w.lse_identical:.4%} identical, max {w.lse_max_ulps} ulps")
    lines.append(f"  O   ({rep.config.dtype}): {o.o_identical:.4%} identical, max {o.o_max_ulps} ulps")
    lines.append(f"  LSE (fp32): {o.lse_identical:.4%} identical, max |diff| {o.lse_max_abs:.3e} ({o.lse_max_ulps} ulps)")
    lines.append(f"  every checkpoint, {'the workspace, ' if w is not None else ''}O and LSE bit-identical" if rep.ok
                 else "  DIFFERENCES: the simulator and the GPU disagree (see above)")
    return "\n".join(lines)


def simulate_with_checkpoints(q, k, v, causal, scale, config, ctas, mma_model="h200", engine=None, kernel=None,
                              window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Run the simulator recording checkpoints of `ctas`: (SimResult, buffer). The tensor-core
    model defaults to the H200's, which the GPU side is compared against. engine=None: the PTX engine
    for a `kernel` file, a config with schedule options or a packed batch (cu_seqlens_q / _k; q
    [total_q, H, d]: fa_sim.kernels.engine_for), else the program."""
    rec = CheckpointRecorder(ctas)
    res = simulate(q, k, v, causal=causal, scale=scale, config=config, observers=[rec], mma_model=mma_model,
                   engine=engine, kernel=kernel, window=window, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k)
    return res, rec.buffer


def backward_checkpoint_stats(sim_buf: np.ndarray, gpu_buf: np.ndarray, config, ctas, batch_heads: int,
                              seqlen_q: int, seqlen_k: int, causal: bool) -> list[CheckpointStats]:
    """The backward's buffers (BackwardCheckpointLayout; `config` a BackwardConfig) compared over
    the rounds each selected CTA of the main kernel's grid (n_kv_blocks, B*H) runs."""
    layout = BackwardCheckpointLayout(config, config.n_q_blocks(seqlen_q))
    if not all(0 <= int(c) < config.n_kv_blocks(seqlen_k) * batch_heads for c in ctas):
        raise ValueError(f"checkpoint CTAs {list(ctas)} are outside the grid of "
                         f"{config.n_kv_blocks(seqlen_k) * batch_heads} CTAs")
    rounds = layout.rounds_per_cta(ctas, config.n_kv_blocks(seqlen_k), seqlen_q, causal)
    return compare_checkpoints(np.asarray(sim_buf), np.asarray(gpu_buf), layout, ctas, rounds)


def build_report(q, k, v, causal, config, ctas, sim_res, sim_buf, gpu_o, gpu_lse, gpu_buf,
                 window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None) -> CompareReport:
    """The comparison of one launch; a packed batch (cu_seqlens_q / _k, q [total_q, H, d], k [total_k,
    H_k, d]) reports B sequences of the longest Nq and Nk, each CTA's rounds those of its sequence."""
    if cu_seqlens_q is not None:
        cq, ck = (tuple(int(x) for x in c) for c in (cu_seqlens_q, cu_seqlens_k))
        lq, lk = np.diff(cq), np.diff(ck)
        b, h, nq, nk, d = len(cq) - 1, np.shape(q)[1], int(lq.max()), int(lk.max()), np.shape(q)[2]
        prob = Problem(b, h, nq, nk, bool(causal), 1.0, config, np.shape(k)[1], window, softcap, cu_seqlens=(cq, ck))
    else:
        b, h, nq, d = np.shape(q)
        nk = np.shape(k)[2]
        prob = Problem(b, h, nq, nk, bool(causal), 1.0, config, np.shape(k)[1], window, softcap)
    features = prob.features()
    layout = CheckpointLayout(config, -(-nk // config.block_n))
    rounds = rounds_per_cta(ctas, config, nq, nk, causal, window, problem=prob)
    stats = compare_checkpoints(sim_buf, np.asarray(gpu_buf), layout, ctas, rounds)
    return CompareReport(config, bool(causal), (b, h, nq, nk, d), tuple(int(c) for c in ctas), tuple(stats),
                         output_stats(sim_res.o, gpu_o, sim_res.lse, gpu_lse, config.dtype), tuple(features))


# -- split-KV decoding (fa_sim.splitkv): the split kernel's checkpoints, its workspace, the combine ------
@dataclass(frozen=True)
class SplitRun:
    """One side of a split-KV comparison: O (the caller's [B, H, Nq, d], of config.dtype: float16 or
    bf16 values as float32), LSE [B, H, Nq], the workspace o_accum [splits, B*H, Nq, d] and lse_accum
    [splits, B*H, Nq] (fp32; B*H of the launch: H_k when GQA is packed) and the checkpoint buffer."""

    o: np.ndarray
    lse: np.ndarray
    o_accum: np.ndarray
    lse_accum: np.ndarray
    checkpoints: np.ndarray


def simulate_splitkv_with_checkpoints(q, k, v, scale, config, ctas, splits, cache_seqlens=None, pack_gqa=None,
                                      softcap=None, mma_model="h200", dtype=None, sources=None):
    """The PTX engine's run of split-KV decoding (fa_sim.splitkv) with the split kernel's debug build
    recording `ctas` (linear ids of the split grid): (SplitRun, SplitPlan). `splits` an integer (the
    GPU's choice when it chose "auto"); the H200's tensor-core model by default, as for the dense.
    `sources`: paths of the fa2_fwd.cu and fa2_combine.cu to run (default the shipped ones)."""
    from .simulate import half_values
    from .splitkv import check_splitkv, run_splitkv
    from .validate import check_input, make_problem, resolve_dtype

    inputs = [check_input(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    prob = make_problem(*(i.shape for i in inputs), False, scale, config, None, softcap,
                        dtype=resolve_dtype(inputs, dtype, config))
    plan = check_splitkv(prob, splits, cache_seqlens, None, pack_gqa)
    from .checkpoints import checkpoint_selection

    ctas = checkpoint_selection(ctas, plan.n_ctas)
    from . import tensorcore

    out, _ = run_splitkv(plan, inputs, (), tensorcore.resolve(mma_model), ctas, sources)
    shape = (prob.batch, prob.heads, prob.seqlen_q)
    o = half_values(out["o"], prob.config.dtype).reshape(*shape, prob.head_dim)
    return SplitRun(o, out["lse"].reshape(shape), out["o_accum"], out["lse_accum"], out["checkpoints"]), plan


@dataclass(frozen=True)
class WorkspaceStats:
    """Agreement of the split kernel's fp32 workspace (every split's partial O and LSE)."""

    o_identical: float
    o_max_ulps: int
    lse_identical: float
    lse_max_ulps: int

    @property
    def ok(self) -> bool:
        return self.o_max_ulps == 0 and self.lse_max_ulps == 0


def _f32_ulps(a, b) -> np.ndarray:
    pa = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    pb = np.ascontiguousarray(b, dtype=np.float32).view(np.uint32)
    return np.abs(_ordered(pa, ValueKind.F32) - _ordered(pb, ValueKind.F32))


def workspace_stats(sim: SplitRun, gpu: SplitRun) -> WorkspaceStats:
    if np.shape(sim.o_accum) != np.shape(gpu.o_accum) or np.shape(sim.lse_accum) != np.shape(gpu.lse_accum):
        raise ValueError(f"split-KV workspaces differ in shape: simulator {np.shape(sim.o_accum)}, "
                         f"GPU {np.shape(gpu.o_accum)}")
    o, lse = _f32_ulps(sim.o_accum, gpu.o_accum), _f32_ulps(sim.lse_accum, gpu.lse_accum)
    return WorkspaceStats(float(np.mean(o == 0)), int(o.max(initial=0)), float(np.mean(lse == 0)),
                          int(lse.max(initial=0)))


def build_splitkv_report(q, k, plan, ctas, sim: SplitRun, gpu: SplitRun) -> "CompareReport":
    """The comparison of a split-KV launch (`plan`: fa_sim.splitkv.SplitPlan): the split CTAs'
    checkpoints over the rounds each runs (an empty split none; with splits > 1 no sO, which the
    kernel does not stage), the workspace (splits > 1: every split's partial O and LSE, bit for bit)
    and the combined O and LSE."""
    from .splitkv import checkpoint_layout

    caller, cfg = plan.caller, plan.problem.config
    layout = checkpoint_layout(plan)
    rounds = np.array([plan.cta(c)[4] for c in ctas], np.int64)
    stats = compare_checkpoints(np.asarray(sim.checkpoints), np.asarray(gpu.checkpoints), layout, ctas, rounds)
    if plan.splits > 1:
        stats = [s for s in stats if s.checkpoint is not Checkpoint.SO]
    work = workspace_stats(sim, gpu) if plan.splits > 1 else None
    features = caller.features() + [f"splits={plan.splits}"] + (["pack_gqa"] if plan.unpacked is not None else [])
    b, h, nq, d = np.shape(q)
    return CompareReport(cfg, False, (b, h, nq, np.shape(k)[2], d), tuple(int(c) for c in ctas), tuple(stats),
                         output_stats(sim.o, gpu.o, sim.lse, gpu.lse, cfg.dtype), tuple(features), work)
