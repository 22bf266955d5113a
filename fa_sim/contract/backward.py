"""The backward kernels' contract: fa_hw/kernels/fa2_bwd.cu, its kernels, its tiles and
macros, and its cubin - what the PTX engine (fa_sim.backward) and the GPU (fa_hw.backward) share.

    BackwardConfig(head_dim, dtype=)  tiles: block_m queries per loop iteration, block_n = 16 * n_warps
                                      keys per CTA (docs/backward.md), q_stages Q block buffers of the
                                      main kernel (FA_Q_STAGES: 2 loads the next under the whole
                                      round); smem_bytes of the main kernel,
                                      dq_block_m = block_n queries and dq_smem_bytes of the dQ kernel;
                                      dtype "fp16" or "bf16" (FA_BF16) of the inputs and gradients;
                                      softmax "fmul_fsub" (default) or "ffma" (FA_SOFTMAX_FFMA): the
                                      exp2 argument of P, SOFTMAX_FORMS; smem_swizzle: sQ, sdO, sK, sV
                                      (both kernels) in rows of d halves with the 16-byte chunks
                                      XOR-swizzled in 8-row atoms (FA_SMEM_SWIZZLE) instead of padded
                                      rows of d + 8 (row_pitch, swizzle_atom_cols, swizzle_bms,
                                      smem_offset)
        .label                        its label, e.g. 64x8s1fr4p (LABEL_FORMS: the syntax of
                                      experiments/tune_bwd.py, its tables' reports and `--config` with
                                      --backward); BackwardConfig.from_label(label, head_dim, dtype)
                                      its inverse, parse_label(label) the fields
    BackwardBuild(config, causal, deterministic, arch, checkpoints=False)
        .kernels                      its three kernels in launch order (the third: the convert
                                      kernel in atomic mode, the dQ kernel in deterministic mode)
        .macros()                     the FA_* macros of fa2_bwd.cu (checkpoints: the debug build
                                      FA_BWD_CHECKPOINTS and its buffer layout, fa_sim/checkpoints.py)
        .source()                     the CUDA C++ (fa2_bwd.cu, or a variant given as `kernel`)
    compile_backward(build)           cubin for build.arch (cached on disk like the forward's),
                                      with each kernel's registers and local memory

The source sits beside fa2_fwd.cu (fa_sim.contract.source explains why the contract names the file
by path instead of importing fa_hw). Compiling needs no GPU.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import cache_key, cache_root, store_atomic
from ..isa.sm80 import SMEM_OPT_IN_BYTES
from ..checkpoints import BACKWARD_CHECKPOINTS, BackwardCheckpointLayout
from ..config import DTYPES
from ..cute import Swizzle
from .cubin import CubinError, ResourceUsage
from .errors import CompileError, KernelSourceError
from .nvrtc import NvrtcError, compile_cubin, nvrtc_version
from .source import SEED_PATH

BWD_PATH = SEED_PATH.parent / "fa2_bwd.cu"
PREPROCESS_KERNEL = "fa2_bwd_preprocess_kernel"
MAIN_KERNEL = "fa2_bwd_kernel"
CONVERT_KERNEL = "fa2_bwd_convert_dq_kernel"  # atomic mode: dQ = s dq_accum as fp16
DQ_KERNEL = "fa2_bwd_dq_kernel"  # deterministic mode: dQ by its own loop over the K/V blocks


def kernels_of(deterministic: bool) -> tuple[str, str, str]:
    """fa2_bwd.cu's kernels of one dQ mode, in launch order."""
    return (PREPROCESS_KERNEL, MAIN_KERNEL, DQ_KERNEL if deterministic else CONVERT_KERNEL)


CACHE_FORMAT = 1
MAX_REGISTERS = 255  # per thread (SM80/SM90)
DEFAULT_ARCH = "sm_90"

#: (block_m, n_warps) per head_dim: 64 x 64 tiles with 4 warps; head_dim 128 and 160 iterate over Q
#: blocks of 32 rows, 192 over Q blocks of 16, which keeps dV, dK (d / 2 fp32 registers each per
#: thread: every warp owns 16 keys x d of both) and the S^T, dP^T tiles within 255 registers without
#: spills (tests/test_backward_build.py reports the counts: at most 255 at 192). Shared memory
#: (smem_bytes, dq_smem_bytes below) stays far under SM80's 163 KiB: at most 102,912 B (d = 192's dQ
#: kernel).
DEFAULT_TILES = {32: (64, 4), 64: (64, 4), 96: (64, 4), 128: (32, 4), 160: (32, 4), 192: (16, 4)}
HEAD_DIMS = tuple(DEFAULT_TILES)
#: the exp2 argument of P = ex2(x) (fa2_bwd.cu exp2_arg): "fmul_fsub" x = fl(fl(S sl2) - lse2), the
#: default, whose bits the recorded GPU checkpoints hold; "ffma" x = fma.rn(S, sl2, -lse2), one
#: instruction less per score and one rounding less (other bits of P, hence of dK, dV, dQ)
SOFTMAX_FORMS = ("fmul_fsub", "ffma")
#: fp32 elements per dQ reduction in the atomic mode (fa2_bwd.cu FA_DQ_RED): 1 red.global.add.f32, the
#: default (any arch, what the recordings ran); 2 red.global.add.v2.f32, 4 red.global.add.v4.f32 (sm_90:
#: PTX ISA 8.1; a cubin for an older arch is refused). The same terms reach each dQ_accum element (one
#: per CTA and Q block), in fewer requests to the L2's atomic units; dK, dV and the deterministic mode
#: are untouched.
DQ_RED_WIDTHS = (1, 2, 4)
DQ_RED_MIN_ARCH = 90  # sm_90


def vector_reductions_ok(arch: str) -> bool:
    """Whether `arch` ("sm_80", "sm_90a", ...) has red.global.add.v2/.v4.f32 (dq_red 2, 4)."""
    return int("".join(ch for ch in arch if ch.isdigit()) or 0) >= DQ_RED_MIN_ARCH
#: head dims the forward runs and the backward refuses, with the reason
UNSUPPORTED = {256: "each warp keeps dV and dK of its 16 keys x 256 columns in registers, 2 x 16 x 256 / 32 "
                    "= 256 fp32 registers per thread, over the 255 a thread has (ptxas spills them to local "
                    "memory); it needs dV, dK split across warps, which fa2_bwd.cu does not do"}


@dataclass(frozen=True)
class BackwardConfig:
    """The tiles of fa2_bwd.cu. block_m: queries per iteration (a multiple of 16, at most
    16 * n_warps and at most the threads); block_n = 16 * n_warps keys per CTA."""

    head_dim: int = 64
    block_m: int = 0  # 0: DEFAULT_TILES[head_dim]
    n_warps: int = 0  # 0: DEFAULT_TILES[head_dim]
    dtype: str = "fp16"  # the 16-bit type of q, k, v, o, dO and the gradients: fp16 or bf16 (FA_BF16)
    q_stages: int = 1  # Q block buffers of the main kernel (FA_Q_STAGES): 1 as DEFAULT_TILES and the recordings, or 2
    softmax: str = "fmul_fsub"  # the exp2 argument of P (FA_SOFTMAX_FFMA): SOFTMAX_FORMS
    dq_red: int = 1  # fp32 elements per atomic dQ reduction (FA_DQ_RED): DQ_RED_WIDTHS, 2 and 4 for sm_90
    dq_frag: bool = False  # the atomic mode's dq_accum in the fragment order (FA_DQ_FRAG): each warp reduction
    # covers 32 dq_red contiguous fp32 (whole 128-byte lines) instead of 8 rows' 8 dq_red columns; dQ's sums unchanged
    lse_async: bool = False  # the main kernel copies LSE and D with the Q block by cp.async (FA_LSE_ASYNC), raw:
    # log2(e) LSE at its use; no load for the threads < block_m to wait for before their dQ GEMM; the same bits
    dq_warp_rows: int = 16  # queries per warp tile of the atomic mode's dQ GEMM (FA_DQ_WARP_ROWS): 16, or 32 (two
    # m16 tiles sharing each K fragment: fewer ldmatrix; needs dq_frag); the same dQ partials
    smem_swizzle: bool = False  # sQ, sdO, sK, sV of both kernels swizzled (FA_SMEM_SWIZZLE: rows of d halves, the
    # 16-byte chunks XORed with row bits in 8-row atoms, as the forward's SmemLayout.SWIZZLED) instead of padded
    # to d + 8: every cp.async row whole 128-byte lines; the same bits

    def __post_init__(self) -> None:
        if self.head_dim not in HEAD_DIMS:
            why = f"; {self.head_dim}: {UNSUPPORTED[self.head_dim]}" if self.head_dim in UNSUPPORTED else ""
            raise ValueError(f"head_dim {self.head_dim} is not supported by the backward pass; choose one of "
                             f"{HEAD_DIMS}{why}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported by the backward pass; choose one of {DTYPES}")
        if self.softmax not in SOFTMAX_FORMS:
            raise ValueError(f"softmax {self.softmax!r} is not a form of the backward's exp2 argument; choose one of "
                             f"{SOFTMAX_FORMS}")
        if self.dq_red not in DQ_RED_WIDTHS:
            raise ValueError(f"dq_red must be one of {DQ_RED_WIDTHS} (fp32 elements per atomic dQ reduction), "
                             f"got {self.dq_red!r}")
        if not isinstance(self.dq_frag, bool):
            raise ValueError(f"dq_frag must be True or False (dq_accum in the fragment order), got {self.dq_frag!r:.40}")
        if not isinstance(self.lse_async, bool):
            raise ValueError(f"lse_async must be True or False (LSE and D by cp.async), "
                             f"got {self.lse_async!r:.40}")
        if not isinstance(self.smem_swizzle, bool):
            raise ValueError(f"smem_swizzle must be True or False (swizzled instead of padded tiles), "
                             f"got {self.smem_swizzle!r:.40}")
        if self.dq_warp_rows not in (16, 32):
            raise ValueError(f"dq_warp_rows must be 16 or 32 (queries per warp tile of the dQ GEMM), "
                             f"got {self.dq_warp_rows!r:.40}")
        if self.dq_warp_rows == 32 and not self.dq_frag:
            raise ValueError("dq_warp_rows=32 needs dq_frag=True (its slices are reduced in the fragment order)")
        if self.q_stages not in (1, 2):
            raise ValueError(f"q_stages must be 1 or 2 (Q block buffers of the backward's main kernel), "
                             f"got {self.q_stages!r}")
        bm, nw = DEFAULT_TILES[self.head_dim]
        object.__setattr__(self, "block_m", self.block_m or bm)
        object.__setattr__(self, "n_warps", self.n_warps or nw)
        bm, nw, d = self.block_m, self.n_warps, self.head_dim
        threads, wm = 32 * nw, bm // 16
        copy_rows = threads // self.copy_threads_per_row
        ok = (bm % 16 == 0 and 0 < wm <= nw and nw % wm == 0 and d % (8 * (nw // wm)) == 0
              and (d // (8 * (nw // wm))) % 2 == 0
              and bm % copy_rows == 0 and (16 * nw) % copy_rows == 0 and bm <= threads)
        if not ok:
            raise ValueError(f"BackwardConfig(head_dim={d}, block_m={bm}, n_warps={nw}) does not tile: block_m must be "
                             "a multiple of 16 whose 16-row slices divide the warps, each warp column of dQ an even "
                             f"number of n8 tiles, and block_m a multiple of the copy passes ({copy_rows} rows); "
                             f"defaults: {DEFAULT_TILES}")
        wm2 = bm // 32
        if self.dq_warp_rows == 32 and not (bm % 32 == 0 and nw % wm2 == 0 and d % (8 * (nw // wm2)) == 0
                                            and (d // (8 * (nw // wm2))) % 2 == 0):
            raise ValueError(f"BackwardConfig(head_dim={d}, block_m={bm}, n_warps={nw}, dq_warp_rows=32) does not tile: "
                             "block_m must be a multiple of 32 whose 32-row slices divide the warps, each warp column "
                             "of dQ an even number of n8 tiles")
        if max(self.smem_bytes, self.dq_smem_bytes) > SMEM_OPT_IN_BYTES:
            raise ValueError(f"BackwardConfig(head_dim={d}, block_m={bm}, n_warps={nw}) needs "
                             f"{max(self.smem_bytes, self.dq_smem_bytes)} bytes of shared memory, over SM80's "
                             f"{SMEM_OPT_IN_BYTES}; defaults: {DEFAULT_TILES}")

    @property
    def copy_threads_per_row(self) -> int:
        """Threads per row of the 16-byte copy: gcd(head_dim / 8, 16) (fa2_bwd.cu kCopyTPR, as the forward's)."""
        return math.gcd(self.head_dim // 8, 16)

    @property
    def block_n(self) -> int:
        return 16 * self.n_warps

    @property
    def n_threads(self) -> int:
        return 32 * self.n_warps

    @property
    def row_pitch(self) -> int:
        """Halves between consecutive rows of sQ, sdO, sK, sV (fa2_bwd.cu kPitch): d + 8 padded, d swizzled."""
        return self.head_dim + (0 if self.smem_swizzle else 8)

    @property
    def swizzle_atom_cols(self) -> int:
        """Columns (halves) of one 8-row swizzle atom of the swizzled tiles (FA_SWZ_W), as the forward's
        KernelConfig.swizzle_atom_cols: d for d = 32, 64, 128 (one atom across the row), 32 for d = 96, 160,
        64 for d = 192; row_pitch when unswizzled."""
        d = self.head_dim
        if not self.smem_swizzle:
            return self.row_pitch
        return d if d & (d - 1) == 0 else (64 if d % 64 == 0 else 32)

    @property
    def swizzle_bms(self) -> tuple[int, int, int] | None:
        """Swizzle<B, M, S> of one atom's row-major offset (None unswizzled), the forward's choice: the 16-byte
        chunk index XORed with r % 8 (atoms of 64 or 128 columns) or (r // 2) % 4 (32 columns), so that the
        8 rows of one ldmatrix 8 x 8 matrix fall in 8 distinct 16-byte bank groups."""
        if not self.smem_swizzle:
            return None
        return {32: (2, 3, 3), 64: (3, 3, 3), 128: (3, 3, 4)}[self.swizzle_atom_cols]

    def smem_offset(self, r, c):
        """Offset in halves of element (r, c) of sQ, sdO, sK or sV from the tile's base (fa2_bwd.cu smem_off),
        vectorised: r * row_pitch + c padded; swizzled, 8-row groups of 8 x W atoms (W = swizzle_atom_cols),
        each atom row-major and swizzled (the forward's KernelConfig.smem_offset)."""
        import numpy as np

        r, c = np.asarray(r, dtype=np.int64), np.asarray(c, dtype=np.int64)
        w, pitch = self.swizzle_atom_cols, self.row_pitch
        if not self.smem_swizzle:
            return r * pitch + c
        p = r * pitch + c if w == pitch else (r // 8) * 8 * pitch + (c // w) * 8 * w + (r % 8) * w + c % w
        return Swizzle(*self.swizzle_bms)(p)

    @property
    def smem_bytes(self) -> int:
        """sQ, sdO ([block_m][row_pitch] fp16), sK, sV ([block_n][row_pitch]), sdS ([block_n][block_m + 8]),
        sLSE, sD ([block_m] fp32): fa2_bwd.cu's layout; q_stages 2 adds a second sQ, sdO, sLSE, sD."""
        pitch = self.row_pitch
        q_block = 2 * 2 * self.block_m * pitch + 2 * 4 * self.block_m
        return self.q_stages * q_block + 2 * 2 * self.block_n * pitch + 2 * self.block_n * (self.block_m + 8)

    @property
    def dq_block_m(self) -> int:
        """Queries per CTA of the dQ kernel (deterministic mode): 16 per warp."""
        return 16 * self.n_warps

    @property
    def dq_smem_bytes(self) -> int:
        """The dQ kernel's sQ, sdO ([dq_block_m][row_pitch] fp16), sK, sV ([block_n][row_pitch]), sLSE, sD
        ([dq_block_m] fp32)."""
        pitch = self.row_pitch
        return 2 * 2 * self.dq_block_m * pitch + 2 * 2 * self.block_n * pitch + 2 * 4 * self.dq_block_m

    def n_dq_blocks(self, seqlen_q: int) -> int:
        return -(-int(seqlen_q) // self.dq_block_m)

    def n_kv_blocks(self, seqlen_k: int) -> int:
        return -(-int(seqlen_k) // self.block_n)

    def n_q_blocks(self, seqlen_q: int) -> int:
        return -(-int(seqlen_q) // self.block_m)

    def describe(self) -> str:
        extra = f" {self.dtype}" if self.dtype != DTYPES[0] else ""
        extra += f" q_stages={self.q_stages}" if self.q_stages != 1 else ""
        extra += f" softmax={self.softmax}" if self.softmax != SOFTMAX_FORMS[0] else ""
        extra += f" dq_red={self.dq_red}" if self.dq_red != 1 else ""
        extra += " dq_frag" if self.dq_frag else ""
        extra += " lse_async" if self.lse_async else ""
        extra += f" dq_warp_rows={self.dq_warp_rows}" if self.dq_warp_rows != 16 else ""
        extra += " smem_swizzle" if self.smem_swizzle else ""
        return f"d={self.head_dim} block_m={self.block_m} block_n={self.block_n} warps={self.n_warps}{extra}"

    @property
    def label(self) -> str:
        """The tiles and options as a label (LABEL_FORMS), e.g. 64x4s1 (DEFAULT_TILES at d=64) or 64x8s1fr4p;
        head_dim and dtype are the problem's, not the label's."""
        return label(self.block_m, self.n_warps, self.q_stages, self.softmax, self.dq_red, self.dq_frag,
                     self.lse_async, self.dq_warp_rows, self.smem_swizzle)

    @classmethod
    def from_label(cls, text: str, head_dim: int, dtype: str = "fp16") -> "BackwardConfig":
        """The config a label names for head_dim and dtype: parse_label's ValueError for a text that is not a
        label, BackwardConfig's for tiles that do not tile or fit at this head_dim."""
        bm, nw, st, sm, red, frag, la, wr, swz = parse_label(text)
        return cls(head_dim, block_m=bm, n_warps=nw, dtype=dtype, q_stages=st, softmax=sm, dq_red=red, dq_frag=frag,
                   lse_async=la, dq_warp_rows=wr, smem_swizzle=swz)


#: the label syntax (experiments/tune_bwd.py's candidates, fa_hw.tuned_backward's tables, `--config` with
#: --backward): block_m "x" n_warps "s" q_stages, then in this order "f" (softmax "ffma"), "r2"/"r4" (dq_red),
#: "p" (dq_frag; "r1p" with the scalar reduction), "m" (dq_warp_rows 32), "l" (lse_async), "z" (smem_swizzle)
LABEL_FORMS = ("<block_m>x<n_warps>s<q_stages>[f][r<dq_red>][p][m][l][z], e.g. 64x4s1, 128x8s1f, 64x8s1fr4p, "
               "64x8s1fr4pml, 64x8s1r4pmz (f: softmax ffma, r2/r4: dq_red, p: dq_frag, m: dq_warp_rows 32, "
               "l: lse_async, z: smem_swizzle)")
_LABEL = re.compile(r"(\d{1,4})x(\d{1,3})s(\d)(f?)(?:r(\d))?(p?)(m?)(l?)(z?)")


def label(block_m: int, n_warps: int, q_stages: int, softmax: str = "fmul_fsub", dq_red: int = 1,
          dq_frag: bool = False, lse_async: bool = False, dq_warp_rows: int = 16, smem_swizzle: bool = False) -> str:
    """The label of these tiles and options (LABEL_FORMS); BackwardConfig.label of a config."""
    return (f"{block_m}x{n_warps}s{q_stages}" + ("f" if softmax == "ffma" else "")
            + (f"r{dq_red}" if dq_red != 1 or dq_frag else "") + ("p" if dq_frag else "")
            + ("m" if dq_warp_rows == 32 else "") + ("l" if lse_async else "") + ("z" if smem_swizzle else ""))


def label_of(x) -> str:
    """The label of anything with BackwardConfig's tile and option fields (a BackwardConfig, a
    fa_hw.tuned_backward.Entry)."""
    return label(x.block_m, x.n_warps, x.q_stages, x.softmax, x.dq_red, x.dq_frag, x.lse_async, x.dq_warp_rows,
                 x.smem_swizzle)


def parse_label(text: str) -> tuple[int, int, int, str, int, bool, bool, int, bool]:
    """label's inverse: (block_m, n_warps, q_stages, softmax, dq_red, dq_frag, lse_async, dq_warp_rows,
    smem_swizzle); a
    text that is not a label is one ValueError line naming LABEL_FORMS (the fields' own checks are
    BackwardConfig's)."""
    m = _LABEL.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        shown = repr(text) if not isinstance(text, str) or len(text) <= 40 else repr(text[:40]) + "..."
        raise ValueError(f"{shown} is not a backward config label; labels look like {LABEL_FORMS}")
    bm, nw, st, f, red, p, wr, la, z = m.groups()
    return (int(bm), int(nw), int(st), "ffma" if f else SOFTMAX_FORMS[0], int(red or 1), bool(p), bool(la),
            32 if wr else 16, bool(z))


def is_label(text) -> bool:
    """Whether `text` has the label syntax (LABEL_FORMS), whatever head_dim it is then checked for."""
    return isinstance(text, str) and _LABEL.fullmatch(text) is not None


@dataclass(frozen=True)
class BackwardBuild:
    """Everything that selects one compiled fa2_bwd.cu."""

    config: BackwardConfig = BackwardConfig()
    causal: bool = False
    deterministic: bool = False
    arch: str = DEFAULT_ARCH
    kernel: Path | None = None  # a variant of fa2_bwd.cu (same kernels, parameters, macros); None: the file
    extra_macros: tuple[tuple[str, int], ...] = field(default=())  # mutation builds (FA_DROP_*), tests only
    checkpoints: bool = False  # the debug build: per-thread checkpoints of the main kernel's rounds

    def macros(self) -> dict[str, int]:
        cfg = self.config
        out = dict(FA_BLOCK_M=cfg.block_m, FA_BLOCK_N=cfg.block_n, FA_HEAD_DIM=cfg.head_dim,
                   FA_N_WARPS=cfg.n_warps, FA_Q_STAGES=cfg.q_stages, FA_SMEM_BYTES=cfg.smem_bytes, FA_DQ_SMEM_BYTES=cfg.dq_smem_bytes,
                   FA_CAUSAL=int(self.causal),
                   FA_DETERMINISTIC=int(self.deterministic), FA_BF16=int(cfg.dtype == "bf16"),
                   FA_SOFTMAX_FFMA=int(cfg.softmax == "ffma"))
        if cfg.dq_red != 1:  # absent for the default: its builds keep their cache keys
            out["FA_DQ_RED"] = cfg.dq_red
        if cfg.dq_frag:  # likewise
            out["FA_DQ_FRAG"] = 1
        if cfg.lse_async:  # likewise
            out["FA_LSE_ASYNC"] = 1
        if cfg.dq_warp_rows != 16:  # likewise
            out["FA_DQ_WARP_ROWS"] = cfg.dq_warp_rows
        if cfg.smem_swizzle:  # likewise
            b, m, s = cfg.swizzle_bms
            out.update(FA_SMEM_SWIZZLE=1, FA_SWZ_B=b, FA_SWZ_M=m, FA_SWZ_S=s, FA_SWZ_W=cfg.swizzle_atom_cols)
        if self.checkpoints:  # the buffer layout of fa_sim/checkpoints.py
            out["FA_BWD_CHECKPOINTS"] = 1
            out["FA_BWD_CK_COUNT"] = len(BACKWARD_CHECKPOINTS)
            out["FA_BWD_CK_WORDS"] = BackwardCheckpointLayout(cfg, 1).words
            out.update({f"FA_BWD_CK_{ck.name}": BackwardCheckpointLayout.index(ck) for ck in BACKWARD_CHECKPOINTS})
        out.update(dict(self.extra_macros))
        return out

    @property
    def kernels(self) -> tuple[str, str, str]:
        return kernels_of(self.deterministic)

    @property
    def path(self) -> Path:
        return BWD_PATH if self.kernel is None else Path(os.path.abspath(self.kernel))

    def source(self) -> str:
        try:
            return self.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise KernelSourceError(f"cannot read the backward kernel {self.path}: {exc}") from None

    def describe(self) -> str:
        extra = ", causal" if self.causal else ""
        extra += ", deterministic dQ (dQ kernel)" if self.deterministic else ", atomic dQ"
        extra += "".join(f", {k}={v}" for k, v in self.extra_macros)
        extra += ", checkpoints" if self.checkpoints else ""
        extra += f", from {self.path}" if self.kernel is not None else ""
        return f"fa2_bwd.cu ({self.config.describe()}){extra} for {self.arch}"


@dataclass(frozen=True)
class CompiledBackward:
    build: BackwardBuild
    cubin: bytes
    log: str
    usage: dict  # kernel name -> ResourceUsage

    def object_code(self):
        from cuda.core import ObjectCode  # lazy on purpose: loading needs the hw extra, compiling does not

        return ObjectCode.from_cubin(self.cubin, name="fa2_bwd")


def compile_backward(build: BackwardBuild, *, use_cache: bool = True) -> CompiledBackward:
    """The cubin of fa2_bwd.cu for build.arch, through the on-disk cache (keyed by the source text,
    the macros, the arch and the NVRTC version). CompileError names the build; a vector dQ reduction
    (dq_red 2, 4) for an arch before sm_90 is a ValueError before NVRTC runs (ptxas would refuse it)."""
    if build.config.dq_red != 1 and not vector_reductions_ok(build.arch):
        raise ValueError(f"{build.describe()}: dq_red={build.config.dq_red} (red.global.add.v{build.config.dq_red}.f32) "
                         f"needs sm_{DQ_RED_MIN_ARCH} or newer; dq_red=1 runs on any arch")
    source = build.source()
    key = cache_key(format=CACHE_FORMAT, source=source, macros=build.macros(), arch=build.arch,
                    options=["std=c++17", "ptxas -v"], nvrtc=nvrtc_version())
    path = cache_root() / "cubin" / f"bwd-{key}.cubin"
    if use_cache and path.exists():
        cubin = path.read_bytes()
        try:
            return CompiledBackward(build, cubin, "", _usage(cubin, build))
        except CompileError:  # a truncated entry: compile afresh
            pass
    try:
        cubin, log = compile_cubin(source, name=str(build.path), arch=build.arch, macros=build.macros())
    except NvrtcError as exc:
        raise CompileError(f"NVRTC failed to compile {build.describe()}: {exc.detail}", exc.log) from None
    out = CompiledBackward(build, cubin, log, _usage(cubin, build))
    if use_cache:
        store_atomic(path, cubin)
    return out


def _usage(cubin: bytes, build: BackwardBuild) -> dict:
    try:
        return {name: ResourceUsage.from_cubin(cubin, name) for name in build.kernels}
    except CubinError as exc:
        raise CompileError(f"the cubin of {build.describe()} is unreadable: {exc}") from None
