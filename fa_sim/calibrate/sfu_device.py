"""Launch layer of fa_sim.calibrate.sfu_probe: NVRTC through cuda.core, device memory through cupy.

`compile_cubin` needs no GPU (cuda.core >= 1.0 with an explicit arch); `CudaBackend` runs the
kernels of sfu_probe.cu and returns numpy arrays. The orchestration in sfu_probe.py only sees the
methods below, so a CPU stand-in with the same methods tests it without a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .sfu_ops import N_BANDS, N_BINS, N_CHANGE, N_HYP

THREADS = 256
BLOCK_SHIFT = 16           # inputs per sweep block: 256 threads x 256
ALL_BLOCKS = 1 << (32 - BLOCK_SHIFT)


@dataclass(frozen=True)
class Sweep:
    hist: np.ndarray       # [512 band, 40 bin] uint64
    changes: np.ndarray    # [512 band, 23 ctz(m + 1)] uint64
    dmin: np.ndarray       # [512] int32 (INT_MAX where no finite pair)
    dmax: np.ndarray       # [512] int32
    first_bad: np.ndarray  # [512] uint32 (0xffffffff: none)


@dataclass(frozen=True)
class Check:
    mism: np.ndarray       # [512 band, 4 hypothesis] uint64
    appl: np.ndarray       # [512, 4] uint64
    first: np.ndarray      # [512, 4] uint32


def program_options(arch: str):
    """IEEE double references need the accurate libdevice paths: no fast math, no flush to zero."""
    from cuda.core import ProgramOptions

    wanted = dict(arch=arch, std="c++17", ftz=False, prec_div=True, prec_sqrt=True, fma=True,
                  use_fast_math=False, split_compile=0)
    known = getattr(ProgramOptions, "__dataclass_fields__", {"arch": None})  # NVRTC's defaults are these too
    return ProgramOptions(**{k: v for k, v in wanted.items() if k in known})


def compile_cubin(source: str, arch: str) -> bytes:
    from cuda.core import Program

    return Program(source, code_type="c++", options=program_options(arch)).compile("cubin").code


class CudaBackend:
    """One compiled program on the current device."""

    def __init__(self, source: str):
        import cupy as cp
        from cuda.core import Device, ObjectCode

        self.cp = cp
        dev = Device()
        dev.set_current()
        self.arch = f"sm_{dev.arch}"
        self.device_name = dev.name
        self.cubin = compile_cubin(source, self.arch)
        self.module = ObjectCode.from_cubin(self.cubin)
        self.stream = dev.create_stream()

    def _run(self, kernel: str, grid: int, *args) -> None:
        from cuda.core import LaunchConfig, launch

        self.cp.cuda.runtime.deviceSynchronize()  # cupy's allocations and fills happen on its own stream
        launch(self.stream, LaunchConfig(grid=grid, block=THREADS), self.module.get_kernel(kernel), *args)
        self.stream.sync()

    def sweep(self, op: str, model: bool = False, block0: int = 0, n_blocks: int = ALL_BLOCKS) -> Sweep:
        cp = self.cp
        hist = cp.zeros((N_BANDS, N_BINS), cp.uint64)
        chg = cp.zeros((N_BANDS, N_CHANGE), cp.uint64)
        lo = cp.full(N_BANDS, np.iinfo(np.int32).max, cp.int32)
        hi = cp.full(N_BANDS, np.iinfo(np.int32).min, cp.int32)
        first = cp.full(N_BANDS, 0xFFFFFFFF, cp.uint32)
        self._run(("vsweep_" if model else "sweep_") + op, n_blocks, np.uint32(block0),
                  hist.data.ptr, chg.data.ptr, lo.data.ptr, hi.data.ptr, first.data.ptr)
        return Sweep(*(cp.asnumpy(a) for a in (hist, chg, lo, hi, first)))

    def check(self, op: str, block0: int = 0, n_blocks: int = ALL_BLOCKS) -> Check:
        cp = self.cp
        mism = cp.zeros((N_BANDS, N_HYP), cp.uint64)
        appl = cp.zeros((N_BANDS, N_HYP), cp.uint64)
        first = cp.full((N_BANDS, N_HYP), 0xFFFFFFFF, cp.uint32)
        self._run("check_" + op, n_blocks, np.uint32(block0), mism.data.ptr, appl.data.ptr, first.data.ptr)
        return Check(*(cp.asnumpy(a) for a in (mism, appl, first)))

    def eval(self, op: str, inputs: np.ndarray, model: bool = False,
             expected: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """hw(x) and the expectation (reference or model) for each input bit pattern."""
        cp = self.cp
        n = int(inputs.size)
        if n == 0:
            return np.zeros(0, np.uint32), (np.zeros(0, np.uint32) if expected else None)
        x = cp.asarray(np.ascontiguousarray(inputs, dtype=np.uint32))
        y = cp.empty(n, cp.uint32)
        r = cp.empty(n, cp.uint32) if expected else None
        self._run(("veval_" if model else "eval_") + op, (n + THREADS - 1) // THREADS,
                  x.data.ptr, y.data.ptr, r.data.ptr if expected else 0, np.uint32(n))
        return cp.asnumpy(y), (cp.asnumpy(r) if expected else None)

    def half_all(self, name: str) -> np.ndarray:
        out = self.cp.empty(65536, self.cp.uint16)
        self._run("half_all_" + name, 65536 // THREADS, out.data.ptr)
        return self.cp.asnumpy(out)

    def half_x2(self, name: str, table: np.ndarray) -> tuple[int, int]:
        """Packed-form outputs that differ from two scalar results: (count, first packed input)."""
        cp = self.cp
        t = cp.asarray(np.ascontiguousarray(table, dtype=np.uint16))
        mism = cp.zeros(1, cp.uint64)
        first = cp.full(1, 0xFFFFFFFF, cp.uint32)
        self._run("half_x2_" + name, ALL_BLOCKS, t.data.ptr, mism.data.ptr, first.data.ptr)
        return int(mism.get()[0]), int(first.get()[0])


# ---- SASS of the compiled program (nvdisasm; no GPU needed) ----

_SECTION = re.compile(r"^\s*\.text\.([A-Za-z0-9_]+):", re.M)
# Address arithmetic, loads, stores and control flow around the op in a sass_<op> kernel.
_PLUMBING = ("S2R", "S2UR", "LDG", "STG", "EXIT", "BRA", "NOP", "MOV", "ULDC", "IMAD", "LDC", "IADD", "LEA", "SHF",
             "ISETP")


def sass_by_kernel(cubin: bytes) -> dict[str, list[str]]:
    """Kernel name -> its opcodes (with modifiers) in program order."""
    from fa_sim.contract.sass import disassemble, opcodes

    text = disassemble(cubin)
    heads = list(_SECTION.finditer(text))
    return {m.group(1): opcodes(text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)])
            for i, m in enumerate(heads)}


def op_sass(kernel_opcodes: list[str]) -> tuple[str, ...]:
    """The opcodes of a sass_<op> / half_all_<op> kernel that implement the op."""
    return tuple(op for op in kernel_opcodes if not op.startswith(_PLUMBING))
