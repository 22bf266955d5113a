"""The one NVRTC wrapper both backends compile with (cuda.bindings.nvrtc; no GPU, no driver).

- PTX, for the simulator (`compile_ptx`, `kernel_ptx`): the virtual architecture (compute_80 by
  default: SM80 is what fa_sim models) with `-lineinfo`, which gives every PTX instruction its CUDA
  source line (`.loc`). NVRTC records the program name in the PTX's `.file` directive, prefixed by
  the working directory when it is relative; the name is therefore made absolute first, so the PTX
  does not depend on where Python runs. PTX texts are cached under `fa_sim.cache.cache_root()/ptx`,
  keyed by the source, that absolute name, every option (macros included) and the NVRTC version.
- Cubin, for the GPU (`compile_cubin`): one exact arch (sm_NN), with ptxas's `-v` report in the
  log. A PTX from an NVRTC newer than the driver does not load and an sm_80 cubin does not run on
  sm_90, so the GPU runs a cubin for its own arch. The options are those cuda.core's ProgramOptions
  gave the same build (the cubins are byte-identical); fa_hw.compile caches the cubins. Registers
  come from the cubin (cubin.py), never from the log: NVRTC 13 returns an empty log when its own
  compute cache (~/.nv/ComputeCache) already holds the program.

The raw bindings, not cuda.core, because cuda.core's compile("ptx") needs a driver. The bindings
are imported when something is compiled: without the `hw` extra the simulator's own front end
still runs, and compiling says which extra to install (HwExtraMissing, one line).

CUDA's own headers (`cuda_fp16.h`, `cuda_bf16.h`, `mma.h`, `cuda_pipeline.h`, ...) come from the
CUDA wheels of the `hw` extra (nvidia-cuda-runtime, and nvidia-cuda-crt for the `crt/` headers that
`mma.h` includes), as nvcc finds them in its toolkit: every compile, PTX or cubin, gets their
directory as the last include path (`--include-path=`, after a caller's own `-I`), found from the
installed packages' file lists (`cuda_include_dirs`), never from a system CUDA toolkit whose
version may differ from NVRTC's. Their versions are part of every cache key. Without those wheels
a source that includes none of them still compiles; one that does stops with one line naming the
packages to install (`CudaHeadersMissing`).
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..cache import cache_key, cache_root, read_text_entry, store_atomic
from .build import KernelBuild
from .errors import HW_EXTRA_INSTALL, HwExtraMissing, ToolError

DEFAULT_ARCH = "compute_80"
BASE_OPTIONS = ("-lineinfo", "-std=c++17")
_ARCH = re.compile(r"(?:compute|sm)_(\d{2,3}[af]?)")
_REAL_ARCH = re.compile(r"sm_\d{2,3}[af]?")
_MACRO = re.compile(r"[A-Za-z_]\w*")
#: The wheels that ship CUDA's headers, each with one header that marks its include directory
#: (`mma.h` includes `crt/mma.h`, which nvidia-cuda-crt ships).
HEADER_PACKAGES = (("nvidia-cuda-runtime", "cuda_fp16.h"), ("nvidia-cuda-crt", "crt/mma.h"))
_NOT_OPENED = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


class NvrtcError(ToolError, ValueError):
    """NVRTC rejected a source or its options. `detail`: the first error line (or why there is
    none); `log`: NVRTC's full log (possibly empty)."""

    def __init__(self, message: str, log: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.log = log
        self.detail = detail or message


class CudaHeadersMissing(NvrtcError):
    """A source includes a header NVRTC could not find while CUDA's header wheels are missing."""


class Output(enum.Enum):
    """What NVRTC returns for a compiled program: (size getter, getter) of cuda.bindings.nvrtc."""

    PTX = ("nvrtcGetPTXSize", "nvrtcGetPTX")
    CUBIN = ("nvrtcGetCUBINSize", "nvrtcGetCUBIN")


def _bindings():
    """cuda.bindings.nvrtc, or HwExtraMissing naming the extra to install."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # lazy on purpose: the hw extra is optional
        missing = f"No module named {exc.name!r}" if exc.name else str(exc)
        raise HwExtraMissing("Compiling CUDA C++ (NVRTC, for --kernel, --engine ptx and the GPU)", missing) from None
    return nvrtc


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use: part of every cache key, since the code NVRTC
    emits differs between versions."""
    nvrtc = _bindings()
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"nvrtcVersion failed: {err.name}")
    return int(major), int(minor)


@functools.cache
def cuda_headers() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include directories, 'package==version' of each header wheel) of CUDA's headers, from the
    installed wheels' own file lists (HEADER_PACKAGES); the directories in order, without repeats
    (both wheels install into one nvidia/cu13/include). A wheel that is not installed, or that
    lacks its marker header, is left out: `missing_cuda_headers` says which."""
    dirs, versions = [], []
    for package, marker in HEADER_PACKAGES:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            path = str(f).replace("\\", "/")
            if path.endswith(f"/include/{marker}"):
                found = Path(dist.locate_file(f))
                if found.is_file():
                    include = str(found.parents[marker.count("/")].resolve())
                    if include not in dirs:
                        dirs.append(include)
                    versions.append(f"{package}=={dist.version}")
                break
    return tuple(dirs), tuple(versions)


def cuda_include_dirs() -> tuple[str, ...]:
    """The directories of CUDA's own headers, as installed by the `hw` extra (may be empty)."""
    return cuda_headers()[0]


def missing_cuda_headers() -> tuple[str, ...]:
    """The header wheels of HEADER_PACKAGES that are not installed (or lack their header)."""
    have = {v.split("==")[0] for v in cuda_headers()[1]}
    return tuple(p for p, _ in HEADER_PACKAGES if p not in have)


def _include_options() -> list[str]:
    return [f"--include-path={d}" for d in cuda_include_dirs()]


def cache_dir() -> Path:
    return cache_root() / "ptx"


def virtual_arch(arch: str) -> str:
    """'compute_80' for 'compute_80' or 'sm_80': PTX is emitted for the virtual architecture."""
    m = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if m is None:
        raise ValueError(f"arch {arch!r} is not a CUDA architecture: give e.g. 'compute_80' or 'sm_80'")
    return f"compute_{m.group(1)}"


def _macro_options(macros: Mapping[str, int | str], flag: str) -> list[str]:
    out = []
    for key, value in sorted(macros.items()):
        if not _MACRO.fullmatch(str(key)):
            raise ValueError(f"macro name {key!r} is not a C identifier")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, str)):
            raise ValueError(f"macro {key}: value {value!r} must be an int or a str (a numpy integer is an int; "
                             "a bool is not)")
        out.append(f"{flag}{key}={int(value) if isinstance(value, np.integer) else value}")
    return out


def nvrtc_options(arch: str = DEFAULT_ARCH, macros: Mapping[str, int | str] = {},
                  options: Sequence[str] = ()) -> list[str]:
    """The full NVRTC command line of a PTX compile: architecture, -lineinfo, -std=c++17, -D per
    macro (sorted), `options` as given, then CUDA's header directories (--include-path=, last, so
    that a caller's own -I comes first, as with nvcc)."""
    out = [f"--gpu-architecture={virtual_arch(arch)}", *BASE_OPTIONS, *_macro_options(macros, "-D")]
    for opt in options:
        if not isinstance(opt, str) or not opt:
            raise ValueError(f"NVRTC option {opt!r} must be a non-empty str")
        out.append(opt)
    return out + _include_options()


def cubin_options(arch: str, macros: Mapping[str, int | str] = {}) -> list[str]:
    """The NVRTC command line of a cubin compile, as cuda.core's ProgramOptions(arch=, std='c++17',
    ptxas_options=['-v'], define_macro=sorted macros, include_path=cuda_include_dirs()) writes it."""
    if not isinstance(arch, str) or not _REAL_ARCH.fullmatch(arch):
        raise ValueError(f"arch {arch!r}: a cubin is for a real architecture, e.g. 'sm_80' or 'sm_90'")
    return [f"-arch={arch}", "--ptxas-options=-v", *_macro_options(macros, "--define-macro="), *_include_options(),
            "--std=c++17"]


def compile_ptx(source: str, *, name: str = "kernel.cu", arch: str = DEFAULT_ARCH,
                macros: Mapping[str, int | str] = {}, options: Sequence[str] = (),
                use_cache: bool = True, refresh: bool = False) -> str:
    """The PTX NVRTC emits for `source` (CUDA C++), through the on-disk cache.

    name: the program's file name, as `.file` and NVRTC's messages will show it (made absolute).
    arch: 'compute_NN' or 'sm_NN' (both give the compute_NN PTX). macros: -DNAME=value each.
    options: further NVRTC options (e.g. '-I/path', '-use_fast_math').
    refresh: compile even when cached and replace the entry (fa_sim.ptx.load, when a cached PTX
    does not parse); an entry that is not UTF-8 text is compiled afresh anyway.
    Raises NvrtcError with NVRTC's log when the source or an option is rejected."""
    if not isinstance(source, str):
        raise ValueError(f"source must be CUDA C++ text (str), not {type(source).__name__}")
    name = os.path.abspath(name)
    opts = nvrtc_options(arch, macros, options)
    key = cache_key(source=source, name=name, options=opts, nvrtc=nvrtc_version(), headers=cuda_headers()[1])
    path = cache_dir() / f"{key}.ptx"
    if use_cache and not refresh and (hit := read_text_entry(path)) is not None:
        return hit
    ptx = run_nvrtc(source, name, opts, Output.PTX)[0].decode()
    if use_cache:
        store_atomic(path, ptx.encode())
    return ptx


def kernel_ptx(build: KernelBuild, *, arch: str = DEFAULT_ARCH, use_cache: bool = True,
               refresh: bool = False) -> str:
    """The PTX of a KernelBuild's kernel (the seed fa2_fwd.cu, or the build's checked variant)
    with its macros(), for SM80 whatever `build.arch` says (the cubin's arch is the GPU's
    business; the simulator models SM80)."""
    source = build.source()
    return compile_ptx(source.text, name=source.program_name, arch=arch, macros=build.macros(),
                       use_cache=use_cache, refresh=refresh)


def compile_cubin(source: str, *, name: str, arch: str, macros: Mapping[str, int | str] = {},
                  lineinfo: bool = False) -> tuple[bytes, str]:
    """(cubin, NVRTC's log) of `source` for the real arch `arch` (uncached: cubins.py caches cubins
    by KernelBuild); `lineinfo`: with CUDA source lines (-lineinfo, the same code). Raises
    NvrtcError with the log when NVRTC rejects the source."""
    cubin, log = run_nvrtc(source, name, cubin_options(arch, macros) + ["-lineinfo"] * lineinfo, Output.CUBIN)
    return cubin, log


def run_nvrtc(source: str, name: str, opts: list[str], output: Output) -> tuple[bytes, str]:
    """One NVRTC program: create, compile with `opts`, return (output bytes, log)."""
    nvrtc = _bindings()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        raise NvrtcError(f"NVRTC could not create a program for {name}: {err.name}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _program_log(nvrtc, prog)
        if err != ok:
            raise _compile_error(name, opts, err.name, log)
        get_size, get = (getattr(nvrtc, f) for f in output.value)
        err, size = get_size(prog)
        buf = b" " * size
        if err != ok or get(prog, buf)[0] != ok:
            raise NvrtcError(f"NVRTC compiled {name} but returned no {output.name} ({err.name})", log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return (buf.rstrip(b"\x00") if output is Output.PTX else buf), log


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")


def _compile_error(name: str, opts: list[str], status: str, log: str) -> NvrtcError:
    """One line naming the first error (or saying the log is empty); the full log as `.log`. A
    header NVRTC could not open while CUDA's header wheels are missing: CudaHeadersMissing, naming
    the wheels and the install command."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln), lines[0] if lines else None)
    detail = first or f"{status}, and NVRTC gave an empty log (options: {' '.join(opts)})"
    missing = missing_cuda_headers()
    if missing and (m := _NOT_OPENED.search(log)):
        detail = (f"{detail} (CUDA's headers such as {m.group(1)} come from the {' and '.join(missing)} "
                  f"wheel{'s' * (len(missing) > 1)} of the 'hw' extra, not installed: {HW_EXTRA_INSTALL})")
        return CudaHeadersMissing(f"NVRTC could not compile {name}: {detail}", log, detail)
    return NvrtcError(f"NVRTC could not compile {name}: {detail}", log, detail)
