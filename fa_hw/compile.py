"""Compile fa_hw/kernels/fa2_fwd.cu with NVRTC through cuda.core, to a cubin for one exact arch.

One `KernelBuild` (KernelConfig + causal + arch + debug checkpoints) is one NVRTC program: the
config becomes FA_* macros, so every shape constant in the kernel is compile-time. Cubins are
cached on disk under $FLASHSIM_CACHE or ~/.cache/flashsim, keyed by the cache format, the source
text, the macros, the NVRTC options and the NVRTC version. Compiling needs no GPU (cuda-core >= 1.0
produces cubin without a driver when the arch is given). A cubin for the exact arch is what runs: a
PTX from an NVRTC newer than the driver does not load, and an sm_80 cubin does not run on sm_90
(shared/notes/gpu_facts.md).

Registers and local memory come from the cubin (fa_hw.cubin), never from ptxas's log: NVRTC 13
returns an empty log when its own compute cache (~/.nv/ComputeCache) already holds the program.
The log is kept for reading only (`CompiledKernel.log`, possibly empty).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fa_sim.cache import cache_key, cache_root, store_atomic
from fa_sim.checkpoints import CHECKPOINTS, CheckpointLayout
from fa_sim.config import KernelConfig, SoftmaxForm
from fa_sim.ptx.nvrtc import nvrtc_version

from .cubin import CubinError, ResourceUsage
from .errors import CompileError

SOURCE_PATH = Path(__file__).parent / "kernels" / "fa2_fwd.cu"
KERNEL_NAME = "fa2_fwd_kernel"
REGISTER_FILE = 65536  # 32-bit registers per SM, sm_80 and sm_90
SMEM_PER_SM = 164 * 1024  # sm_80's shared memory per SM (sm_90 has 228 KB)
SMEM_RESERVED = 1024  # the driver's per-CTA reservation
CACHE_FORMAT = 2  # 2: resource usage read from the cubin; 1 (unversioned): parsed from the log


@dataclass(frozen=True)
class KernelBuild:
    """Everything that selects one compiled kernel."""

    config: KernelConfig = KernelConfig()
    causal: bool = False
    arch: str = "sm_90"
    checkpoints: bool = False
    source: str = ""  # path of a variant of fa2_fwd.cu (same parameters and FA_* macros); "" = fa_hw's own
    # Performance experiments only (experiments/bench_hw.py --diagnose), never set by forward():
    min_blocks_override: int = 0  # __launch_bounds__ minimum CTAs per SM instead of the heuristic
    diag_accurate_exp: bool = False  # the spec's literal expf instead of the exp2 form: not modelled by fa_sim
    lineinfo: bool = False  # -lineinfo: CUDA source lines for nvdisasm -g (the same code; fa_sim.timing)

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
                   FA_DEFER_PV=int(cfg.defer_pv))
        if self.diag_accurate_exp:
            out["FA_DIAG_ACCURATE_EXP"] = 1
        if self.checkpoints:  # the buffer layout of fa_sim/checkpoints.py
            out["FA_CK_COUNT"] = len(CHECKPOINTS)
            out["FA_CK_WORDS"] = CheckpointLayout(cfg, 1).words
            out.update({f"FA_CK_{ck.name}": CheckpointLayout.index(ck) for ck in CHECKPOINTS})
        return out

    def describe(self) -> str:
        extra = ", causal" if self.causal else ""
        extra += ", checkpoints" if self.checkpoints else ""
        extra += f", min_blocks={self.min_blocks_override}" if self.min_blocks_override else ""
        extra += ", DIAGNOSTIC accurate expf" if self.diag_accurate_exp else ""
        extra += f", from {self.source}" if self.source else ""
        return f"KernelConfig({self.config.describe()}){extra} for {self.arch}"

    @property
    def source_path(self) -> Path:
        return Path(self.source) if self.source else SOURCE_PATH


def min_blocks_per_sm(config: KernelConfig) -> int:
    """__launch_bounds__ occupancy target: CTAs per SM that still leave each thread the registers
    for its accumulators (tCrS + tCrO, 4 per m16n8 atom) plus 64 for fragments, addresses and
    softmax temporaries, capped by shared memory. Seed config: 64 + 64 = 128 registers, 4 CTAs."""
    accumulators = 4 * config.m_repeats * (config.s_n_tiles + config.o_n_tiles)
    by_regs = REGISTER_FILE // (config.n_threads * (accumulators + 64))
    by_smem = SMEM_PER_SM // (config.smem_bytes + SMEM_RESERVED)
    return max(1, min(by_regs, by_smem))


@dataclass(frozen=True)
class CompiledKernel:
    build: KernelBuild
    cubin: bytes
    log: str
    usage: ResourceUsage

    def object_code(self):
        from cuda.core import ObjectCode

        return ObjectCode.from_cubin(self.cubin, name=self.build.config.tag)

    def sass(self) -> str:
        from .sass import disassemble

        return disassemble(self.cubin)


def cache_dir() -> Path:
    return cache_root() / "cubin"


def _options(build: KernelBuild):
    from cuda.core import ProgramOptions

    return ProgramOptions(name="fa2_fwd.cu", arch=build.arch, std="c++17", ptxas_options=["-v"], lineinfo=build.lineinfo,
                          define_macro=[(k, str(v)) for k, v in sorted(build.macros().items())])


def _cache_key(source: str, build: KernelBuild) -> str:
    return cache_key(format=CACHE_FORMAT, source=source, macros=build.macros(), arch=build.arch,
                     options=["std=c++17", "ptxas -v"] + ["lineinfo"] * build.lineinfo, nvrtc=nvrtc_version())


class _Log:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)


def _nvrtc(source: str, build: KernelBuild) -> tuple[bytes, str]:
    from cuda.core import Program

    log = _Log()
    try:
        obj = Program(source, "c++", _options(build)).compile("cubin", logs=log)
    except Exception as exc:  # NVRTCError carries the compiler log in its message
        text = str(exc).rstrip("\x00")
        first = next((ln.strip() for ln in text.splitlines() if "error" in ln), text.splitlines()[0])
        raise CompileError(f"NVRTC failed to compile {build.describe()}: {first}", text) from None
    return bytes(obj.code), "".join(log.parts).rstrip("\x00")


def compile_kernel(config: KernelConfig = KernelConfig(), *, causal: bool = False, arch: str | None = None,
                   checkpoints: bool = False, use_cache: bool = True) -> CompiledKernel:
    """Cubin of fa2_fwd.cu for `config`; arch=None means the current GPU's exact arch."""
    if arch is None:
        from .runtime import device_arch

        arch = device_arch()
    return compile_build(KernelBuild(config, bool(causal), arch, bool(checkpoints)), use_cache=use_cache)


#: Macro values a kernel may ignore without changing what it computes: the spec's schedule.
NEUTRAL_MACROS = {"FA_KV_STAGES": 1, "FA_Q_IN_REGS": 0, "FA_HEAVY_FIRST": 0, "FA_DEFER_PV": 0,
                  "FA_SOFTMAX_FFMA": 0, "FA_MIN_BLOCKS": None}


def check_macros_used(source: str, macros: dict[str, int], name: str) -> None:
    """A variant .cu that never mentions a macro its config sets to a non-neutral value would
    silently build something else (an older copy of fa2_fwd.cu and kv_stages=2, say): refuse it."""
    missing = [f"{k}={v}" for k, v in macros.items()
               if k not in source and (k not in NEUTRAL_MACROS or (NEUTRAL_MACROS[k] not in (None, v)))]
    if missing:
        raise ValueError(f"{name} does not use {', '.join(missing)}, which this config needs; "
                         "start the variant from the current fa_hw/kernels/fa2_fwd.cu or choose a config "
                         "without those options")


def compile_build(build: KernelBuild, *, use_cache: bool = True) -> CompiledKernel:
    """Cubin for one KernelBuild, through the on-disk cache (keyed by the source text)."""
    try:
        source = build.source_path.read_text()
    except OSError as exc:
        raise CompileError(f"cannot read the kernel source {build.source_path}: {exc.strerror or exc}") from None
    if build.source:
        check_macros_used(source, build.macros(), build.source)
    path = cache_dir() / f"{_cache_key(source, build)}.cubin"
    meta = path.with_suffix(".json")
    if use_cache and path.exists() and meta.exists():
        cubin = path.read_bytes()
        try:
            return CompiledKernel(build, cubin, json.loads(meta.read_text()).get("log", ""), _usage(cubin, build))
        except (ValueError, CompileError):  # a truncated or foreign entry: compile afresh
            pass
    cubin, log = _nvrtc(source, build)
    out = CompiledKernel(build, cubin, log, _usage(cubin, build))
    if use_cache:
        _store(path, cubin, json.dumps({"format": CACHE_FORMAT, "log": log, "build": build.describe()}))
    return out


def compile_many(builds, workers: int | None = None) -> list[CompiledKernel]:
    """compile_build for many builds in parallel processes (one NVRTC compile uses one core),
    filling the on-disk cache: what a machine with many cores does before a test run."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    builds = list(builds)
    if workers == 1 or len(builds) < 2:
        return [compile_build(b) for b in builds]
    # spawn, not fork: the caller may hold a CUDA context (device_arch()), which a fork must not copy
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(compile_build, builds))


def _usage(cubin: bytes, build: KernelBuild) -> ResourceUsage:
    try:
        return ResourceUsage.from_cubin(cubin, KERNEL_NAME)
    except CubinError as exc:
        raise CompileError(f"the cubin of {build.describe()} is unreadable: {exc}") from None


def _store(path: Path, cubin: bytes, meta: str) -> None:
    """Cubin first, metadata last: an entry counts only once both exist (fa_sim.cache writes each
    atomically and treats a read-only or full cache directory as no cache)."""
    if store_atomic(path, cubin):
        store_atomic(path.with_suffix(".json"), meta.encode())
