"""fa_hw.forward: the FlashAttention-2 forward pass on the GPU, with the simulator's signature.

    out = fa_hw.forward(q, k, v, causal=False, scale=None, config=None)
    out.o    [B, H, Nq, d] float16        out.lse  [B, H, Nq] float32 (natural log)

O and LSE come back in the inputs' kind (numpy, torch, cupy; see fa_hw.tensors). Inputs follow
fa_sim.validate's policy, the simulator's: fp16, or values fp16 holds exactly (float32, bf16,
integers); a value fp16 would round or overflow (bf16 past 65504) is a ValueError naming it and the
fix (convert explicitly), never a silent conversion. `dtype` ("fp16" or "bf16"; issue 38) picks the
kernel's 16-bit type: None takes bf16 for bfloat16 inputs (torch.bfloat16), else config.dtype, else
fp16 (validate.resolve_dtype; fp16 and bf16 inputs mixed is a ValueError); a bf16 run compiles
fa2_fwd.cu with FA_BF16 and returns O as torch.bfloat16 for torch, float32 (exact) for numpy/cupy.
config=None means the seed configuration at the inputs' head_dim, a KernelConfig or its tag the
config it names; config="auto" the fastest measured config of this GPU for the problem's head_dim,
causal flag and size (fa_hw.tuned: the shipped table; on a GPU without one, the candidates
fa_hw.autotune times on these very inputs, with their features and dtype, once per problem class,
cached on disk;
out.config says which ran); config.softmax picks the exp2 arithmetic (SCHEDULE.md). With `checkpoint_ctas` (linear CTA ids
m_block + n_m_blocks * bh) the debug build runs instead and `out.checkpoints` holds the buffer
uint32 [cta_sel, checkpoint, round, thread, word] of fa_sim/checkpoints.py. Issue 38's features as
fa_sim.simulate takes them: k, v with H_k heads dividing q's H (grouped-query attention),
`window=(left, right)`, `softcap=C` (docs/features.md); a packed variable-length batch with
`cu_seqlens_q`, `cu_seqlens_k` (int32 offsets; q [total_q, H, d], k, v [total_k, H_k, d]; out.o
[total_q, H, d], out.lse [H, total_q]; fa_sim.varlen: the inputs are copied head-major first);
split-KV decoding with `splits` (an integer or "auto") and `cache_seqlens` (int32 [B], each
sequence's keys of the cache k, v): the split kernel and the combine of fa_hw.splitkv (out.splits
says how many ran; kernel_ms covers both; `pack_gqa` None/True/False: the Q heads of a K/V head as
the rows of one, fa_sim.splitkv; with `checkpoint_ctas`, linear ids of the split grid, the split
kernel's debug build records them and out.workspace holds (o_accum, lse_accum), every split's
partial O and LSE; config="auto": fa_hw.tuned_decode's config for the decode class, with the
splits "auto" chooses for it - splits None means "auto" then - and out.config_source says where it
came from). Not both: a packed batch takes no splits. A packed batch's `checkpoint_ctas`
are ids of its grid (ceil(max Nq / block_m), H, B), blockIdx.x + n_m_blocks (h + H b).

fa_hw.forward is the direct, synchronous API: it checks values, times its launch with CUDA events
and synchronises (a fault is a KernelFault naming the build), so that kernel_ms is the kernel's
time. `enqueue_forward` is fa_hw.attention's asynchronous path on torch tensors (no value reads, no
event, no synchronisation: fa_hw.runtime's module docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fa_sim.checkpoints import CHECKPOINTS, CheckpointLayout
from fa_sim.config import SMEM_LIMIT_BYTES_BY_ARCH, KernelConfig
from fa_sim import validate, varlen
from fa_sim.contract import KernelBuild, kernel_source
from fa_sim.problem import Problem

from . import runtime
from .tensors import (DeviceProblem, _outputs_shape, check, check_kernel_tensors, check_torch_devices,
                      choose_auto, to_device)
from .tuned import is_auto


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
    splits: int | None = None  # split-KV decoding (fa_hw.splitkv): the splits that ran
    workspace: tuple[np.ndarray, np.ndarray] | None = None  # split-KV with checkpoint_ctas: (o_accum, lse_accum)
    config_source: str | None = None  # split-KV with config="auto": where the config came from (fa_hw.tuned_decode)


def prepare(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | str | None = None,
            checkpoint_ctas=None, diagnostics: dict | None = None, kernel=None, window=None, softcap=None,
            dtype: str | None = None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Validate and place the inputs, build the launch: -> (LaunchPlan, DeviceProblem, checkpoint
    extras). The plan can be launched and timed repeatedly (experiments/bench_hw.py, which alone
    passes `diagnostics`: KernelBuild's experiment fields)."""
    source = None if kernel is None else kernel_source(kernel)  # checked before any work
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k (int32, batch + 1 offsets)")
    inputs, kind, prob, auto = check(q, k, v, causal, scale, config, window, softcap, dtype,
                                     (cu_seqlens_q, cu_seqlens_k) if packed else None)  # before any device call
    ctas = _select_ctas(prob, checkpoint_ctas, in_grid=not auto)  # "auto": the grid is the chosen config's
    if not auto and prob.config.smem_bytes > min(SMEM_LIMIT_BYTES_BY_ARCH.values()):
        # a config over this GPU's shared memory per CTA (sm_80: 163 KiB): one line before any upload (a config
        # every arch holds asks the device nothing here)
        prob.config.check_arch(runtime.device_arch())
    dev = to_device(inputs, kind, prob)
    if auto:
        prob = choose_auto(dev)
        ctas = _select_ctas(prob, checkpoint_ctas)
    build = KernelBuild(prob.config, prob.causal, runtime.device_arch(), ctas is not None, source,
                        **(diagnostics or {}), kv_group=prob.kv_group, window=(prob.window_left, prob.window_right),
                        softcap=prob.softcap, varlen=prob.varlen)
    ck_args, ck_host = _checkpoint_buffers(dev, ctas) if ctas is not None else ((), None)
    cu_args = ()
    if prob.varlen:  # the offsets on the device, int32 (the kernel's cu_seqlens_q / cu_seqlens_k)
        cu_bufs = [runtime.upload(np.array(cu, np.int32), dev.stream) for cu in prob.cu_seqlens]
        dev.keep += cu_bufs
        cu_args = tuple(int(b.handle) for b in cu_bufs)
    plan = runtime.LaunchPlan.make(build, (dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr), prob, ck_args,
                                   cu_args)
    return plan, dev, (ctas, ck_args, ck_host)


def forward(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | str | None = None,
            *, window: tuple[int, int] | None = None, softcap: float | None = None, checkpoint_ctas=None,
            kernel=None, dtype: str | None = None, cu_seqlens_q=None, cu_seqlens_k=None,
            splits: int | str | None = None, cache_seqlens=None, pack_gqa: bool | None = None) -> HwResult:
    """Run fa2_fwd_kernel once on (q, k, v); see the module docstring. `kernel`: a variant of
    fa2_fwd.cu to compile instead of fa_hw's own (what `fa hw --kernel` passes): the path of a .cu
    or of a .patch/.diff against fa2_fwd.cu, or a fa_sim.contract.KernelSource."""
    if pack_gqa is not None and splits is None and cache_seqlens is None:
        raise ValueError("pack_gqa applies to split-KV decoding: pass splits= or cache_seqlens= with it")
    if splits is not None or cache_seqlens is not None:
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            raise ValueError("split-KV decoding (splits= / cache_seqlens=) takes a padded batch, not a packed one "
                             "(cu_seqlens_q / cu_seqlens_k): both use the kernel's grid z")
        if kernel is not None:
            raise ValueError("split-KV decoding (splits= / cache_seqlens=) runs fa_hw's own kernel without kernel=")
        from .splitkv import prepare_splitkv

        sp = prepare_splitkv(q, k, v, causal, scale, config, window=window, softcap=softcap, dtype=dtype,
                             splits=("auto" if is_auto(config) else 1) if splits is None else splits,
                             cache_seqlens=cache_seqlens,
                             pack_gqa=pack_gqa, checkpoint_ctas=checkpoint_ctas)
        ms = sp.run(sp.dev.stream)
        o, lse = sp.dev.results()
        rec = sp.recorded() if checkpoint_ctas is not None else {}
        return HwResult(o, lse, sp.dev.config, sp.dev.problem.causal, sp.dev.scale, ms, sp.registers,
                        rec.get("checkpoints"), sp.checkpoint_ctas, splits=sp.plan.splits,
                        workspace=(rec["o_accum"], rec["lse_accum"]) if rec else None, config_source=sp.source)
    plan, dev, (ctas, ck_args, ck_host) = prepare(q, k, v, causal, scale, config, checkpoint_ctas, kernel=kernel,
                                                  window=window, softcap=softcap, dtype=dtype,
                                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    ms = plan.run(dev.stream)
    checkpoints = None
    if ctas is not None:
        checkpoints = runtime.download(int(ck_args[0]), ck_host, dev.stream)
    o, lse = dev.results()
    if dev.problem.varlen:  # [1, H, total_q, d] -> [total_q, H, d]; LSE [H, total_q]
        o, lse = varlen.packed_o(o), lse.reshape(dev.problem.heads, dev.problem.total_q)
    return HwResult(o, lse, dev.config, dev.problem.causal, dev.scale, ms, plan.loaded.registers,
                    checkpoints, tuple(ctas or ()))


def enqueue_forward(q, k, v, causal: bool = False, scale: float | None = None):
    """fa_hw.attention's forward: (O of the inputs' 16-bit type, LSE float32) torch tensors on q's
    device, fa2_fwd.cu (the seed config at the inputs' head_dim and type) enqueued on torch's current stream and not waited for: no
    CUDA event, no synchronisation (fa_hw.runtime's launch_kernel, timed=False; a fault while the
    kernel runs surfaces at torch's next synchronisation). q, k, v must be contiguous float16 (or all
    bfloat16) torch CUDA tensors on fa_hw's GPU; checked: those, the shapes, causal, scale, the grid's
    limits - nothing that reads a value (no NaN/Inf or bf16 range check: fa_hw.attention's
    check_finite does the first, fa_hw.forward checks values). O and LSE come from torch's allocator on that stream.
    As enqueue_backward: the checks that a call's key fixes (scalars and their types, each tensor's
    type, shape, dtype, device) run once per key, whose launch (runtime.LaunchPlan.make's kernel,
    grid, scalar arguments; its LaunchConfig) is kept as a _TorchForward; contiguity is checked per call."""
    return _PLANS.get((causal, scale), (q, k, v), lambda: _checked_forward(q, k, v, causal, scale)).enqueue(q, k, v)


#: enqueue_forward's plans (runtime.PlanCache), each stored after its key's first call passed every check.
_PLANS = runtime.PlanCache()


def _checked_forward(q, k, v, causal, scale) -> "_TorchForward":
    """Every check of enqueue_forward (one ValueError line), then its key's _TorchForward."""
    bf16 = str(q.dtype) == "torch.bfloat16"  # the run's type is the tensors': all three alike
    check_kernel_tensors("fa_hw.attention", "bfloat16" if bf16 else "float16", q=q, k=k, v=v)
    prob = validate.make_problem(q.shape, k.shape, v.shape, causal, scale, None, dtype="bf16" if bf16 else "fp16")
    check_torch_devices(q, k, v)
    plan = runtime.LaunchPlan.make(KernelBuild.of(prob, runtime.device_arch()), (0,) * 5, prob)  # pointers per call
    return _TorchForward(*_outputs_shape(prob), "bf16" if bf16 else "fp16", plan.loaded.kernel,
                         runtime.launch_config(plan.grid, plan.block, plan.smem_bytes), plan.describe(), plan.args[5:])


@dataclass(frozen=True)
class _TorchForward:
    """enqueue_forward's launch of one key, ready but for the pointers (torch_problem's outputs)."""

    o_shape: tuple
    lse_shape: tuple
    dtype: str  # "fp16" or "bf16": O's
    kernel: object
    config: object  # cuda.core LaunchConfig
    what: str  # the launch's words in a KernelFault
    scalars: tuple  # LaunchPlan.make's arguments after the five pointers

    def enqueue(self, q, k, v):
        import torch

        dev = q.device
        o = torch.empty(self.o_shape, dtype=torch.bfloat16 if self.dtype == "bf16" else torch.float16, device=dev)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=dev)
        stream = runtime.torch_stream(dev)
        runtime.enqueue_launch(stream, self.kernel, self.config,
                               (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), *self.scalars),
                               self.what)
        return o, lse


def _select_ctas(problem: Problem, ctas, in_grid: bool = True) -> list[int] | None:
    """checkpoint_ctas: None, or distinct integer CTA ids (Python or numpy, never bool or float)
    inside the grid (`in_grid` False: the grid is not known yet, config="auto"; all but the range)."""
    if ctas is None:
        return None
    accepted = f"distinct integer CTA ids in 0..{problem.n_ctas - 1}" if in_grid else "distinct integer CTA ids"
    if isinstance(ctas, (str, bytes)) or not hasattr(ctas, "__iter__"):
        raise ValueError(f"checkpoint_ctas must be a sequence of {accepted}, got {type(ctas).__name__} {ctas!r:.60}")
    ctas = list(ctas)
    odd = [c for c in ctas if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer))]
    if odd:
        raise ValueError(f"checkpoint_ctas must be {accepted}, got {type(odd[0]).__name__} {odd[0]!r:.60}")
    ctas = [int(c) for c in ctas]
    bad = [c for c in ctas if not 0 <= c < (problem.n_ctas if in_grid else c + 1)]
    if not ctas or bad or len(set(ctas)) != len(ctas):
        shown = ", ".join(map(str, ctas[:8])) + (f", ... {len(ctas) - 8} more" if len(ctas) > 8 else "")
        raise ValueError(f"checkpoint_ctas must be {accepted}, got [{shown}]")
    return ctas


def _checkpoint_buffers(dev: DeviceProblem, ctas: list[int]):
    """Device buffer (zeroed) + CTA -> slot map (-1: not recorded), and the host array to fill."""
    prob = dev.problem
    layout = CheckpointLayout(prob.config, prob.n_rounds)
    host = layout.empty(len(ctas))
    assert host.shape[1] == len(CHECKPOINTS)
    stream = dev.stream
    buf = runtime.allocate(host.nbytes, stream)
    runtime.memset_zero(int(buf.handle), host.nbytes, stream)
    sel = np.full(prob.n_ctas, -1, dtype=np.int32)
    sel[np.asarray(ctas)] = np.arange(len(ctas), dtype=np.int32)
    sel_buf = runtime.upload(sel, stream)
    dev.keep += [buf, sel_buf]
    return (int(buf.handle), int(sel_buf.handle), layout.n_rounds), host
