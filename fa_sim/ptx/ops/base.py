"""The registry of the PTX engine's instruction handlers: the Lanes protocol a handler sees, the
table that dispatches base opcodes to handlers, and Unsupported. The family modules of this
package import it (not the package), so the package can import them without a cycle.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..ir import Instruction


class Unsupported(Exception):
    """An opcode, modifier or operand form the engine does not execute (never skipped silently)."""


class Lanes(Protocol):
    """The active threads of one executing group, as a handler sees them."""

    n: int  # number of active threads; every array below is [n]

    def read(self, operand, ptype: str) -> np.ndarray:
        """The operand's value per active thread as the numpy dtype of `ptype` (types.DTYPES):
        registers reinterpret their bits, truncated to the type's width when the register is
        wider (#operand-size-exceeding-instruction-type-size); immediates broadcast; special
        registers (%tid.x, %laneid, ...) are computed; a variable's name (Sym) gives its address.
        A predicate Reg with `negate` ('!p') reads as the complement."""

    def write(self, operand, value: np.ndarray, ptype: str) -> None:
        """Store value ([n] or scalar, of `ptype`'s dtype) into a register operand, sign-extended
        (signed integer types) or zero-extended (all others) when the register is wider than the
        type. Writing to the sink '_' (ir.Sink) does nothing."""


Handler = Callable[[Lanes, Instruction], None]
TABLE: dict[str, Handler] = {}


def handles(*opcodes: str) -> Callable[[Handler], Handler]:
    """Register a handler for base opcodes (Instruction.opcode)."""

    def deco(f: Handler) -> Handler:
        for name in opcodes:
            if name in TABLE:
                raise RuntimeError(f"two handlers for PTX opcode {name!r}")
            TABLE[name] = f
        return f

    return deco
