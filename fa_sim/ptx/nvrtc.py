"""PTX of any CUDA C++ source through NVRTC (cuda.bindings.nvrtc), cached on disk.

This is the first step of the PTX front end: the simulator executes the PTX that NVRTC emits, so
it compiles to a virtual architecture (compute_80 by default: SM80 is what fa_sim models) with
`-lineinfo`, which gives every PTX instruction its CUDA source line (`.loc`). NVRTC needs no GPU
and no driver here; cuda.core's `compile("ptx")` does (shared/notes/gpu_facts.md), hence the raw
bindings.

NVRTC records the program name in the PTX's `.file` directive, prefixed by the working directory
when it is relative; the name is therefore made absolute first, so the PTX does not depend on
where Python runs. PTX texts are cached under `fa_sim.cache.cache_root()/ptx`, keyed by the
source, that absolute name, every option (macros included) and the NVRTC version.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..cache import cache_key, cache_root, read_text_entry, store_atomic

DEFAULT_ARCH = "compute_80"
BASE_OPTIONS = ("-lineinfo", "-std=c++17")
_ARCH = re.compile(r"(?:compute|sm)_(\d{2,3}[af]?)")
_MACRO = re.compile(r"[A-Za-z_]\w*")


class PtxCompileError(ValueError):
    """NVRTC rejected a source or its options; `log` holds NVRTC's full log (possibly empty)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use: part of every cache key, since the code NVRTC
    emits differs between versions."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise PtxCompileError(f"nvrtcVersion failed: {err.name}")
    return int(major), int(minor)


def cache_dir() -> Path:
    return cache_root() / "ptx"


def virtual_arch(arch: str) -> str:
    """'compute_80' for 'compute_80' or 'sm_80': PTX is emitted for the virtual architecture."""
    m = _ARCH.fullmatch(arch)
    if m is None:
        raise ValueError(f"arch {arch!r} is not a CUDA architecture: give e.g. 'compute_80' or 'sm_80'")
    return f"compute_{m.group(1)}"


def nvrtc_options(arch: str = DEFAULT_ARCH, macros: Mapping[str, int | str] = {},
                  options: Sequence[str] = ()) -> list[str]:
    """The full NVRTC command line: architecture, -lineinfo, -std=c++17, -D per macro (sorted),
    then `options` as given."""
    out = [f"--gpu-architecture={virtual_arch(arch)}", *BASE_OPTIONS]
    for key, value in sorted(macros.items()):
        if not _MACRO.fullmatch(str(key)):
            raise ValueError(f"macro name {key!r} is not a C identifier")
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"macro {key}: value {value!r} must be an int or a str")
        out.append(f"-D{key}={value}")
    for opt in options:
        if not isinstance(opt, str) or not opt:
            raise ValueError(f"NVRTC option {opt!r} must be a non-empty str")
        out.append(opt)
    return out


def compile_ptx(source: str, *, name: str = "kernel.cu", arch: str = DEFAULT_ARCH,
                macros: Mapping[str, int | str] = {}, options: Sequence[str] = (),
                use_cache: bool = True, refresh: bool = False) -> str:
    """The PTX NVRTC emits for `source` (CUDA C++), through the on-disk cache.

    name: the program's file name, as `.file` and NVRTC's messages will show it (made absolute).
    arch: 'compute_NN' or 'sm_NN' (both give the compute_NN PTX). macros: -DNAME=value each.
    options: further NVRTC options (e.g. '-I/path', '-use_fast_math').
    refresh: compile even when cached and replace the entry (fa_sim.ptx.load, when a cached PTX
    does not parse); an entry that is not UTF-8 text is compiled afresh anyway.
    Raises PtxCompileError with NVRTC's log when the source or an option is rejected."""
    if not isinstance(source, str):
        raise ValueError(f"source must be CUDA C++ text (str), not {type(source).__name__}")
    name = os.path.abspath(name)
    opts = nvrtc_options(arch, macros, options)
    path = cache_dir() / f"{cache_key(source=source, name=name, options=opts, nvrtc=nvrtc_version())}.ptx"
    if use_cache and not refresh and (hit := read_text_entry(path)) is not None:
        return hit
    ptx = _run_nvrtc(source, name, opts)
    if use_cache:
        store_atomic(path, ptx.encode())
    return ptx


def kernel_ptx(build, *, arch: str = DEFAULT_ARCH, use_cache: bool = True, refresh: bool = False) -> str:
    """The PTX of fa_hw's own kernel (fa_hw/kernels/fa2_fwd.cu) for a `fa_hw.compile.KernelBuild`:
    its macros(), for SM80 whatever `build.arch` says (the cubin's arch is the GPU's business;
    the simulator models SM80)."""
    from fa_hw.compile import SOURCE_PATH

    return compile_ptx(SOURCE_PATH.read_text(), name=str(SOURCE_PATH), arch=arch,
                       macros=build.macros(), use_cache=use_cache, refresh=refresh)


def _run_nvrtc(source: str, name: str, opts: list[str]) -> str:
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        raise PtxCompileError(f"NVRTC could not create a program for {name}: {err.name}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != ok:
            raise _compile_error(name, opts, err.name, _program_log(nvrtc, prog))
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * size
        if err != ok or nvrtc.nvrtcGetPTX(prog, buf)[0] != ok:
            raise PtxCompileError(f"NVRTC compiled {name} but returned no PTX ({err.name})")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return buf.rstrip(b"\x00").decode()


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")


def _compile_error(name: str, opts: list[str], status: str, log: str) -> PtxCompileError:
    """One line naming the first error (or saying the log is empty); the full log as `.log`."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln), lines[0] if lines else None)
    detail = first or f"{status}, and NVRTC gave an empty log (options: {' '.join(opts)})"
    return PtxCompileError(f"NVRTC could not compile {name}: {detail}", log)
