"""Instruction handlers of the PTX engine, one module per family, dispatched through one table.

A handler executes one PTX instruction for the active threads of the executing group:

    @handles("add", "sub")
    def add_sub(lanes: Lanes, ins: Instruction) -> None: ...

`Lanes` (base.py) is all a handler sees: `read` an operand as an array over the active threads,
`write` a destination. Handlers are pure lane math (they call fa_sim.isa for the semantics);
control flow, memory, barriers and events belong to the engine. An opcode or form a handler does
not know raises `Unsupported`, which the engine reports with the PTX and CUDA source line.
"""

from __future__ import annotations

import importlib
import pkgutil

# The arithmetic, logic, compare/select, move, convert and MUFU families register themselves.
from . import compare, convert, floating, half, integer, logic, move, sfu  # noqa: F401
from .base import TABLE, Handler, Lanes, Unsupported, handles

__all__ = ["TABLE", "Handler", "Lanes", "Unsupported", "handles", "load_families"]


def load_families() -> None:
    """Import every family module of this package, so their handlers are in TABLE (the families
    above are imported with the package; this finds any other module added to it)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
