"""fa_hw.forward: the FlashAttention-2 forward pass on the GPU, with the simulator's signature.

    out = fa_hw.forward(q, k, v, causal=False, scale=None, config=None)
    out.o    [B, H, Nq, d] float16        out.lse  [B, H, Nq] float32 (natural log)

O and LSE come back in the inputs' kind (numpy, torch, cupy; see fa_hw.tensors). config=None
means the seed configuration at the inputs' head_dim. With `checkpoint_ctas` (linear CTA ids
m_block + n_m_blocks * bh) the debug build runs instead and `out.checkpoints` holds the buffer
uint32 [cta_sel, checkpoint, round, thread, word] of fa_sim/checkpoints.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fa_sim.checkpoints import CHECKPOINTS, CheckpointLayout
from fa_sim.config import KernelConfig

from . import runtime
from .compile import KernelBuild
from .tensors import DeviceProblem, to_device


@dataclass(frozen=True)
class HwResult:
    o: object
    lse: object
    config: KernelConfig
    causal: bool
    scale: float
    kernel_ms: float
    registers: int
    checkpoints: np.ndarray | None = None
    checkpoint_ctas: tuple[int, ...] = ()


def prepare(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
            checkpoint_ctas=None, diagnostics: dict | None = None):
    """Validate and place the inputs, build the launch: -> (LaunchPlan, DeviceProblem, checkpoint
    extras). The plan can be launched and timed repeatedly (experiments/bench_hw.py, which alone
    passes `diagnostics`: KernelBuild's experiment fields)."""
    problem = to_device(q, k, v, causal, scale, config)  # validates first: ValueError needs no GPU
    ctas = _select_ctas(problem, checkpoint_ctas)
    build = KernelBuild(problem.config, bool(causal), runtime.device_arch(), ctas is not None, **(diagnostics or {}))
    b, h, nq, nk, _ = problem.shape
    ck_args, ck_host = _checkpoint_buffers(problem, ctas) if ctas is not None else ((), None)
    plan = runtime.LaunchPlan.make(build, (problem.q_ptr, problem.k_ptr, problem.v_ptr, problem.o_ptr,
                                           problem.lse_ptr), nq, nk, problem.scale, b * h, ck_args)
    return plan, problem, (ctas, ck_args, ck_host)


def forward(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
            *, checkpoint_ctas=None) -> HwResult:
    """Run fa2_fwd_kernel once on (q, k, v); see the module docstring."""
    plan, problem, (ctas, ck_args, ck_host) = prepare(q, k, v, causal, scale, config, checkpoint_ctas)
    ms = plan.run(problem.stream)
    checkpoints = None
    if ctas is not None:
        checkpoints = runtime.download(int(ck_args[0]), ck_host, problem.stream)
    o, lse = problem.results()
    return HwResult(o, lse, problem.config, bool(causal), problem.scale, ms, plan.loaded.registers,
                    checkpoints, tuple(ctas or ()))


def _select_ctas(problem: DeviceProblem, ctas) -> list[int] | None:
    if ctas is None:
        return None
    b, h, nq, _, _ = problem.shape
    n_ctas = -(-nq // problem.config.block_m) * b * h
    ctas = [int(c) for c in ctas]
    bad = [c for c in ctas if not 0 <= c < n_ctas]
    if not ctas or bad or len(set(ctas)) != len(ctas):
        raise ValueError(f"checkpoint_ctas must be distinct CTA ids in 0..{n_ctas - 1}, got {ctas}")
    return ctas


def _checkpoint_buffers(problem: DeviceProblem, ctas: list[int]):
    """Device buffer (zeroed) + CTA -> slot map (-1: not recorded), and the host array to fill."""
    b, h, nq, nk, _ = problem.shape
    cfg = problem.config
    layout = CheckpointLayout(cfg, -(-nk // cfg.block_n))
    host = layout.empty(len(ctas))
    assert host.shape[1] == len(CHECKPOINTS)
    stream = problem.stream
    buf = runtime.allocate(host.nbytes, stream)
    runtime.memset_zero(int(buf.handle), host.nbytes, stream)
    sel = np.full(-(-nq // cfg.block_m) * b * h, -1, dtype=np.int32)
    sel[np.asarray(ctas)] = np.arange(len(ctas), dtype=np.int32)
    sel_buf = runtime.upload(sel, stream)
    problem.keep += [buf, sel_buf]
    return (int(buf.handle), int(sel_buf.handle), layout.n_rounds), host
