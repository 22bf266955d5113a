"""Handlers of the MUFU instructions: ex2 lg2 sin cos tanh rsqrt (.approx forms).

PTX anchors: `#floating-point-instructions-ex2 -lg2 -sin -cos -tanh -rsqrt
-rsqrt-approx-ftz-f64`, `#half-precision-floating-point-instructions-ex2 -tanh`. The models are
fa_sim.isa.sfu's: the fp32 forms are bit-exact to the H200 (fa_sim.isa.mufu); tanh.approx.f32 and
the f16/bf16/f64 forms are within PTX's error bound only and warn NotBitExactWarning (see that
module). rcp.approx, sqrt.approx and div.approx are in floating.py with their IEEE siblings.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...isa import sfu
from .common import Exec, Form, unary
from .half import lanewise

_F32 = {"ex2": sfu.ex2_approx, "lg2": sfu.lg2_approx, "sin": sfu.sin_approx, "cos": sfu.cos_approx,
        "rsqrt": sfu.rsqrt_approx}


def _bits_f16(fn):
    """A float16 function as one on uint16 bit patterns."""
    return lambda h: fn(np.asarray(h, np.uint16).view(np.float16)).view(np.uint16)


def mufu(opcode: str, form: Form) -> Exec:
    form.check_flags({"approx", "ftz"})
    if "approx" not in form.flags:
        raise form.unsupported(f"{opcode} exists only as .approx")
    ptype, ftz = form.type(), "ftz" in form.flags
    if ptype == "f32":
        if opcode == "tanh":
            if ftz:
                raise form.unsupported("tanh.approx.f32 has no .ftz")
            return unary(form, ptype, sfu.tanh_approx)
        return unary(form, ptype, partial(_F32[opcode], ftz=ftz))
    if opcode == "rsqrt" and ptype == "f64":
        return unary(form, ptype, sfu.rsqrt_approx_ftz_f64 if ftz else sfu.rsqrt_approx_f64)
    if opcode in ("ex2", "tanh") and ptype in ("f16", "f16x2") and not ftz:
        fn = sfu.ex2_approx_f16 if opcode == "ex2" else sfu.tanh_approx_f16
        return lanewise(form, ptype, _bits_f16(fn), 1)
    if opcode == "ex2" and ptype in ("bf16", "bf16x2") and ftz:
        return lanewise(form, ptype, sfu.ex2_approx_ftz_bf16, 1)
    if opcode == "tanh" and ptype in ("bf16", "bf16x2") and not ftz:
        return lanewise(form, ptype, sfu.tanh_approx_bf16, 1)
    raise form.unsupported(f"{opcode}.approx has no such form")
