"""The attention kernel through the PTX engine: fa_hw's fa2_fwd.cu (or a user's variant with the
same parameters and FA_* macros: a .cu, or a patch of fa2_fwd.cu) compiled for sm_80, run on the
same machine, labels, observers and checkpoint contract as the hand-written program.

- The kernel source, the config and the causal flag make the same fa_sim.contract.KernelBuild the
  GPU backend compiles (its FA_* macros, its check that a variant uses them), so the engine runs
  exactly the code the GPU runs.
- Checkpoints come from the kernel's own debug build (FA_CHECKPOINTS): its checkpoint stores are
  ordinary global stores into a buffer laid out as fa_sim/checkpoints.py says; after the run the
  buffer is handed to observers as CheckpointEvents. That build runs only when an observer wants
  checkpoints, for the CTAs observers name (`checkpoint_ctas`, None = all). Its extra loads and
  stores are real instructions of that build and are counted as such. Checkpoints name a CTA by
  its Q block (Problem.q_block_index; the build records under it), which differs from the grid
  index only under heavy_first with causal.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..checkpoints import CHECKPOINTS, ROUND0_ONLY, CheckpointLayout
from ..contract import KERNEL_NAME, KernelBuild, KernelSource, kernel_source
from ..events import CheckpointEvent
from ..hub import Hub
from ..kernels import FA2Labels, Pointers, Problem
from ..memory import GlobalMemory
from .budget import step_budget
from .launch import _globals, run_program
from .load import kernel_module
from .program import Program, build_program


@lru_cache(maxsize=64)
def _program(source: KernelSource, config, causal: bool, checkpoints: bool, kv_group: int = 1,
             window: tuple[int, int] = (-1, -1), softcap: float = 0.0, varlen: bool = False) -> Program:
    module = kernel_module(KernelBuild(config, causal, "sm_80", checkpoints, source, kv_group=kv_group,
                                       window=window, softcap=softcap, varlen=varlen))
    if KERNEL_NAME not in module.kernels:
        raise ValueError(f"{source.origin} defines no {KERNEL_NAME} (kernels: {', '.join(module.kernels)})")
    return build_program(module, KERNEL_NAME, source.text)


def attention_program(config, causal: bool, checkpoints: bool = False, kernel=None,
                      problem: Problem | None = None) -> Program:
    """The annotated program of the attention kernel for a config (cached by source text).
    kernel: None (fa2_fwd.cu), or a variant as fa_sim.contract.kernel_source takes it. problem: the
    launch whose features (heads_k, window, softcap: KernelBuild.of) the build compiles in."""
    if problem is None:
        return _program(kernel_source(kernel), config, bool(causal), bool(checkpoints))
    b = KernelBuild.of(problem, "sm_80")
    return _program(kernel_source(kernel), config, bool(causal), bool(checkpoints), b.kv_group, b.window, b.softcap,
                    b.varlen)


def wanted_checkpoint_ctas(hub: Hub, n_ctas: int) -> np.ndarray | None:
    """CTAs whose checkpoints some observer wants (None: no observer wants any)."""
    observers = [o for o in hub.observers if callable(getattr(o, "on_checkpoint", None))]
    if not observers:
        return None
    want: set[int] = set()
    for o in observers:
        ctas = getattr(o, "checkpoint_ctas", None)
        if ctas is None:
            return np.arange(n_ctas)
        want.update(int(c) for c in ctas if 0 <= c < n_ctas)
    return np.array(sorted(want), dtype=np.int64)


def run_attention(prob: Problem, memory: GlobalMemory, ptr: Pointers, hub: Hub, waves: list[np.ndarray], *,
                  kernel=None, mma_model=None, on_rounds=None, program: Program | None = None) -> None:
    """Run waves of the grid of `prob` (arrays of linear CTA ids: fa_sim.run.RunSpec.waves, a shard's
    of them, or any CTAs) on the PTX engine; q, k, v, o, lse are buffers of `memory` at `ptr`.
    `on_rounds(n)`: progress (n CTAs started a round). The checkpoint buffer keeps its slots for
    every wanted CTA of the grid, so addresses do not depend on the waves; each wave's checkpoints
    reach observers after that wave. `program`: run this build of the kernel instead of the one
    `prob` selects (fa_sim.timing's probes: a window build whose sides never bind at the probe's
    sizes); checkpoints need the one `prob` selects."""
    cfg = prob.config
    sel = wanted_checkpoint_ctas(hub, prob.n_ctas)
    if program is not None and sel is not None:
        raise ValueError("run_attention: checkpoints come from the build the problem selects, not a given program")
    program = attention_program(cfg, prob.causal, sel is not None, kernel, prob) if program is None else program
    args = [ptr.q, ptr.k, ptr.v, ptr.o, ptr.lse, np.int32(prob.seqlen_q), np.int32(prob.seqlen_k),
            np.float32(prob.scale)]
    if prob.varlen:  # FA_VARLEN: the sequences' offsets, int32 (the scalars above hold the totals)
        args[5:7] = [np.int32(prob.total_q), np.int32(prob.total_k)]
        args += [memory.alloc(name, np.array(cu, np.int32)).base for name, cu in zip(("cu_seqlens_q", "cu_seqlens_k"),
                                                                                      prob.cu_seqlens)]
    ck = None
    if sel is not None:
        layout = CheckpointLayout(cfg, prob.n_rounds)
        ck = memory.alloc("ck_buf", layout.empty(len(sel)))
        slot = np.full(prob.n_ctas, -1, np.int32)
        slot[sel] = np.arange(len(sel), dtype=np.int32)
        args += [ck.base, memory.alloc("ck_sel", slot).base, np.int32(prob.n_rounds)]
    params = _pack(program, args)
    nq, nk = (prob.total_q, prob.total_k) if prob.varlen else (prob.seqlen_q, prob.seqlen_k)  # rows per head
    labels = FA2Labels(cfg, {"Q": nq, "K": nk, "V": nk, "O": nq, "LSE": nq}, program)
    grid = prob.launch_grid
    budget = step_budget(len(program.kernel.instructions), prob.n_rounds)  # FLASHSIM_MAX_STEPS overrides it
    symbols = _globals(program, memory)  # a variant's __device__ / __constant__ variables
    for wave in waves:
        run_program(program, grid, (cfg.n_threads, 1, 1), cfg.smem_bytes, params, memory, symbols, hub,
                    mma_model=mma_model, labels=labels, on_rounds=on_rounds, waves=[wave], budget=budget)
        if ck is not None:
            ran = prob.q_block_index(sel)  # the grid CTA that computes each selected Q block (heavy_first)
            rows = np.isin(ran, wave)
            _emit_checkpoints(prob, hub, ck.array[rows], sel[rows])


def _pack(program: Program, args: list) -> bytes:
    out = bytearray(max(p.offset + p.size for p in program.kernel.params))
    if len(args) != len(program.kernel.params):
        raise ValueError(f"{program.kernel.name} takes {len(program.kernel.params)} parameters, not the "
                         f"{len(args)} of fa2_fwd_kernel (is the --kernel file a variant of fa2_fwd.cu?)")
    for p, a in zip(program.kernel.params, args):
        raw = np.uint64(a).tobytes() if isinstance(a, int) else np.asarray(a).tobytes()
        if len(raw) != p.size:
            raise ValueError(f"parameter {p.name} of {program.kernel.name} is .{p.type}; fa2_fwd_kernel's "
                             f"parameter there takes {len(raw)} bytes")
        out[p.offset: p.offset + p.size] = raw
    return bytes(out)


def _emit_checkpoints(prob: Problem, hub: Hub, buf: np.ndarray, sel: np.ndarray) -> None:
    """The debug build's buffer [slot, checkpoint, round, thread, word] as CheckpointEvents."""
    # [S] rounds each selected Q block ran (packed: its sequence's; 0 for a CTA that exits at once)
    rounds = prob.rounds_per_cta(prob.q_block_index(sel))
    for ck_i, ck in enumerate(CHECKPOINTS):
        for rnd in range(1 if ck in ROUND0_ONLY else prob.n_rounds):
            listeners = hub.checkpoint_listeners(ck, rnd)
            ran = rounds > rnd
            if listeners and ran.any():
                ev = CheckpointEvent(ck, rnd, sel[ran], np.ascontiguousarray(buf[ran, ck_i, rnd]))
                hub.emit_checkpoint(listeners, ev)
