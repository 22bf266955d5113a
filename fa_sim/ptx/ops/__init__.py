"""The register-only instruction families of the PTX engine: pure lane math, one module per family.

    integer.py   integer arithmetic          floating.py  f32 and f64
    half.py      f16, bf16 and x2 pairs      convert.py   cvt
    compare.py   setp, set, selp, slct       logic.py     logic, shift, permute
    move.py      mov, pack, unpack           sfu.py       MUFU (.approx)

Each module defines compilers (common.py says what a compiler and its executor are); the opcode
table fa_sim/ptx/optable.py says which compiler runs each opcode, and the engine dispatches
through that table. The family modules import only common.py, never this package, so importing
any of them imports no other.

`Unsupported` (an opcode, modifier or operand form the engine does not execute) and the `Lanes`
protocol are defined in common.py and named here, where the engine's users import them from.
"""

from .common import Lanes, Unsupported

__all__ = ["Lanes", "Unsupported"]
