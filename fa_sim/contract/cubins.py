"""The cubin of one KernelBuild: fa2_fwd.cu (or a variant) compiled for one exact arch by the
contract's NVRTC wrapper (nvrtc.py), cached on disk. Both the GPU backend (fa_hw, which launches it)
and the timing model (fa_sim.timing, which reads its SASS) build cubins here; compiling needs no GPU.

One `KernelBuild` (KernelConfig + causal + arch + debug checkpoints + kernel source) is one NVRTC
program: the config becomes FA_* macros, so every shape constant in the kernel is compile-time.
Cubins are cached under $FLASHSIM_CACHE or ~/.cache/flashsim, keyed by the cache format, the source
text, the macros, the NVRTC options, the NVRTC version and CUDA's header wheels (nvrtc.cuda_headers).
A cubin for the exact arch is what runs: a PTX from an NVRTC newer than the driver does not load, and
an sm_80 cubin does not run on sm_90 (docs/hardware_facts.md).

Registers and local memory come from the cubin (cubin.py), never from ptxas's log: NVRTC 13
returns an empty log when its own compute cache (~/.nv/ComputeCache) already holds the program.
The log is kept for reading only (`CompiledKernel.log`, possibly empty).
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_key, cache_root, store_atomic
from .build import KernelBuild
from .cubin import CubinError, ResourceUsage
from .errors import CompileError
from .nvrtc import NvrtcError, compile_cubin, cuda_headers, nvrtc_version
from .sass import disassemble
from .source import KERNEL_NAME

PROGRAM_NAME = "fa2_fwd.cu"  # NVRTC's name for every cubin program (a variant's own name is in describe())
CACHE_FORMAT = 2  # 2: resource usage read from the cubin; 1 (unversioned): parsed from the log


@dataclass(frozen=True)
class CompiledKernel:
    build: KernelBuild
    cubin: bytes
    log: str
    usage: ResourceUsage

    def object_code(self):
        from cuda.core import ObjectCode  # lazy on purpose: loading needs the hw extra, compiling does not

        return ObjectCode.from_cubin(self.cubin, name=self.build.config.tag)

    def sass(self) -> str:
        return disassemble(self.cubin)


def cache_dir() -> Path:
    return cache_root() / "cubin"


def _cache_key(source: str, build: KernelBuild) -> str:
    return cache_key(format=CACHE_FORMAT, source=source, macros=build.macros(), arch=build.arch,
                     options=["std=c++17", "ptxas -v"] + ["lineinfo"] * build.lineinfo, nvrtc=nvrtc_version(),
                     headers=cuda_headers())


def _nvrtc(source: str, build: KernelBuild) -> tuple[bytes, str]:
    """(cubin, log) of `source` with the build's macros, for its arch; CompileError names the file
    the user gave (a variant's path: NVRTC's lines, which say PROGRAM_NAME, are renamed to it), the
    config's tag and the arch, in one line."""
    try:
        return compile_cubin(source, name=PROGRAM_NAME, arch=build.arch, macros=build.macros(),
                             lineinfo=build.lineinfo)
    except NvrtcError as exc:
        variant = build.kernel is not None and not build.kernel.is_seed
        name = build.kernel.program_name if variant else PROGRAM_NAME
        detail, log = (exc.detail.replace(f"{PROGRAM_NAME}(", f"{name}("),
                       exc.log.replace(f"{PROGRAM_NAME}(", f"{name}(")) if variant else (exc.detail, exc.log)
        causal = ", causal" if build.causal else ""
        raise CompileError(f"NVRTC could not compile {name} (config {build.config.tag}{causal}, {build.arch}): "
                           f"{detail}", log) from None


def compile_build(build: KernelBuild, *, use_cache: bool = True) -> CompiledKernel:
    """Cubin for one KernelBuild, through the on-disk cache (keyed by the source text). A config whose
    shared memory is over the build's arch's limit (KernelConfig.check_arch) and a variant that
    ignores a macro its config sets (KernelBuild.source) are refused first."""
    build.config.check_arch(build.arch)
    source = build.source().text
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


def is_cached(build: KernelBuild) -> bool:
    """Whether the on-disk cache holds this build's cubin (compile_build would not run NVRTC)."""
    path = cache_dir() / f"{_cache_key(build.source().text, build)}.cubin"
    return path.exists() and path.with_suffix(".json").exists()


def compile_many(builds, workers: int | None = None) -> list[CompiledKernel]:
    """compile_build for many builds in parallel processes (one NVRTC compile uses one core),
    filling the on-disk cache: what a machine with many cores does before a test run."""
    builds = list(builds)
    if workers == 1 or len(builds) < 2:
        return [compile_build(b) for b in builds]
    # spawn, not fork: the caller may hold a CUDA context (fa_hw.device_arch()), which a fork must not copy
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
