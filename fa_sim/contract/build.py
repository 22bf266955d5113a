"""One kernel build: a config, the causal flag, an arch and the debug checkpoints become the FA_*
macros of fa2_fwd.cu, so every shape constant of the kernel is compile-time.

Both backends build from a `KernelBuild`: the PTX engine compiles its macros to PTX for SM80
(nvrtc.kernel_ptx), fa_hw to a cubin for the GPU's exact arch (fa_hw.compile). A variant of the
kernel (`kernel`, a KernelSource) must use every macro its config sets to a value other than the
spec's (`check_macros_used`): an older copy of fa2_fwd.cu built with kv_stages=2, say, would
otherwise silently run the spec's schedule under a config that says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoints import CHECKPOINTS, CheckpointLayout
from ..config import KernelConfig, SoftmaxForm
from ..messages import listed
from .errors import KernelSourceError
from .occupancy import min_blocks_per_sm
from .source import SEED_NAME, KernelSource, seed_source

#: Macro values a kernel may ignore without changing what it computes: the spec's schedule.
NEUTRAL_MACROS = {"FA_KV_STAGES": 1, "FA_Q_IN_REGS": 0, "FA_HEAVY_FIRST": 0, "FA_DEFER_PV": 0,
                  "FA_SOFTMAX_FFMA": 0, "FA_MIN_BLOCKS": None,
                  "FA_POLY_EXP": 0, "FA_LAZY_SUM": 0, "FA_PINGPONG": 0, "FA_BF16": 0}


@dataclass(frozen=True)
class KernelBuild:
    """Everything that selects one compiled kernel."""

    config: KernelConfig = KernelConfig()
    causal: bool = False
    arch: str = "sm_90"
    checkpoints: bool = False
    kernel: KernelSource | None = None  # a variant of fa2_fwd.cu (same parameters and FA_* macros); None = the seed
    # Performance experiments only (experiments/bench_hw.py --diagnose), never set by forward():
    min_blocks_override: int = 0  # __launch_bounds__ minimum CTAs per SM instead of the heuristic
    diag_accurate_exp: bool = False  # the spec's literal expf instead of the exp2 form: not modelled by fa_sim
    lineinfo: bool = False  # -lineinfo: CUDA source lines for nvdisasm -g (the same code; fa_sim.timing)
    # Issue 38's features (fa_sim.problem.Problem; their macros are set only away from these defaults,
    # so a build without them is the kernel it was):
    kv_group: int = 1  # Q heads per K/V head (FA_KV_GROUP)
    window: tuple[int, int] = (-1, -1)  # effective (left, right) window (FA_WINDOW_LEFT / _RIGHT)
    softcap: float = 0.0  # the cap, as fp32 (FA_SOFTCAP: its bits); 0 = none
    varlen: bool = False  # a packed variable-length batch (FA_VARLEN: cu_seqlens_q / _k parameters)
    splitkv: bool = False  # split-KV decoding against a KV cache (FA_SPLITKV; fa_sim.splitkv)

    @classmethod
    def of(cls, problem, arch: str, checkpoints: bool = False, kernel: KernelSource | None = None) -> "KernelBuild":
        """The build that runs `problem` (a fa_sim.problem.Problem): its config, causal flag and features."""
        return cls(problem.config, problem.causal, arch, bool(checkpoints), kernel, kv_group=problem.kv_group,
                   window=(problem.window_left, problem.window_right), softcap=problem.softcap,
                   varlen=problem.varlen)

    def __post_init__(self) -> None:
        if self.kernel is not None and not isinstance(self.kernel, KernelSource):
            raise KernelSourceError("KernelBuild.kernel takes a KernelSource (fa_sim.contract.kernel_source(path)), "
                                    f"not {type(self.kernel).__name__}")

    @property
    def min_blocks(self) -> int:
        """The diagnostic override, else the config's min_blocks, else the heuristic."""
        return self.min_blocks_override or self.config.min_blocks or min_blocks_per_sm(self.config)

    def macros(self) -> dict[str, int]:
        cfg = self.config
        b, m, s = cfg.swizzle_bms or (0, 3, 0)
        out = dict(FA_BLOCK_M=cfg.block_m, FA_BLOCK_N=cfg.block_n, FA_HEAD_DIM=cfg.head_dim,
                   FA_N_WARPS=cfg.n_warps, FA_ROW_PITCH=cfg.row_pitch, FA_SWZ_B=b, FA_SWZ_M=m,
                   FA_SWZ_S=s, FA_SK_OFFSET=cfg.sk_offset_bytes, FA_SV_OFFSET=cfg.sv_offset_bytes,
                   FA_SMEM_BYTES=cfg.smem_bytes, FA_CAUSAL=int(self.causal),
                   FA_MIN_BLOCKS=self.min_blocks, FA_CHECKPOINTS=int(self.checkpoints),
                   FA_SOFTMAX_FFMA=int(cfg.softmax is SoftmaxForm.FFMA), FA_KV_STAGES=cfg.kv_stages,
                   FA_Q_IN_REGS=int(cfg.q_in_regs), FA_HEAVY_FIRST=int(cfg.heavy_first),
                   FA_DEFER_PV=int(cfg.defer_pv), FA_POLY_EXP=cfg.poly_exp,
                   FA_LAZY_SUM=int(cfg.lazy_sum), FA_PINGPONG=int(cfg.pingpong),
                   FA_BF16=int(cfg.dtype == "bf16"))
        if self.kv_group != 1:
            out["FA_KV_GROUP"] = int(self.kv_group)
        if cfg.swizzle_atom_cols != cfg.row_pitch:  # head_dim 96, 160, 192: swizzle atoms narrower than a row
            out["FA_SWZ_W"] = cfg.swizzle_atom_cols
        if self.window[0] >= 0:
            out["FA_WINDOW_LEFT"] = int(self.window[0])
        if self.window[1] >= 0:
            out["FA_WINDOW_RIGHT"] = int(self.window[1])
        if self.softcap:
            out["FA_SOFTCAP"] = int(np.float32(self.softcap).view(np.uint32))
        if self.varlen:
            out["FA_VARLEN"] = 1
        if self.splitkv:
            out["FA_SPLITKV"] = 1
        if self.diag_accurate_exp:
            out["FA_DIAG_ACCURATE_EXP"] = 1
        if self.checkpoints:  # the buffer layout of fa_sim/checkpoints.py
            out["FA_CK_COUNT"] = len(CHECKPOINTS)
            out["FA_CK_WORDS"] = CheckpointLayout(cfg, 1).words
            out.update({f"FA_CK_{ck.name}": CheckpointLayout.index(ck) for ck in CHECKPOINTS})
        return out

    def source(self) -> KernelSource:
        """The CUDA C++ this build compiles: the variant, checked against the macros, or the seed."""
        if self.kernel is None or self.kernel.is_seed:
            return self.kernel or seed_source()
        check_macros_used(self.kernel.text, self.macros(), self.kernel.name)
        return self.kernel

    def describe(self) -> str:
        extra = ", causal" if self.causal else ""
        extra += f", heads per K/V head {self.kv_group}" if self.kv_group != 1 else ""
        extra += f", window {self.window}" if self.window != (-1, -1) else ""
        extra += f", softcap {self.softcap:g}" if self.softcap else ""
        extra += ", packed (varlen)" if self.varlen else ""
        extra += ", split-KV" if self.splitkv else ""
        extra += ", checkpoints" if self.checkpoints else ""
        extra += f", min_blocks={self.min_blocks_override}" if self.min_blocks_override else ""
        extra += ", DIAGNOSTIC accurate expf" if self.diag_accurate_exp else ""
        extra += f", from {self.kernel.origin}" if self.kernel is not None and not self.kernel.is_seed else ""
        return f"KernelConfig({self.config.describe()}){extra} for {self.arch}"


def check_macros_used(source: str, macros: dict[str, int], name: str) -> None:
    """A variant that never mentions a macro its config sets to a non-neutral value would silently
    build something else (module docstring): refuse it, naming the macros."""
    missing = [f"{k}={v}" for k, v in macros.items()
               if k not in source and (k not in NEUTRAL_MACROS or (NEUTRAL_MACROS[k] not in (None, v)))]
    if missing:
        raise KernelSourceError(f"{name} does not use {listed(missing)}, which this config needs; start the "
                                f"variant from the current fa_hw/kernels/{SEED_NAME} or choose a config without "
                                "those options")
