"""KernelConfig: the compile-time shape of the FlashAttention-2 forward kernel.

The seed configuration is the one the spec walks through (kBlockM = kBlockN = 64, head dim 64,
4 warps, Swizzle<3,3,3> shared memory). The family around it is what both backends accept:

  head_dim   32, 64, 96, 128, 160, 192, 256   (96-256: issue 38; docs/head_dims.md says which tiles)
  block_m    64, 128, 256     (each warp owns 16 * m_repeats query rows; 256 with 8 warps only)
  block_n    32, 64, 128
  n_warps    4, 8             (block_m must be a multiple of 16 * n_warps)
  smem       swizzled | plain | padded

The cooperative 16-byte copy (spec: "TiledCopy", thread layout (rows, tpr):(tpr, 1)) puts
tpr = gcd(head_dim / 8, 16) threads on a row (head_dim / 8 for d = 32, 64, 128: one chunk per
thread and row; FlashAttention-2's kGmemThreadsPerRow), each copying head_dim / (8 tpr) chunks of
its row 8 tpr halves apart, so one pass covers n_threads / tpr rows; that number must divide
block_m and block_n. The fp32 accumulators of a thread (tCrS and tCrO, 4 per m16n8 atom) must leave
room under the 255-register limit (REGISTER_ACCUMULATORS_MAX). Anything else is rejected up front
by `__post_init__` with a message that lists what is supported, in the spirit of CuTe's
`can_implement`.

Causal masking and the softmax scale are call arguments, not part of the kernel shape.

Every field carries `metadata` (FIELD_HELP, FIELD_CHOICES, FIELD_OPTION): its meaning, allowed
values and command-line option. The `fa` commands generate their config options from the fields
(fa_sim/commands/common.py) and `to_json` / `from_json` walk the same fields, so a new field needs
only its declaration here.

`softmax` picks the arithmetic of the exp2 argument (SCHEDULE.md, "Arithmetic rules"):
`fmul_fsub` (default) is robust over the whole fp16 input range; `ffma` is FlashAttention-2's
single-FFMA form, kept as a named diagnostic (faster by one instruction per score, but the row
maximum's exponent is the rounding residue of m*s*log2(e), which overflows 2^x for large scores).

Kernel options (issue 11; SCHEDULE.md "Kernel options"), compile-time like the tiles, each at a
default that is the spec's kernel, so `family()` and the seed are what they were:
  kv_stages    1 (the spec's schedule) | 2 | 3: K/V tiles of the next kv_stages-1 rounds in flight
               (cp.async) while this round computes, one wait_group and one barrier per round;
               sK and sV hold kv_stages tiles each
  q_in_regs    ldmatrix the Q fragments once (round 0) and keep them in registers
  heavy_first  causal launches: the Q blocks with the most K/V rounds start first
  defer_pv     (kv_stages >= 2) PV of round t in round t+1, beside its softmax: tensor core and
               ALUs overlap within a warp; O's operations stay in the spec's order
  pingpong     (kv_stages >= 2, 8 warps: block_m 128 or 256, no defer_pv) two warp groups half a round apart:
               group 1's PV of round t runs after round t+1's barrier, so that on every scheduler
               one group's MMAs overlap the other's softmax; O's operations stay in the spec's order
  min_blocks   __launch_bounds__ minimum CTAs per SM (0: fa_sim.contract's heuristic)
  lazy_sum     the quad adds its lanes' partial row sums once, in the epilogue (FlashAttention-2's
               order), not every round; values differ from the spec's in the last bits
  poly_exp     eighths of the exponentials computed by a degree-4 polynomial on the FMA pipe instead
               of MUFU.EX2 (relative error 2.7e-6), to offload the MUFU pipe; values differ from the
               spec's in the last bits
  dtype        fp16 (the spec) | bf16: the type of q, k, v, of P~ as the PV operand and of o (issue 38);
               mma.sync .bf16 and cvt.rn.bf16x2.f32 in place of the f16 forms (fa2_fwd.cu FA_BF16)
dtype changes the types, not the schedule: both engines run either. kv_stages, q_in_regs,
heavy_first, defer_pv and pingpong change the schedule, lazy_sum and poly_exp the arithmetic: the hand-written program (engine="program") runs only the spec's kernel and refuses
them; the PTX engine runs fa2_fwd.cu as compiled for any option.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import re
import typing
from dataclasses import dataclass, field, fields

import numpy as np

from .cute import Swizzle
from .isa.arches import SMEM_OPT_IN_BYTES_BY_ARCH, SMEM_OPT_IN_MAX_BYTES, arch_key, smem_opt_in_bytes
from .isa.sm80 import MMA_K, MMA_M, MMA_N, WARP_SIZE
from .messages import quoted

HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)
SPEC_HEAD_DIMS = (32, 64, 128)  # one swizzle atom and one copy chunk per thread and row (the spec's tiling)
KV_STAGES = (1, 2, 3)
POLY_EXPS = (0, 1, 2, 3, 4)  # eighths of the exponentials on the FMA pipe (0: all on MUFU, the spec)
MIN_BLOCKS = (0, 1, 2, 3, 4, 5, 6, 8)  # 0: the heuristic of fa_sim.contract.occupancy; 8 x 256 threads = an SM's 2048
BLOCK_MS = (64, 128, 256)  # 256: 8 warps of 32 rows (the measured pingpong configs' tile); family() has 64 and 128
FAMILY_BLOCK_MS = (64, 128)
DTYPES = ("fp16", "bf16")  # the 16-bit type of q, k, v, P~ and o (fp16: the spec's kernel)
BLOCK_NS = (32, 64, 128)
N_WARPS = (4, 8)
CHUNK_HALVES = 8  # one 16-byte cp.async / ldmatrix row = 8 fp16
PAD_HALVES = 8  # the padded layout adds 8 halves (16 bytes) to every row
# Shared memory per CTA: no config of the family needs more than the most any target allows (sm_90's
# 227 KiB, 232,448 bytes); what one target allows is smem_limit_bytes(arch) (sm_80: 163 KiB, 166,912
# bytes), which every backend checks for its target (KernelConfig.check_arch; docs/head_dims.md).
SMEM_LIMIT_BYTES = SMEM_OPT_IN_MAX_BYTES
SMEM_LIMIT_BYTES_BY_ARCH = SMEM_OPT_IN_BYTES_BY_ARCH
FAMILY_ARCH = "sm_80"  # family()'s default target: the A100's limit, the family as it was before sm_90's tiles
# fp32 accumulator registers (tCrS + tCrO) per thread at most: 256 is the family's largest before
# issue 38 (m128n128d128w4, which spills a little under the 255-register limit, docs/timing.md);
# more leaves the fragments, addresses and softmax temporaries nothing (docs/head_dims.md).
REGISTER_ACCUMULATORS_MAX = 256
COPY_THREADS_PER_ROW_MAX = 16  # threads on one row of the 16-byte copy (FlashAttention-2's 128-half rows)


_TAG = re.compile(r"m(?P<m>\d+)n(?P<n>\d+)d(?P<d>\d+)w(?P<w>\d+)-(?P<smem>[a-z]+)(?P<rest>(?:-[a-z0-9_]+)*)")


_BOOL_OPTIONS = ("q_in_regs", "heavy_first", "defer_pv", "pingpong", "lazy_sum")  # options that are flags
_INT_FIELDS = ("block_m", "block_n", "head_dim", "n_warps", "kv_stages", "min_blocks", "poly_exp")
_BOOL_SUFFIX = {"qr": "q_in_regs", "hf": "heavy_first", "dp": "defer_pv", "pp": "pingpong",
                "ls": "lazy_sum"}  # their tag suffixes


def _tag_suffix(part: str) -> tuple[str | None, object]:
    """One '-suffix' of a tag -> (field, value); (None, None) when unknown."""
    if part in {f.value for f in SoftmaxForm}:
        return "softmax", part
    if part in _BOOL_SUFFIX:
        return _BOOL_SUFFIX[part], True
    if part in DTYPES[1:]:
        return "dtype", part
    m = re.fullmatch(r"([sbe])(\d+)", part)
    if m:
        return {"s": "kv_stages", "b": "min_blocks", "e": "poly_exp"}[m[1]], int(m[2])
    return None, None


def _json_value(value):
    return value.value if isinstance(value, enum.Enum) else value


def _from_json_value(hint, name: str, value):
    """A JSON value for a field of type `hint`: enums by value; ints stay exact (no 64.0 -> 64)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value  # __post_init__ parses and names bad values
    if hint is int and isinstance(value, float):
        raise ValueError(f"KernelConfig JSON field {name} must be an integer, got {value!r}")
    return value


def _parse_choice(cls: type[enum.Enum], value, noun: str):
    """The member of the string enum `cls` that `value` is or names (any case); a ValueError naming
    the accepted values otherwise."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).lower())
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"{noun} {value!r} is not supported; choose one of: {choices}") from None


def smem_limit_bytes(arch: str) -> int:
    """The largest dynamic shared memory one CTA may use on `arch` ('sm_80', 'sm_90', 'sm_90a', ...;
    fa_sim.isa.arches: the CUDA C++ Programming Guide's compute-capability table); an arch not in the
    table is a ValueError naming those that are."""
    return smem_opt_in_bytes(arch)


def _limits() -> str:
    """'sm_80: 166912, sm_90: 232448': the limits of the family's two measured targets, for messages."""
    return ", ".join(f"{a}: {SMEM_LIMIT_BYTES_BY_ARCH[a]}" for a in ("sm_80", "sm_90"))


class SmemLayout(enum.Enum):
    """How a (row, col) tile coordinate maps to a shared-memory offset."""

    SWIZZLED = "swizzled"  # row-major + XOR of the 16-byte chunk index with the row (spec table 11)
    PLAIN = "plain"  # row-major, no swizzle
    PADDED = "padded"  # row-major with rows padded by 8 halves

    @classmethod
    def parse(cls, value: "SmemLayout | str") -> "SmemLayout":
        return _parse_choice(cls, value, "smem layout")


FIELD_HELP, FIELD_CHOICES, FIELD_OPTION = "help", "choices", "option"  # KernelConfig field metadata keys


def _meta(help: str, choices=None, option: str | None = None) -> dict:
    out = {FIELD_HELP: help, FIELD_CHOICES: choices}
    return out if option is None else {**out, FIELD_OPTION: option}


class SoftmaxForm(enum.Enum):
    """How the kernel forms x*s*log2(e) - m*s*log2(e), the argument of ex2 (SCHEDULE.md)."""

    FMUL_FSUB = "fmul_fsub"  # fsub(fmul(x, sl2), fmul(m, sl2)): exactly 0 for the row maximum
    FFMA = "ffma"  # fma(x, sl2, -fmul(m, sl2)): FlashAttention-2's form; diagnostic only

    @classmethod
    def parse(cls, value: "SoftmaxForm | str") -> "SoftmaxForm":
        return _parse_choice(cls, value, "softmax form")


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes, warp count and shared-memory layout of one kernel instance."""

    block_m: int = field(default=64, metadata=_meta("query rows per CTA (kBlockM)", BLOCK_MS))
    block_n: int = field(default=64, metadata=_meta("keys per K/V round (kBlockN)", BLOCK_NS))
    head_dim: int = field(default=64, metadata=_meta("head dimension d", HEAD_DIMS))
    n_warps: int = field(default=4, metadata=_meta("warps per CTA; block_m must be a multiple of 16 x warps",
                                                   N_WARPS, option="--warps"))
    smem: SmemLayout = field(default=SmemLayout.SWIZZLED, metadata=_meta(
        "shared-memory layout of the Q/K/V tiles: swizzled (XOR of the 16-byte chunk with the row, "
        "spec table 11), plain (row-major), padded (rows + 16 bytes)", tuple(m.value for m in SmemLayout)))
    softmax: SoftmaxForm = field(default=SoftmaxForm.FMUL_FSUB, metadata=_meta(
        "arithmetic of the exp2 argument: fmul_fsub (robust over the whole fp16 range) or ffma "
        "(FlashAttention-2's single FFMA, a diagnostic that overflows for large scores)",
        tuple(m.value for m in SoftmaxForm)))
    kv_stages: int = field(default=1, metadata=_meta(
        "K/V shared-memory stages: 1 is the spec's schedule (two waits and barriers per round); 2 or 3 "
        "keep the next 1 or 2 rounds' K and V tiles in flight (cp.async) while this round computes, "
        "with one wait and one barrier per round", KV_STAGES))
    q_in_regs: bool = field(default=False, metadata=_meta(
        "load the Q fragments from shared memory once (round 0) and keep them in registers, instead of "
        "an ldmatrix of Q in every round (the spec)"))
    heavy_first: bool = field(default=False, metadata=_meta(
        "causal launches: start the Q blocks with the most K/V rounds first (m_block = gridDim.x-1-blockIdx.x), "
        "so light blocks fill the tail of the grid; no effect without causal"))
    defer_pv: bool = field(default=False, metadata=_meta(
        "run round t's PV in round t+1, in one block with the softmax of round t+1 so that the tensor core "
        "and the ALUs overlap within a warp (O's operations keep the spec's order); needs kv_stages >= 2"))
    pingpong: bool = field(default=False, metadata=_meta(
        "two warp groups half a round apart (8 warps; kv_stages >= 2): warps 4-7 run a round's PV after the "
        "next round's barrier, so that on every scheduler one group's MMAs overlap the other's softmax; sV "
        "holds kv_stages + 1 stages; O's operations keep the spec's order"))
    lazy_sum: bool = field(default=False, metadata=_meta(
        "each lane keeps its partial row sum across rounds and the quad adds them once in the epilogue "
        "(FlashAttention-2's order) instead of a quad reduction per round (values differ in the last bits)"))
    min_blocks: int = field(default=0, metadata=_meta(
        "__launch_bounds__ minimum CTAs per SM (caps registers per thread); 0 = fa_sim.contract's heuristic",
        MIN_BLOCKS))
    poly_exp: int = field(default=0, metadata=_meta(
        "eighths of each row's exponentials computed by a degree-4 polynomial on the FMA pipe instead of "
        "MUFU.EX2 (relative error 2.7e-6; values differ from the spec's in the last bits); 0 = all on MUFU",
        POLY_EXPS))
    dtype: str = field(default="fp16", metadata=_meta(
        "16-bit type of q, k, v, of P~ (the PV operand) and of o: fp16 (the spec's kernel) or bf16 (mma.sync "
        ".bf16, P~ and o rounded by cvt.rn.bf16x2.f32); fp32 accumulation either way", DTYPES))

    def __post_init__(self) -> None:
        object.__setattr__(self, "smem", SmemLayout.parse(self.smem))
        object.__setattr__(self, "softmax", SoftmaxForm.parse(self.softmax))
        for name in _BOOL_OPTIONS:
            if isinstance(getattr(self, name), np.bool_):
                object.__setattr__(self, name, bool(getattr(self, name)))
        for name in _INT_FIELDS:  # numpy integers become ints (macros, JSON and tags take ints); bools stay refused
            value = getattr(self, name)
            if isinstance(value, np.integer):
                object.__setattr__(self, name, int(value))
        problems = self._problems()
        if problems:
            raise ValueError(f"unsupported KernelConfig({self._given()}): {'; '.join(problems)}")

    def _given(self) -> str:
        """The fields away from their defaults, for messages ('head_dim=96, n_warps=8')."""
        return ", ".join(f"{f.name}={_json_value(getattr(self, f.name))!r}" for f in fields(self)
                         if getattr(self, f.name) is not f.default and getattr(self, f.name) != f.default)

    def _problems(self) -> list[str]:
        out = []
        for name, allowed in (("head_dim", HEAD_DIMS), ("block_m", BLOCK_MS), ("block_n", BLOCK_NS),
                              ("n_warps", N_WARPS), ("kv_stages", KV_STAGES), ("min_blocks", MIN_BLOCKS),
                              ("poly_exp", POLY_EXPS)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value not in allowed:
                out.append(f"{name}={value!r} is not one of {allowed}")
        for name in _BOOL_OPTIONS:
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                out.append(f"{name}={getattr(self, name)!r} is not a bool")
        if self.dtype not in DTYPES:
            out.append(f"dtype={self.dtype!r} is not one of {DTYPES}")
        if out:
            return out
        if self.defer_pv and self.kv_stages < 2:
            out.append("defer_pv keeps round t's V tile until round t+1: it needs kv_stages >= 2")
        if self.pingpong and (self.kv_stages < 2 or self.n_warps != 8 or self.defer_pv):
            out.append("pingpong needs kv_stages >= 2, n_warps 8 (two groups of 4 warps) and no defer_pv")
        if self.block_m == 256 and self.n_warps != 8:
            out.append("block_m=256 needs n_warps 8 (32 rows per warp)")
        if self.block_m % (MMA_M * self.n_warps):
            out.append(f"block_m={self.block_m} is not a multiple of 16*n_warps={MMA_M * self.n_warps}")
        rows = self.copy_rows_per_pass
        for name in ("block_m", "block_n"):
            if getattr(self, name) % rows:
                out.append(f"the cooperative copy covers {rows} rows per pass, which does not divide {name}={getattr(self, name)}")
        if not out and self.smem_bytes > SMEM_LIMIT_BYTES:
            out.append(f"needs {self.smem_bytes} bytes of shared memory, over {SMEM_LIMIT_BYTES}, the most any "
                       f"target allows ({_limits()})")
        if self.accumulator_registers > REGISTER_ACCUMULATORS_MAX:
            out.append(f"holds {self.accumulator_registers} fp32 accumulator registers per thread (tCrS + tCrO: "
                       f"4 x {self.m_repeats} x ({self.block_n} + {self.head_dim}) / 8), over "
                       f"{REGISTER_ACCUMULATORS_MAX}: the 255-register limit leaves no room; take fewer rows per "
                       f"warp (block_m / n_warps = 16) or a smaller block_n (docs/head_dims.md)")
        return out

    # -- the target's limits -------------------------------------------------------------------
    def fits(self, arch: str) -> bool:
        """Whether this config's shared memory fits one CTA on `arch` ('sm_80', 'sm_90', ...)."""
        return self.smem_bytes <= smem_limit_bytes(arch)

    def check_arch(self, arch: str) -> "KernelConfig":
        """self when it fits `arch` (`fits`); else a ValueError in one line naming the config, the bytes,
        the arch and its limit: what every backend raises before any work for a config too big for
        its target (fa_hw: the device's arch; fa_sim.predict_time / `fa time`: the GPU model's)."""
        limit = smem_limit_bytes(arch)
        if self.smem_bytes > limit:
            bigger = [f"{a} allows {n}" for a, n in SMEM_LIMIT_BYTES_BY_ARCH.items() if a in ("sm_80", "sm_90")
                      and self.smem_bytes <= n]
            raise ValueError(f"config {self.tag} needs {self.smem_bytes} bytes of shared memory per CTA, over "
                             f"{arch_key(arch)}'s limit of {limit}{' (' + bigger[0] + ')' if bigger else ''}: take "
                             f"fewer kv_stages or a smaller block_m / block_n on {arch_key(arch)} (docs/head_dims.md)")
        return self

    # -- serialisation -------------------------------------------------------------------------
    def to_json(self) -> dict:
        """{field: value}, enums by value: what archives, recordings and JSON reports store."""
        return {f.name: _json_value(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, data: "dict | str") -> "KernelConfig":
        """Inverse of to_json; also takes the JSON text. Fields absent from `data` take their
        defaults (archives written before a field existed); unknown fields and bad values are a
        ValueError naming them."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ValueError(f"KernelConfig JSON is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"KernelConfig JSON must be an object of fields, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"KernelConfig JSON has unknown field(s) {', '.join(map(str, unknown))}; "
                             f"fields are {', '.join(names)}")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _from_json_value(hints[k], k, v) for k, v in data.items()})

    # -- naming --------------------------------------------------------------------------------
    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_json().items())

    @property
    def tag(self) -> str:
        """Short stable name, e.g. 'm64n64d64w4-swizzled' (file names, cache keys, tables); the
        diagnostic softmax form and options away from their defaults add suffixes, in this order:
        '-ffma', '-s2' (kv_stages), '-qr' (q_in_regs), '-hf' (heavy_first), '-dp' (defer_pv),
        '-pp' (pingpong), '-ls' (lazy_sum), '-b3' (min_blocks), '-e1' (poly_exp), '-bf16' (dtype)."""
        extra = "" if self.softmax is SoftmaxForm.FMUL_FSUB else f"-{self.softmax.value}"
        extra += f"-s{self.kv_stages}" if self.kv_stages != 1 else ""
        extra += "-qr" if self.q_in_regs else ""
        extra += "-hf" if self.heavy_first else ""
        extra += "-dp" if self.defer_pv else ""
        extra += "-pp" if self.pingpong else ""
        extra += "-ls" if self.lazy_sum else ""
        extra += f"-b{self.min_blocks}" if self.min_blocks else ""
        extra += f"-e{self.poly_exp}" if self.poly_exp else ""
        extra += f"-{self.dtype}" if self.dtype != DTYPES[0] else ""
        return f"m{self.block_m}n{self.block_n}d{self.head_dim}w{self.n_warps}-{self.smem.value}{extra}"

    @classmethod
    def from_tag(cls, tag: str, softmax: "SoftmaxForm | str" = SoftmaxForm.FMUL_FSUB) -> "KernelConfig":
        """Inverse of `tag`; `softmax` is the form of a tag without a softmax suffix. A malformed
        tag or an unknown suffix is a ValueError naming it."""
        m = _TAG.fullmatch(str(tag))
        if not m:
            raise ValueError(f"{quoted(tag)} is not a config tag like {cls().tag!r} or 'm128n64d128w4-swizzled-s2-qr'")
        values = dict(block_m=int(m["m"]), block_n=int(m["n"]), head_dim=int(m["d"]), n_warps=int(m["w"]),
                      smem=m["smem"], softmax=softmax)
        seen: dict[str, str] = {}  # field -> the suffix that set it
        for part in filter(None, m["rest"].split("-")):
            key, value = _tag_suffix(part)
            if key is None:
                raise ValueError(f"config tag {quoted(tag)}: unknown suffix {quoted(part)}; a suffix is a softmax form "
                                 f"({', '.join(f.value for f in SoftmaxForm)}) or an option: s<kv_stages>, "
                                 f"{', '.join(_BOOL_SUFFIX)}, b<min_blocks>, e<poly_exp>, bf16 (dtype)")
            if key in seen:  # '-s2-s3', '-ffma-fmul_fsub': no suffix may silently override another
                what = "contradicts" if seen[key] != part else "repeats"
                raise ValueError(f"config tag {quoted(tag)}: suffix {part!r} {what} {seen[key]!r} (both set {key}); "
                                 f"give each field once")
            seen[key] = part
            values[key] = value
        return cls(**values)

    @property
    def spec_schedule(self) -> bool:
        """True when no option changes the spec's schedule or arithmetic (what engine="program" runs)."""
        return not self.schedule_options()

    def schedule_options(self) -> list[str]:
        """The options, as 'field=value', that make this config's kernel differ from the spec's: its
        schedule (kv_stages and the flags) or its exponentials (poly_exp)."""
        out = [f"kv_stages={self.kv_stages}"] if self.kv_stages != 1 else []
        out += [f"{name}=True" for name in _BOOL_OPTIONS if getattr(self, name)]
        return out + ([f"poly_exp={self.poly_exp}"] if self.poly_exp else [])

    @classmethod
    def family(cls, head_dims: tuple[int, ...] = SPEC_HEAD_DIMS, arch: str = FAMILY_ARCH) -> list["KernelConfig"]:
        """Every supported configuration at `head_dims` (the spec's 32, 64, 128 by default: the family
        the tests and docs enumerate; head_dim 96-256 by asking) that fits `arch` (sm_80 by default;
        sm_90 adds the tiles of more than 163 KiB), in a stable order (the seed first when 64 is
        asked), in the default softmax form (the form is arithmetic, not shape)."""
        smem_limit_bytes(arch)  # an unknown arch is refused before the loop
        seed = cls()
        out = [seed] if seed.head_dim in head_dims else []
        for d, bm, bn, w, s in itertools.product(head_dims, FAMILY_BLOCK_MS, BLOCK_NS, N_WARPS, SmemLayout):
            try:
                cfg = cls(block_m=bm, block_n=bn, head_dim=d, n_warps=w, smem=s)
            except ValueError:
                continue
            if cfg != seed and cfg.fits(arch):
                out.append(cfg)
        return out

    # -- threads and MMA tiling (spec table 3) -------------------------------------------------
    @property
    def n_threads(self) -> int:
        return self.n_warps * WARP_SIZE

    @property
    def warp_rows(self) -> int:
        """Query rows per warp (16 in the seed config, spec table 2)."""
        return self.block_m // self.n_warps

    @property
    def m_repeats(self) -> int:
        """MMA_M: m16 atoms stacked per warp along the query rows."""
        return self.warp_rows // MMA_M

    @property
    def s_n_tiles(self) -> int:
        """MMA_N of the QK product: n8 tiles along the keys of one block (8 in the seed)."""
        return self.block_n // MMA_N

    @property
    def o_n_tiles(self) -> int:
        """MMA_N of the PV product: n8 tiles along head_dim (8 in the seed)."""
        return self.head_dim // MMA_N

    @property
    def qk_k_segments(self) -> int:
        """K segments of the QK gemm_smem pipeline: head_dim / 16 (4 in the seed)."""
        return self.head_dim // MMA_K

    @property
    def pv_k_segments(self) -> int:
        """K segments of the PV gemm: block_n / 16 (4 in the seed)."""
        return self.block_n // MMA_K

    @property
    def rows_per_thread(self) -> int:
        """Rows of S/O one thread holds: g and g+8 per m16 atom (2 in the seed)."""
        return 2 * self.m_repeats

    @property
    def s_values_per_thread(self) -> int:
        return self.block_m * self.block_n // self.n_threads

    @property
    def o_values_per_thread(self) -> int:
        return self.block_m * self.head_dim // self.n_threads

    @property
    def accumulator_registers(self) -> int:
        """fp32 registers of a thread's tCrS and tCrO (4 per m16n8 atom): the bulk of its registers."""
        return 4 * self.m_repeats * (self.s_n_tiles + self.o_n_tiles)

    # -- cooperative copy (spec "TiledCopy") ---------------------------------------------------
    @property
    def copy_threads_per_row(self) -> int:
        """Threads on one row: gcd(head_dim / 8, 16) (head_dim / 8 for d = 32, 64, 128)."""
        return math.gcd(self.head_dim // CHUNK_HALVES, COPY_THREADS_PER_ROW_MAX)

    @property
    def copy_col_passes(self) -> int:
        """16-byte chunks of a row that one thread copies, 8 * copy_threads_per_row halves apart
        (1 for d = 32, 64, 128; 3, 5, 3, 2 for d = 96, 160, 192, 256)."""
        return self.head_dim // CHUNK_HALVES // self.copy_threads_per_row

    @property
    def copy_rows_per_pass(self) -> int:
        return self.n_threads // self.copy_threads_per_row

    def copy_chunks(self, rows: int) -> int:
        """cp.async (or, in the epilogue, LDS.128 / STG.128) per thread for a `rows`-row tile: row
        passes times column passes, in the kernel's order (pass i = row pass * copy_col_passes + column)."""
        return rows // self.copy_rows_per_pass * self.copy_col_passes

    # -- shared memory ---------------------------------------------------------------------------
    @property
    def row_pitch(self) -> int:
        """Halves between consecutive tile rows in shared memory."""
        return self.head_dim + (PAD_HALVES if self.smem is SmemLayout.PADDED else 0)

    @property
    def swizzle_atom_cols(self) -> int:
        """Columns (halves) of one 8-row swizzle atom: head_dim when it is a power of two (one atom
        spans the row: the row-major layout of d = 32, 64, 128, 256), else the largest of 64, 32 that
        divides it (FlashAttention-2's kBlockKSmem: 32 for d = 96, 160; 64 for d = 192). The row
        pitch (unswizzled layouts)."""
        d = self.head_dim
        if self.smem is not SmemLayout.SWIZZLED:
            return self.row_pitch
        return d if d & (d - 1) == 0 else (64 if d % 64 == 0 else 32)

    @property
    def swizzle_bms(self) -> tuple[int, int, int] | None:
        """Swizzle<B, M, S> of one 8 x swizzle_atom_cols atom (None if unswizzled), applied to the
        offset of `smem_offset`.

        Every choice XORs the 16-byte chunk index (bits 3.. of the offset) with row bits so that
        the 8 row addresses of one ldmatrix fall in 8 distinct 4-bank groups:
          64 columns (d=64, 192): Swizzle<3,3,3> (spec table 11), chunk ^= r % 8
          128 columns (d=128): Swizzle<3,3,4>, chunk ^= r % 8
          256 columns (d=256): Swizzle<3,3,5>, chunk ^= r % 8
          32 columns (d=32, 96, 160): Swizzle<2,3,3>, chunk ^= (r // 2) % 4
        """
        if self.smem is not SmemLayout.SWIZZLED:
            return None
        return {32: (2, 3, 3), 64: (3, 3, 3), 128: (3, 3, 4), 256: (3, 3, 5)}[self.swizzle_atom_cols]

    def smem_offset(self, r, c) -> np.ndarray:
        """Offset in halves of logical tile element (r, c) from the tile base; vectorised.

        Unswizzled: r * row_pitch + c. Swizzled: the tile is 8-row groups (8 head_dim halves apart),
        each a row of 8 x W atoms (W = swizzle_atom_cols, 8W halves apart), each atom row-major and
        swizzled: Swizzle((r//8) 8d + (c//W) 8W + (r%8) W + c%W), the swizzle reading only bits
        inside the atom. With W = d this is Swizzle(r d + c), the row-major layout of d = 32, 64, 128, 256."""
        r, c = np.asarray(r, dtype=np.int64), np.asarray(c, dtype=np.int64)
        bms, w = self.swizzle_bms, self.swizzle_atom_cols
        if bms is None or w == self.row_pitch:
            p = r * self.row_pitch + c
        else:
            p = (r // 8) * 8 * self.row_pitch + (c // w) * 8 * w + (r % 8) * w + c % w
        return p if bms is None else Swizzle(*bms)(p)

    def tile_halves(self, rows: int) -> int:
        """Shared-memory halves a tile of `rows` rows occupies (the layout's cosize)."""
        return rows * self.row_pitch

    @property
    def sq_offset_bytes(self) -> int:
        return 0

    @property
    def sk_offset_bytes(self) -> int:
        return 2 * self.tile_halves(self.block_m)

    @property
    def kv_tile_bytes(self) -> int:
        """Bytes of one K or V stage (block_n rows)."""
        return 2 * self.tile_halves(self.block_n)

    @property
    def sv_offset_bytes(self) -> int:
        return self.sk_offset_bytes + self.kv_stages * self.kv_tile_bytes

    def stage_offset_bytes(self, stage: int) -> int:
        """Offset of K/V stage `stage` from the sK (or sV) base: stages lie back to back."""
        return stage * self.kv_tile_bytes

    @property
    def v_stages(self) -> int:
        """sV tiles: kv_stages, one more with pingpong (group 1 reads V[t-1] in round t)."""
        return self.kv_stages + self.pingpong

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA: sQ (reused as sO), then kv_stages sK tiles, then
        v_stages sV tiles (sQ | sK | sV in the spec's single-stage kernel)."""
        return self.sv_offset_bytes + self.v_stages * self.kv_tile_bytes
