"""Handler of cvt (#data-movement-and-conversion-instructions-cvt).

Between .u8 ... .s64, .f16, .bf16, .f32, .f64, plus the packing forms `cvt.rn{.relu}{.satfinite}
.{f16x2,bf16x2}.f32 d, a, b` (a goes to the upper half) and `cvt.{rna,rn,rz}{.satfinite}.tf32.f32`.
The rounding modifier is checked against PTX's rules (integer rounding for float -> int and
same-size float rounding, float rounding for int -> float and narrowing); semantics in
fa_sim.isa.convert. Not supported: .rs (stochastic rounding), the fp8/fp6/fp4 and ue8m0 types,
cvt.pack.
"""

from __future__ import annotations

import sys

import numpy as np

from ...isa import convert, half
from ...isa.rounding import BF16, F16, F32, F64, TF32, Rnd
from ..types import DTYPES
from .common import INT_ROUNDING, INT_TYPES, ROUNDING, Exec, Form, simple

_FORMATS = {"f16": F16, "bf16": BF16, "f32": F32, "f64": F64, "tf32": TF32}
_SCALAR_INTS = INT_TYPES - {"u16x2", "s16x2"}
_FLAGS = set(ROUNDING) | set(INT_ROUNDING) | {"ftz", "sat", "relu", "satfinite"}


def _register_type(ptype: str) -> str:
    """The type a value of ptype is read or written as (tf32 travels in a .b32 register)."""
    return "b32" if ptype == "tf32" else ptype


def cvt(opcode: str, form: Form) -> Exec:
    form.check_flags(_FLAGS)
    types = form.types
    if len(types) != 2:
        raise form.unsupported("expects .dtype.atype")
    dtype, atype = types
    flags = set(form.flags)
    frnd = [ROUNDING[f] for f in flags if f in ROUNDING]
    irnd = [INT_ROUNDING[f] for f in flags if f in INT_ROUNDING]
    if len(frnd) + len(irnd) > 1:
        raise form.unsupported("more than one rounding modifier")
    if dtype in ("f16x2", "bf16x2"):
        return _pack_x2(form, dtype, atype, frnd, flags)
    for t in (dtype, atype):
        if t not in _FORMATS and t not in _SCALAR_INTS:
            raise form.unsupported(f"type .{t} is not supported")
    if flags & {"relu", "satfinite"} and dtype not in ("f16", "bf16", "tf32"):
        raise form.unsupported(".relu and .satfinite apply to .f16 .bf16 .tf32 destinations")
    if "ftz" in flags and F32 not in (_FORMATS.get(dtype), _FORMATS.get(atype)):
        raise form.unsupported(".ftz applies when one of the types is .f32")
    fn = _semantics(form, dtype, atype, frnd, irnd, flags)
    return simple(form, fn, (_register_type(atype),), _register_type(dtype))


def _semantics(form: Form, dtype: str, atype: str, frnd: list, irnd: list, flags: set):
    """The value function of a scalar cvt form, after checking its rounding modifier."""
    ftz, sat = "ftz" in flags, "sat" in flags
    dfmt, afmt = _FORMATS.get(dtype), _FORMATS.get(atype)
    if dfmt is None and afmt is None:  # int -> int
        if frnd or irnd:
            raise form.unsupported("integer-to-integer conversions take no rounding modifier")
        np_dtype = DTYPES[dtype]
        return lambda a: convert.int_to_int(a, np_dtype, sat)
    if dfmt is None:  # float -> int
        if not irnd:
            raise form.unsupported("float-to-integer conversions need .rni .rzi .rmi or .rpi")
        np_dtype = DTYPES[dtype]
        return lambda a: convert.float_to_int(convert.decode(a, afmt), afmt, np_dtype, irnd[0], ftz)
    if afmt is None:  # int -> float
        if not frnd:
            raise form.unsupported("integer-to-float conversions need .rn .rz .rm or .rp")
        if dfmt is F32 and frnd[0] is Rnd.RN and not sat and DTYPES[atype].itemsize < 8:
            return convert.int_to_f32_rn  # the fast path of cvt.rn.f32.s32
        return lambda a: convert.encode(convert.int_to_float(a, dfmt, frnd[0], sat), dfmt)
    if (afmt, dfmt, frnd, irnd, flags) == (F32, F16, [Rnd.RN], [], {"rn"}):
        return lambda a: convert.f32_to_f16_rn(a).view(np.float16)
    narrowing = dfmt.precision < afmt.precision or dfmt.emin > afmt.emin
    if irnd and dfmt is not afmt:
        raise form.unsupported("integer rounding applies to same-size float conversions only")
    if narrowing and not frnd:
        raise form.unsupported("a narrowing float conversion needs .rn .rz .rm or .rp")
    if frnd and not narrowing:
        raise form.unsupported("a float rounding modifier applies to narrowing conversions only")
    rnd = (frnd or irnd or [None])[0]
    relu, satfinite = "relu" in flags, "satfinite" in flags

    def float_to_float(a):
        v = convert.float_to_float(convert.decode(a, afmt), afmt, dfmt, rnd, bool(irnd), ftz, sat,
                                   relu, satfinite)
        return convert.nan_payload(convert.encode(v, dfmt), a, afmt, dfmt, None if irnd else rnd)
    return float_to_float


def _pack_x2(form: Form, dtype: str, atype: str, frnd: list, flags: set) -> Exec:
    """cvt.{rn,rz}{.relu}{.satfinite}.{f16x2,bf16x2}.f32 d, a, b: d = {cvt(a) high, cvt(b) low}."""
    if atype != "f32" or [r.value for r in frnd] not in (["rn"], ["rz"]) or flags & {"ftz", "sat"}:
        raise form.unsupported("expects cvt.{rn,rz}{.relu}{.satfinite}.{f16x2,bf16x2}.f32 d, a, b")
    dfmt = F16 if dtype == "f16x2" else BF16
    relu, satfinite = "relu" in flags, "satfinite" in flags

    def bits16(x):
        if dfmt is F16 and frnd[0] is Rnd.RN and not (relu or satfinite):
            return convert.f32_to_f16_rn(x)  # the fast path: cvt.rn.f16x2.f32 of every P tile
        v = convert.float_to_float(convert.decode(x, F32), F32, dfmt, frnd[0], relu=relu,
                                   satfinite=satfinite)
        out = convert.encode(v, dfmt)
        return out.view(np.uint16) if dfmt is F16 else out

    def cvt_x2(a, b):
        if dfmt is F16 and frnd[0] is Rnd.RN and not (relu or satfinite) and LITTLE_ENDIAN:
            return _f16x2_rn(np.asarray(a, np.float32), np.asarray(b, np.float32))
        hi, lo = bits16(a), bits16(b)
        return half.pack_x2(lo, hi)
    return simple(form, cvt_x2, ("f32", "f32"), "b32")


LITTLE_ENDIAN = sys.byteorder == "little"  # a uint32 word then holds halves [lo, hi] in memory order


def _f16x2_rn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cvt.rn.f16x2.f32 d, a, b: the halves that convert.f32_to_f16_rn gives (numpy's float32 ->
    float16 cast, NaN -> 0x7fff), cast straight into the two halves of each word (no packing pass)."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    halves = np.empty((*shape, 2), np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(halves[..., 0], b, casting="unsafe")
        np.copyto(halves[..., 1], a, casting="unsafe")
    bits = halves.view(np.uint16)
    for j, x in ((0, b), (1, a)):
        nan = np.isnan(x)
        if nan.any():
            bits[..., j][np.broadcast_to(nan, shape)] = 0x7FFF
    return bits.view(np.uint32).reshape(shape)
